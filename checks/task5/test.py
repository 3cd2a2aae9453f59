"""python -m task5.test [--cache | --decode | --split | --layer | --paged | --half | --paged-half] [--solution]

Checks Task 5's kernels on the GPU against float64 PyTorch, then measures them:
- the cache update (step 1): positions pos .. pos + n - 1 written exactly, nothing else;
  pos an int, or one per sequence as int32 on the GPU (one that does not fit writes nothing);
- the decode kernel (step 2): cache lengths 1, 2, around the tile edges, 4097; head_dim 3
  to 128; batch x heads from 1 x 1 to 8 x 32; the cache past `length` holds NaN, so a
  kernel that reads beyond it shows; lengths per sequence as int32 on the GPU (out of
  range: NaN);
- split-KV (step 3, optional, graded apart): the same with 2 to 64 splits (more splits
  than rows included) and the launcher's own choice;
- the cached layer: prefill (your task 4 kernel) and decode steps against
  nn.MultiheadAttention, up to a full cache;
- the paged cache (step 5, optional) bit for bit against the contiguous decode; the cache in
  bf16 and fp16 (step 6, optional) against float64 on the same 16-bit values, and paged (step 7,
  optional) bit for bit against step 6's decode, in a process of their own: all reported, not scored.
Then the decode kernel alone (batch 16 / 4096 cached tokens, batch 1 / 32768), in GB/s of
K and V read against the copy bandwidth measured in the same run, naive PyTorch, SDPA and
the reference kernel; and the handout's generation run (batch 16, prompt 1024, cache
2048, hidden 4096, 32 heads, 100 steps): time to first token and time between tokens
against nn.MultiheadAttention and SDPA over the same cache.
Your kernels run in a worker process (task5/entry.py) on GPU memory this process owns.
"""

from __future__ import annotations

import math

import torch

from common import impl

from harness import cli, gpu_share, points, sanitize
from harness.diagnose import kernel_constants
from harness.checks import builds_on, compare, exact_float32, expect_errors, random_tensor
from harness.records import Report
from checks.task4 import measure as task4_measure
from checks.task5 import measure
from checks.task5.cases import ATOL, RTOL
from checks.task5.cases import (CACHE_CASES, DECODE_CASES, GROUPED_DECODE_CASES, GROUPED_SPLIT_CASES, LAYER_CASES,
                                LINEAR_CASES, LINEAR_HALF_CASES, PAGED_DECODE_CASES, PAGED_UPDATE_CASES, SPLIT_CASES)
from checks.task5.cache_decode import (check_decode, check_layer, check_update, decode_inputs, describe_decode,
                                       describe_grouped)
from checks.task5.half import HALF_KERNEL_STEPS, HALF_PASS_NAME, half_sanitizer_calls, optional_half
from checks.task5.paged import check_decode_paged, check_update_paged, page_pool, paged_half_part


PARTS = {  # name: (README steps, optional)
    "cache": ((1,), False),
    "decode": ((2,), False),
    "split": ((3,), True),
    "layer": ((1, 2), False),
    "paged": ((5,), True),
    "half": ((6,), True),
    "paged_half": ((6, 7), True),  # step 7's decode is compared with step 6's, whose part runs first
}
SIXTEEN_BIT = {"half", "paged_half"}  # the parts that run in the 16-bit process (checks/task5/half.py)

def small_layer(worker):
    """A fresh layer in the worker: hidden 64, 2 heads, a cache of 4 positions."""
    worker.call("make_layer", 64, 2, 4, [torch.eye(64, device="cuda") for _ in range(4)], "pytorch")  # given code only


def check_errors(worker):
    """The given binding's and layer's errors (not the student's work: reported, not scored)."""
    cache = torch.zeros(1, 2, 16, 64, device="cuda")
    new = torch.zeros(1, 2, 1, 64, device="cuda")
    q = torch.zeros(1, 2, 1, 64, device="cuda")
    out = torch.empty_like(q)
    update = lambda k_new, k_cache, pos, v_cache=None: ("update_cache", k_new, k_new.clone(), k_cache,  # noqa: E731
                                                        k_cache.clone() if v_cache is None else v_cache, pos)
    decode = lambda q_, k_cache, length, splits=0, o=None: ("decode", q_, k_cache, k_cache.clone(),  # noqa: E731
                                                            out if o is None else o, length, 0.125, splits)
    bad = [
        ("pos at max_seq", update(new, cache, 16), "pos + n_new must be at most max_seq"),
        ("pos negative", update(new, cache, -1), "pos must be at least 0"),
        ("new rows past the end", update(torch.zeros(1, 2, 3, 64, device="cuda"), cache, 14),
         "pos + n_new must be at most max_seq"),
        ("cache of float64", update(new.double(), cache.double(), 0), "float32"),
        ("cache on the CPU", update(new, cache.cpu(), 0), "CUDA"),
        ("non-contiguous cache", update(new, cache.transpose(2, 3), 0), "contiguous"),
        ("k_cache and v_cache of different shapes", update(new, cache, 0, torch.zeros(1, 2, 8, 64, device="cuda")),
         "v_cache must have k_cache's shape"),
        ("new K of another head_dim", update(torch.zeros(1, 2, 1, 32, device="cuda"), cache, 0), "head_dim"),
        ("two queries", decode(torch.zeros(1, 2, 2, 64, device="cuda"), cache, 4), "one query"),
        ("length 0", decode(q, cache, 0), "length must be between 1 and max_seq"),
        ("length past max_seq", decode(q, cache, 17), "length must be between 1 and max_seq"),
        ("negative splits", decode(q, cache, 4, -1), "splits must be between"),
        ("head_dim 256", decode(torch.zeros(1, 1, 1, 256, device="cuda"), torch.zeros(1, 1, 4, 256, device="cuda"),
                                2, 0, torch.zeros(1, 1, 1, 256, device="cuda")), "at most 128"),
        ("out is q", decode(q, cache, 4, 0, q), "must not share memory"),
        ("scale NaN", ("decode", q, cache, cache.clone(), out, 4, math.nan, 0), "scale must be finite"),
        ("a cache of 2 heads for 3 query heads", decode(torch.zeros(1, 3, 1, 64, device="cuda"), cache, 4, 0,
                                                        torch.zeros(1, 3, 1, 64, device="cuda")), "must divide q's heads"),
        ("key_start int64", ("decode", q, cache, cache.clone(), out, 4, 0.125, 0,
                             torch.zeros(1, dtype=torch.int64, device="cuda")), "must be int32"),
        ("key_start at length", ("decode", q, cache, cache.clone(), out, 4, 0.125, 0,
                                 torch.tensor([4], dtype=torch.int32, device="cuda")), "between 0 and length - 1 = 3"),
        ("pos of int64 on the GPU", update(new, cache, torch.zeros(1, dtype=torch.int64, device="cuda")),
         "pos must be int32"),
        ("pos on the CPU", update(new, cache, torch.zeros(1, dtype=torch.int32)), "pos must be a CUDA tensor"),
        ("two lengths for one sequence", decode(q, cache, torch.ones(2, dtype=torch.int32, device="cuda")),
         "length must have shape [1]"),
        ("length of float32", decode(q, cache, torch.ones(1, device="cuda")), "length must be int32"),
        ("linear over 9 rows", ("linear", torch.zeros(9, 64, device="cuda"), torch.zeros(32, 64, device="cuda"),
                                torch.zeros(9, 32, device="cuda")), "x must hold 1 to 8 rows"),
        ("linear of another in_features", ("linear", torch.zeros(2, 64, device="cuda"),
                                           torch.zeros(32, 60, device="cuda"), torch.zeros(2, 32, device="cuda")),
         "in_features"),
        ("linear into the wrong shape", ("linear", torch.zeros(2, 64, device="cuda"), torch.zeros(32, 64, device="cuda"),
                                         torch.zeros(2, 31, device="cuda")), "out must be (rows, out_features)"),
        ("linear of a weight on the CPU", ("linear", torch.zeros(2, 64, device="cuda"), torch.zeros(32, 64),
                                           torch.zeros(2, 32, device="cuda")), "weight must be a CUDA tensor"),
        ("linear of a float64 weight", ("linear", torch.zeros(2, 64, device="cuda"),
                                        torch.zeros(32, 64, device="cuda", dtype=torch.float64),
                                        torch.zeros(2, 32, device="cuda")), "weight must be float32, bfloat16 or float16"),
        ("linear of bf16 x and a float32 weight", ("linear", torch.zeros(2, 64, device="cuda", dtype=torch.bfloat16),
                                                   torch.zeros(32, 64, device="cuda"),
                                                   torch.zeros(2, 32, device="cuda")), "x must be float32"),
        ("linear in bf16 over 12 in_features", ("linear", torch.zeros(2, 12, device="cuda", dtype=torch.bfloat16),
                                                torch.zeros(32, 12, device="cuda", dtype=torch.bfloat16),
                                                torch.zeros(2, 32, device="cuda", dtype=torch.bfloat16)),
         "multiple of 8"),
    ]
    ok, message, metrics = expect_errors(lambda *call: worker.call(*call), bad)
    if not ok:
        return ok, message, metrics
    small_layer(worker)
    layer_bad = [
        ("a prompt longer than the cache", ("prefill", torch.zeros(1, 5, 64, device="cuda"),
                                            torch.zeros(1, 5, 64, device="cuda")), "holds max_seq = 4"),
        ("a step before the prefill", ("steps", torch.zeros(1, 1, 64, device="cuda"),
                                       torch.zeros(1, 1, 64, device="cuda")), "before prefill"),
    ]
    ok, message2, _ = expect_errors(lambda *call: worker.call(*call), layer_bad)
    if not ok:
        return ok, message2, {}
    return True, f"{len(bad) + len(layer_bad)} kinds of bad input rejected with clear errors", {}


def check_linear(worker, hidden):
    """Task 6's decode step multiplies its rows by every weight with the given `linear` (common/csrc/linear_rows.cu):
    against float64, with a NaN row after out that must stay NaN (given code: reported, not scored); in float32,
    then in bf16 and fp16 against float64 on the same 16-bit inputs."""
    for dtype, cases in ((torch.float32, LINEAR_CASES), (torch.bfloat16, LINEAR_HALF_CASES),
                         (torch.float16, LINEAR_HALF_CASES)):
        for i, (rows, k, n) in enumerate(cases):
            x = random_tensor((rows, k), cli.seed(70 + i, hidden), "cuda").to(dtype)
            weight = (random_tensor((n, k), cli.seed(80 + i, hidden), "cuda") / math.sqrt(k)).to(dtype)  # outputs ~1
            out = torch.full((rows + 1, n), math.nan, device="cuda", dtype=dtype)  # row `rows` is past out
            worker.call("linear", x, weight, out[:rows])
            with exact_float32():
                expected = x.double() @ weight.double().t()
            name = f"linear of {rows} rows, in_features {k}, out_features {n}" + (
                f" in {str(dtype)[6:]}" if dtype != torch.float32 else "")
            # a 16-bit product's sums are float32's, rounded once to the type: half a unit in its last place more
            rtol = RTOL + task4_measure.HALF_EPS.get(dtype, 0.0)
            result = compare(out[:rows].float(), expected, atol=ATOL, rtol=rtol, name=name)
            if not result.passed:
                return False, result.message, {}
            if not torch.isnan(out[rows]).all():
                return False, f"{name}: wrote past out (the row after it, NaN, changed)", {}
    return True, (f"{len(LINEAR_CASES)} shapes in float32 and {len(LINEAR_HALF_CASES)} in bf16 and in fp16 match "
                  "float64, nothing written past out"), {}


def check_cache_full(worker):
    """One step past a full cache: a clear error, not a write past the end (given code, not scored)."""
    small_layer(worker)
    worker.call("prefill", torch.zeros(1, 4, 64, device="cuda"), torch.zeros(1, 4, 64, device="cuda"))
    return expect_errors(lambda *call: worker.call(*call), [
        ("a step past a full cache", ("steps", torch.zeros(1, 1, 64, device="cuda"),
                                      torch.zeros(1, 1, 64, device="cuda")), "the cache is full")])


KERNEL_STEPS = {"update_cache_kernel": "Task 5, step 1", "first_position": "Task 5, step 1",
                "update_paged_kernel": "Task 5, step 5", "cache_rows": "Task 5, step 5",
                "decode_kernel": "Task 5, step 2", "block_rows": "Task 5, step 2", "write_nan": "Task 5, step 2",
                "attend_rows": "Task 5, step 2", "decode_split_kernel": "Task 5, step 3",
                "combine_splits_kernel": "Task 5, step 3"}


def sanitizer_calls(hidden: cli.Hidden | None, with_splits: bool, with_pages: bool = False) -> list[sanitize.Call]:
    """Small cases of every kernel at its edges, for compute-sanitizer."""
    calls = []
    if with_pages:  # sequence 1's rows 20 .. 22 and its length 20 reach page 2, outside the pool: not written, NaN
        k_pages, v_pages, table = page_pool(2, 2, 8, 3, 64, cli.seed(50, hidden))
        k_pages, v_pages = k_pages.nan_to_num(), v_pages.nan_to_num()
        table[1, 2] = k_pages.shape[0]
        k_new, v_new = (random_tensor((2, 2, 3, 64), cli.seed(51 + i, hidden)) for i in range(2))
        calls.append(sanitize.Call("update_cache_paged pages of 8", "update_cache_paged",
                                   (k_new, v_new, k_pages, v_pages, table, torch.tensor([6, 20], dtype=torch.int32)),
                                   ("k_new", "v_new", "k_pages", "v_pages", "block_table", "pos")))
        q = random_tensor((2, 4, 1, 64), cli.seed(53, hidden))
        for splits in (1, 3):
            calls.append(sanitize.Call(f"decode_paged pages of 8 lengths 24,20 splits {splits}", "decode_paged",
                                       (q, k_pages, v_pages, torch.empty_like(q), table,
                                        torch.tensor([24, 20], dtype=torch.int32), 0.125, splits),
                                       ("q", "k_pages", "v_pages", "out", "block_table", "length")))
    # the given linear of task 6's decode step: widths off its float4 and its blocks' rows
    x, weight = random_tensor((3, 68), cli.seed(54, hidden)), random_tensor((33, 68), cli.seed(55, hidden))
    calls.append(sanitize.Call("linear 3 rows, in_features 68, out_features 33", "linear",
                               (x, weight, torch.empty(3, 33)), ("x", "weight", "out")))
    x, weight = (random_tensor(shape, cli.seed(56 + i, hidden), dtype=torch.bfloat16)
                 for i, shape in enumerate(((3, 72), (33, 72))))
    calls.append(sanitize.Call("linear in bf16, 3 rows, in_features 72, out_features 33", "linear",
                               (x, weight, torch.empty(3, 33, dtype=torch.bfloat16)), ("x", "weight", "out")))
    # one position per sequence (int32 on the GPU): the last one does not fit and writes nothing
    for b, h, max_seq, pos, n, d in [(1, 2, 10, 9, 1, 128), (2, 1, 40, 3, 33, 17), (3, 2, 20, (0, 18, 19), 2, 64)]:
        k_new, v_new = (random_tensor((b, h, n, d), cli.seed(max_seq + n + i, hidden)) for i in range(2))
        where = pos if isinstance(pos, int) else torch.tensor(pos, dtype=torch.int32)
        calls.append(sanitize.Call(f"update_cache cache {max_seq} pos {pos} n_new {n} head_dim {d}", "update_cache",
                                   (k_new, v_new, torch.zeros(b, h, max_seq, d), torch.zeros(b, h, max_seq, d), where),
                                   ("k_new", "v_new", "k_cache", "v_cache", "pos")))
    shapes = [(1, 2, 40, 40, 128), (1, 1, 70, 65, 17), (2, 1, 20, 3, 12), (1, 2, 33, 33, 64)]
    # 3 and 12 heads per cache head; lengths per sequence, out of range (NaN, nothing read) included
    grouped_shapes = [(2, 6, 2, 40, 37, 64, (0, 30)), (1, 12, 1, 20, 9, 12, None),
                      (3, 4, 2, 30, (30, 1, 31), 64, None), (2, 6, 3, 40, (40, 12), 80, (39, 12))]
    for splits in (1, 3, 64) if with_splits else (1,):
        for shape in shapes:
            q, k_cache, v_cache = (t.nan_to_num() for t in decode_inputs(shape, cli.seed(sum(shape), hidden)))
            calls.append(sanitize.Call(f"decode {describe_decode(shape)} splits {splits}", "decode",
                                       (q, k_cache, v_cache, torch.empty_like(q), shape[3], 1 / math.sqrt(shape[4]),
                                        splits), ("q", "k_cache", "v_cache", "out")))
        for i, shape in enumerate(grouped_shapes):
            q, k_cache, v_cache = (t.nan_to_num() for t in decode_inputs(shape, cli.seed(40 + i, hidden)))
            starts = None if shape[6] is None else torch.tensor(shape[6], dtype=torch.int32)
            length = shape[4] if isinstance(shape[4], int) else torch.tensor(shape[4], dtype=torch.int32)
            names = ("q", "k_cache", "v_cache", "out") + (() if isinstance(length, int) else ("length",))
            calls.append(sanitize.Call(f"decode {describe_grouped(shape)} splits {splits}", "decode",
                                       (q, k_cache, v_cache, torch.empty_like(q), length, 1 / math.sqrt(shape[5]),
                                        splits, starts), names + ("key_start",)))
    return calls




def main(argv=None) -> int:
    parser = cli.parser(5, __doc__.splitlines()[2])
    for part, (steps, optional) in PARTS.items():
        parser.add_argument(f"--{part.replace('_', '-')}", action="store_true",
                            help=f"test only README step{'s' if len(steps) > 1 else ''} "
                                 f"{', '.join(map(str, steps))}{' (optional)' if optional else ''}")
    args = parser.parse_args(argv)
    chosen = [p for p in PARTS if getattr(args, p)] or list(PARTS)
    report = Report(5, args.solution, "KV cache and decode kernels", args.student_dir)
    if len(chosen) < len(PARTS):  # without a GPU, the TODO lines listed are the asked parts' alone
        report.asked_steps = {step for part in chosen for step in PARTS[part][0]}
    with cli.worker(report, 5, args) as worker:
        if worker is None:
            return report.finish(args.json)
        split_passed = paged_passed = False
        prefill = {"by": "task4", "why": ""}  # the layer's prefill: your Task 4 kernel, unless it fails
        constants = kernel_constants("task5/kernels/decode.cu", args.student_dir, args.solution)
        for part in [] if args.sanitize else [p for p in chosen if p not in SIXTEEN_BIT]:
            steps, optional = PARTS[part]
            report.begin_part(part, steps, optional=optional)
            first = len(report.cases)
            if part == "cache":
                for case in cli.cases(5, part, CACHE_CASES, args.hidden, causal=(False,),
                                      shape_text=lambda s: "batch {} heads {} cache {} pos {} n_new {} head_dim {}"
                                      .format(*s)):
                    report.run(case.name, lambda: check_update(worker, case))
            elif part in ("decode", "split"):
                public = DECODE_CASES if part == "decode" else SPLIT_CASES
                label = (describe_decode if part == "decode" else
                         lambda s: f"{describe_decode(s[:5])} splits {s[5] or 'chosen by the launcher'}")
                for case in cli.cases(5, part, public, args.hidden, label, causal=(False,)):
                    splits = 1 if part == "decode" else case.shape[5]
                    report.run(case.name, lambda: check_decode(worker, case.shape[:5], case.seed, splits, constants))
                grouped_public = GROUPED_DECODE_CASES if part == "decode" else GROUPED_SPLIT_CASES
                for case in cli.cases(5, f"{part} grouped", grouped_public, args.hidden, describe_grouped,
                                      causal=(False,)):
                    splits = 1 if part == "decode" else case.shape[7]
                    report.run(case.name, lambda: check_decode(worker, case.shape[:7], case.seed, splits, constants))
            elif part == "paged":
                for case in cli.cases(5, "paged update", PAGED_UPDATE_CASES, args.hidden, causal=(False,),
                                      shape_text=lambda s: "batch {} kv heads {} pages of {} ({} a sequence) pos {} "
                                      "n_new {} head_dim {}".format(*s)):
                    report.run(case.name, lambda: check_update_paged(worker, case))
                for case in cli.cases(5, "paged decode", PAGED_DECODE_CASES, args.hidden, causal=(False,),
                                      shape_text=lambda s: "batch {} heads {} kv heads {} pages of {} ({} a sequence) "
                                      "lengths {} head_dim {} key_start {} splits {}".format(*s)):
                    report.run(case.name, lambda: check_decode_paged(worker, case))
            else:
                # the layer runs the update and decode checked above
                failed = sum(not c.passed and c.kind == "check" for c in report.cases)
                for i, (hidden, heads, max_seq, prompt_len, n) in enumerate(LAYER_CASES):
                    report.run(f"layer hidden {hidden} heads {heads} cache {max_seq}: prefill {prompt_len}, "
                               f"{n} steps vs nn.MultiheadAttention",
                               lambda: builds_on(check_layer(worker, hidden, heads, max_seq, prompt_len, n,
                                                             cli.seed(13 + i, args.hidden), prefill),
                                                 failed, "the cache's and the decode's own cases"))
                if prefill["by"] == "pytorch":
                    report.note(f"the layer's prefill runs your Task 4 kernel, which failed here ({prefill['why'][:300]}); "
                                "these checks and the generation benchmark used a prefill in plain PyTorch instead, "
                                "so Task 5's kernels are graded on their own: python -m task4.test shows Task 4's")
            report.end_part(part)
            if part == "split":
                split_passed = len(report.cases) > first and all(c.passed for c in report.cases[first:])
            if part == "paged":
                paged_passed = len(report.cases) > first and all(c.passed for c in report.cases[first:])
        passes = []  # each sanitizer pass runs beside the checks that follow it, in processes of its own
        sixteen_only = set(chosen) <= SIXTEEN_BIT
        if (args.sanitize and not sixteen_only) or any(c.passed and c.kind == "check" for c in report.cases):
            with_splits = split_passed or (args.sanitize and "split" in chosen)
            with_pages = paged_passed or (args.sanitize and "paged" in chosen)
            passes.append(sanitize.start(report, 5, args, sanitizer_calls(args.hidden, with_splits, with_pages),
                                         KERNEL_STEPS.get))
        if args.sanitize:
            sanitize.finish(report, passes.pop() if passes else None)
            if set(chosen) & SIXTEEN_BIT:
                sanitize.add_to_report(report, 5, args, half_sanitizer_calls(args.hidden, "paged_half" in chosen),
                                       HALF_KERNEL_STEPS.get, HALF_PASS_NAME, kind="optional")
            return report.finish(args.json)
        if not sixteen_only:  # the 16-bit parts alone: their own bad input and benchmarks follow them
            report.run("bad input raises clear errors (the given binding and layer)", lambda: check_errors(worker),
                       kind="given")
            report.run("a step past a full cache raises a clear error (the given layer)",
                       lambda: check_cache_full(worker), kind="given")
            report.run("task 6's decode-step products (the given linear) match float64",
                       lambda: check_linear(worker, args.hidden), kind="given")
        half_timed = paged_half_timed = False
        if set(chosen) & SIXTEEN_BIT and not report.stopped:
            # In a process of its own (the next call starts one): a crash or a hang in the optional kernels costs
            # their own part, never the float32 checks or the sanitizer pass before it, or the benchmarks after it.
            # --paged-half alone runs step 6's part too: step 7's is compared with it.
            worker.stop_until_next_call()
            half_timed, paged_half_timed = optional_half(
                report, worker, args, passes,
                (lambda: paged_half_part(report, worker, args.hidden)) if "paged_half" in chosen else None)
            half_timed, paged_half_timed = (half_timed and not args.grading, paged_half_timed and not args.grading)
        if any(passes):
            report.heading("compute-sanitizer")
        for started in passes:
            sanitize.finish(report, started)
        # The timings last: in a grading, the other tasks' tests check side by side with this one, and a timed
        # part waits until none of them is in the middle of its checks (harness/gpu_share.py).
        required = [c for c in report.cases if c.kind != "optional"]
        if sixteen_only:
            pass
        elif set(chosen) < {"cache", "decode", "layer"}:
            report.note("benchmarks run when every part is tested (no --cache/--decode/--layer flag)")
        elif report.stopped or not all(c.passed for c in required):
            report.note("benchmarks skipped until every check passes")
        else:
            report.heading("benchmarks")
            shapes = [] if cli.grading_leaves_out(report, args, 5, "the shapes nobody tuned for") else (
                measure.SHAPE_BENCHMARKS + cli.extra_cases(5, "shapes", args.hidden))
            with gpu_share.alone_in_a_fresh_process(worker):
                measure.run_benchmarks(report, worker, split_passed, prefill["by"], paged_passed, shapes)
            said = None if args.solution or args.grading else points.estimate_note(5, report.cases)
            if said:
                report.note(said)
        if half_timed:
            report.heading("bf16/fp16 benchmarks (optional)")
            with gpu_share.alone_in_a_fresh_process(worker):
                measure.run_half_benchmarks(report, worker, paged_half_timed)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(5, args.solution, args.student_dir, report.attention_ops), kind="rule")
    if sixteen_only:  # the status below counts required checks only, and this run has none
        optional = [c for c in report.cases if c.kind == "optional"]
        flags = " ".join(f"--{p.replace('_', '-')}" for p in chosen)
        report.note(f"{flags} tests the optional part{'s' if len(chosen) > 1 else ''} alone: "
                    f"{sum(c.passed for c in optional)} of {len(optional)} checks passed")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
