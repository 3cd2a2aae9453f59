"""Task 5's steps 6 and 7 (optional): the cache in bf16 and fp16, contiguous (step 6) and paged (step 7), their
checks, bad input and sanitizer pass, run in a process of its own by checks/task5/test.py.
"""

from __future__ import annotations

import math

import torch

from harness import cli, sanitize
from harness.checks import (GUARD_BITS_16, compare, expect_errors, guard_damage, guarded_input, guarded_output,
                            random_tensor)
from harness.attention_math import attention_float64, expand_kv_heads
from harness.diagnose import decode_schedules, diagnose, kernel_constants
from checks.task4 import measure as task4_measure
from checks.task5.cases import HALF_DECODE_CASES, HALF_UPDATE_CASES
from checks.task5.cache_decode import (HALF_CALL_LIMIT, check_update, decode_inputs, describe_grouped, grouped,
                                       launcher_splits, on_gpu, out_of_range, page_pool)


def check_half_decode(worker, shape, seed, splits, dtype, constants=None):
    """Step 6: the decode over a 16-bit cache against float64 on the same 16-bit values, each sequence over its
    own rows (NaN for one out of range), within what SDPA's own error on them says the type allows."""
    b, h, kvh, max_seq, length, d, starts = grouped(shape)
    lengths = [length] * b if isinstance(length, int) else list(length)
    q, k_cache, v_cache = (t.to(dtype) for t in decode_inputs(shape, seed))
    inputs = [guarded_input(name, t) for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache))]
    out = guarded_output("out", q.shape, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    worker.call("decode_half", *(t.tensor for t in inputs), out.tensor, on_gpu(length), scale, splits,
                None if starts is None else on_gpu(starts), **HALF_CALL_LIMIT)
    damage = guard_damage(*inputs, out)
    if damage:
        return damage
    got, said = out.tensor.cpu(), []
    for seq, (end, first) in enumerate(zip(lengths, starts or (0,) * b)):
        if not 0 <= first < end <= max_seq:
            passed, words = out_of_range(got[seq], seq, end, first, max_seq, GUARD_BITS_16,
                                         ", and write_nan's output; README, Task 5, step 6")
            if not passed:
                return False, words, {}
            said.append(words)
            continue
        rows = [c[seq:seq + 1, :, first:end] for c in (k_cache, v_cache)]
        expected = attention_float64(q[seq:seq + 1], *rows, False, scale)[0]
        allowed, why = task4_measure.half_allowance(q[seq:seq + 1], *rows, False, scale, None, expected)
        result = compare(got[seq:seq + 1], expected, atol=allowed, rtol=0.0, name=f"sequence {seq}'s output",
                         poisoned=True)
        if not result.passed:
            result.message = (f"{result.message} ({why}; its rows are {first} .. {end - 1}: README, Task 5, "
                              "step 6)")
            # the common mistakes, all made in step 6 here, within the allowance plus one unit in the last place of
            # the type at each value's size (a mistaken output can be larger than the right one)
            seen = [expand_kv_heads(r, h) for r in rows]
            used = launcher_splits(worker, shape, splits)
            return diagnose(5, result, got[seq:seq + 1], q[seq:seq + 1], *seen, False, atol=allowed,
                            rtol=torch.finfo(dtype).eps, scale=scale, splits=used, step=6,
                            schedules=decode_schedules(constants or {}, d, end - first, used, per_lane=8))
        said.append(f"{result.message}, {allowed:.1e} allowed")
    return True, (f"each sequence over its own rows, within 2x SDPA's error in {str(dtype)[6:]} on its inputs (or "
                  f"half a unit in the last place): {'; '.join(said)}"), {}


def check_half_errors(worker, paged: bool = False):
    """The given binding's errors for the 16-bit cache, and with `paged` its pools' (not the student's work:
    reported, not scored)."""
    cache = torch.zeros(1, 2, 16, 64, device="cuda", dtype=torch.bfloat16)
    new = torch.zeros(1, 2, 1, 64, device="cuda", dtype=torch.bfloat16)
    q = torch.zeros(1, 2, 1, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    bad = [
        ("a float32 cache", ("update_cache_half", new.float(), new.float(), cache.float(), cache.float(), 0),
         "must be bfloat16 or float16"),
        ("new rows in float16 for a bfloat16 cache", ("update_cache_half", new.half(), new.half(), cache,
                                                      cache.clone(), 0), "like k_cache"),
        ("pos past the cache", ("update_cache_half", new, new.clone(), cache, cache.clone(), 16),
         "pos + n_new must be at most max_seq"),
        ("a float32 query", ("decode_half", q.float(), cache, cache.clone(), out, 4, 0.125, 0), "like k_cache"),
        ("out in float16", ("decode_half", q, cache, cache.clone(), out.half(), 4, 0.125, 0), "like k_cache"),
        ("a cache on the CPU", ("decode_half", q, cache.cpu(), cache.cpu(), out, 4, 0.125, 0), "CUDA"),
        ("length past max_seq", ("decode_half", q, cache, cache.clone(), out, 17, 0.125, 0),
         "length must be between 1 and max_seq"),
        ("out is q", ("decode_half", q, cache, cache.clone(), q, 4, 0.125, 0), "must not share memory"),
    ]
    if paged:
        pages = torch.zeros(4, 2, 8, 64, device="cuda", dtype=torch.bfloat16)
        table = torch.tensor([[0, 1]], dtype=torch.int32, device="cuda")
        length, pos = (torch.tensor([n], dtype=torch.int32, device="cuda") for n in (4, 3))
        bad += [
            ("a bf16 pool to the float32 paged decode", ("decode_paged", q, pages, pages.clone(), out, table, length,
                                                         0.125, 0), "decode_paged_half"),
            ("a float32 pool to the 16-bit paged decode", ("decode_paged_half", q.float(), pages.float(),
                                                           pages.float(), out.float(), table, length, 0.125, 0),
             "must be bfloat16 or float16"),
            ("fp16 new rows for a bf16 pool", ("update_cache_paged_half", new.half(), new.half(), pages, pages.clone(),
                                               table, pos), "like k_pages"),
            ("a page size of 6", ("update_cache_paged_half", new, new.clone(), pages[:, :, :6].contiguous(),
                                   pages[:, :, :6].contiguous(), table, pos), "power of two"),
        ]
    return expect_errors(lambda *call: worker.call(*call), bad)


def half_sanitizer_calls(hidden: cli.Hidden | None, with_pages: bool = False) -> list[sanitize.Call]:
    """Step 6's pass: the update (one sequence that does not fit), and the decode with 16-byte rows and with a
    value at a time, groups, padding, a length out of range and splits, bf16 and fp16 in turn; with_pages, step
    7's paged update and decode (a page outside the pool: not written, NaN)."""
    calls = []
    if with_pages:  # as the float32 pass's (checks/task5/test.py): sequence 1 reaches page 2, outside the pool
        for i, dtype in enumerate((torch.bfloat16, torch.float16)):
            k_pages, v_pages, table = page_pool(2, 2, 8, 3, 64 - 24 * i, cli.seed(70 + i, hidden))
            k_pages, v_pages = (p.nan_to_num().to(dtype) for p in (k_pages, v_pages))
            table[1, 2] = k_pages.shape[0]
            d = k_pages.shape[-1]
            k_new, v_new = (random_tensor((2, 2, 3, d), cli.seed(72 + j, hidden), dtype=dtype) for j in range(2))
            calls.append(sanitize.Call(f"{str(dtype)[6:]} update_cache_paged_half pages of 8 head_dim {d}",
                                       "update_cache_paged_half",
                                       (k_new, v_new, k_pages, v_pages, table,
                                        torch.tensor([6, 20], dtype=torch.int32)),
                                       ("k_new", "v_new", "k_pages", "v_pages", "block_table", "pos")))
            q = random_tensor((2, 4, 1, d), cli.seed(74 + i, hidden), dtype=dtype)
            splits = 1 + 2 * i
            calls.append(sanitize.Call(f"{str(dtype)[6:]} decode_paged_half pages of 8 head_dim {d} lengths 24,20 "
                                       f"splits {splits}", "decode_paged_half",
                                       (q, k_pages, v_pages, torch.empty_like(q), table,
                                        torch.tensor([24, 20], dtype=torch.int32), 0.125, splits),
                                       ("q", "k_pages", "v_pages", "out", "block_table", "length")))
    for i, (b, h, max_seq, pos, n, d) in enumerate([(2, 1, 40, (3, 39), 2, 17), (1, 2, 10, 9, 1, 128)]):
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        k_new, v_new = (random_tensor((b, h, n, d), cli.seed(60 + 2 * i + j, hidden)).to(dtype) for j in range(2))
        where = pos if isinstance(pos, int) else torch.tensor(pos, dtype=torch.int32)
        calls.append(sanitize.Call(f"{str(dtype)[6:]} update_cache_half cache {max_seq} pos {pos} n_new {n} head_dim "
                                   f"{d}", "update_cache_half",
                                   (k_new, v_new, torch.zeros(b, h, max_seq, d, dtype=dtype),
                                    torch.zeros(b, h, max_seq, d, dtype=dtype), where),
                                   ("k_new", "v_new", "k_cache", "v_cache", "pos")))
    for i, shape in enumerate([(2, 6, 2, 40, 37, 64, (0, 30), 1), (1, 3, 3, 70, 65, 17, None, 1),
                               (3, 4, 2, 30, (30, 1, 31), 128, None, 3), (2, 6, 3, 40, (40, 12), 80, (39, 12), 2)]):
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        q, k_cache, v_cache = (t.nan_to_num().to(dtype) for t in decode_inputs(shape[:7], cli.seed(64 + i, hidden)))
        starts = None if shape[6] is None else torch.tensor(shape[6], dtype=torch.int32)
        length = shape[4] if isinstance(shape[4], int) else torch.tensor(shape[4], dtype=torch.int32)
        names = ("q", "k_cache", "v_cache", "out") + (() if isinstance(length, int) else ("length",))
        calls.append(sanitize.Call(f"{str(dtype)[6:]} decode_half {describe_grouped(shape[:7])} splits {shape[7]}",
                                   "decode_half", (q, k_cache, v_cache, torch.empty_like(q), length,
                                                   1 / math.sqrt(shape[5]), shape[7], starts),
                                   names + ("key_start",)))
    return calls


HALF_PASS_NAME = f"{sanitize.PASS_NAME}, the bf16/fp16 cache (optional)"
HALF_KERNEL_STEPS = {name: "Task 5, step 6 (optional)" for name in
                     ("update_cache_kernel", "attend_rows", "decode_kernel", "decode_split_kernel",
                      "combine_splits_kernel", "block_rows", "write_nan", "first_position")}
HALF_KERNEL_STEPS |= {"update_paged_kernel": "Task 5, step 7 (optional)", "offset": "Task 5, steps 6-7 (optional)"}


def half_part(report, worker, hidden_cases, constants=None) -> bool:
    """Step 6 (optional): the 16-bit cache's update and decode in both types; whether every case passed. The
    first case whose process crashed or hung ends the part (the rest would wait as long)."""
    report.begin_part("half", (6,), optional=True)
    runs = [(case, lambda c=case, t=dtype: check_update(worker, c, t))
            for name, dtype in task4_measure.HALF_TYPES.items()
            for case in cli.cases(5, "half update", HALF_UPDATE_CASES, hidden_cases, causal=(False,),
                                  shape_text=lambda s, n=name: f"{n} update batch {s[0]} heads {s[1]} cache {s[2]} "
                                                               f"pos {s[3]} n_new {s[4]} head_dim {s[5]}")]
    runs += [(case, lambda c=case, t=dtype: check_half_decode(worker, c.shape[:7], c.seed, c.shape[7], t, constants))
             for name, dtype in task4_measure.HALF_TYPES.items()
             for case in cli.cases(5, "half decode", HALF_DECODE_CASES, hidden_cases, causal=(False,),
                                   shape_text=lambda s, n=name: f"{n} decode {describe_grouped(s[:7])} splits "
                                                                f"{s[7] or 'chosen by the launcher'}")]
    for case, check in runs:
        before = len(report.cases)
        report.run(case.name, check)
        if report.process_died_since(before, "the bf16/fp16 part"):
            break
    return report.end_part("half")


def optional_half(report, worker, args, passes: list, paged=None) -> tuple[bool, bool]:
    """Step 6 (optional): the 16-bit cache's checks, then (`paged`) step 7's, then bad input while their own
    sanitizer pass runs (added to `passes`); every case optional, so nothing here moves a point. Whether each
    part's checks passed (step 6's, step 7's: then their benchmarks come last). Step 7's part runs once step 6's
    has passed: its decode is compared with step 6's."""
    if not half_part(report, worker, args.hidden,
                     kernel_constants("task5/kernels/decode_half.cu", args.student_dir, args.solution)):
        if paged:
            report.note("the bf16/fp16 paged cache (step 7) is checked once step 6's part passes: its decode is "
                        "compared with step 6's, bit for bit")
        return False, False
    paged_passed = paged is not None and paged()  # checks/task5/paged.py's paged_half_part
    passes.append(sanitize.start(report, 5, args, half_sanitizer_calls(args.hidden, paged_passed),
                                 HALF_KERNEL_STEPS.get, HALF_PASS_NAME, kind="optional", part="half"))
    report.run("bad input to the bf16/fp16 cache raises clear errors (the given binding)",
               lambda: check_half_errors(worker, paged), kind="optional")
    return not report.stopped, paged_passed and not report.stopped
