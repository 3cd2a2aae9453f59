"""python -m task5.test [--cache | --decode | --split | --layer | --paged | --half] [--solution] [--json PATH]

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
  bf16 and fp16 (step 6, optional) against float64 on the same 16-bit values, in a process of
  its own: both reported, not scored.
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
from torch import nn

from common import impl

from harness import cli, gpu_share, points, sanitize
from harness.diagnose import decode_schedules, diagnose, kernel_constants
from harness.checks import (GUARD_BITS, GUARD_BITS_16, CheckResult, compare, exact_float32, expect_errors,
                           guard_damage, guarded_input, guarded_output, random_tensor)
from common.layer import mha_weights
from harness.records import Report
from harness.sandbox import WorkerDied, WorkerError
from harness.reference import attention_reference, causal_mask, expand_kv_heads
from checks.task4 import measure as task4_measure
from checks.task5 import measure
from task5.attention import TASK4_DID_NOT_BUILD
from checks.task5.measure import ATOL, RTOL
from checks.task5.cases import (CACHE_CASES, DECODE_CASES, GROUPED_DECODE_CASES, GROUPED_SPLIT_CASES, HALF_DECODE_CASES,
                                HALF_UPDATE_CASES, LAYER_CASES, LINEAR_CASES, LINEAR_HALF_CASES, PAGED_DECODE_CASES,
                                PAGED_UPDATE_CASES, SPLIT_CASES)


PARTS = {  # name: (README steps, optional)
    "cache": ((1,), False),
    "decode": ((2,), False),
    "split": ((3,), True),
    "layer": ((1, 2), False),
    "paged": ((5,), True),
    "half": ((6,), True),
}

HALF_CALL_LIMIT = {"timeout": 60}  # a call of the bf16/fp16 part: small cases, so a hang costs a minute, not five


def describe_decode(shape) -> str:
    return "batch {} heads {} cache {} length {} head_dim {}".format(*shape)


def describe_grouped(shape) -> str:
    b, h, kvh, max_seq, length, d, starts = shape[:7]
    group = "MQA" if kvh == 1 else f"{kvh} kv heads"
    padding = f" key_start {','.join(map(str, starts))}" if starts is not None else ""
    splits = f" splits {shape[7] or 'chosen by the launcher'}" if len(shape) > 7 else ""
    return f"batch {b} heads {h} ({group}) cache {max_seq} {lengths_text(length)} head_dim {d}{padding}{splits}"


def lengths_text(length) -> str:
    """`length 40`, or for one per sequence (int32 on the GPU) `lengths 40,3,0 on the GPU`."""
    return f"length {length}" if isinstance(length, int) else f"lengths {','.join(map(str, length))} on the GPU"


def on_gpu(values):
    """An int as it is; one value per sequence as the int32 tensor the kernels read."""
    return values if isinstance(values, int) else torch.tensor(values, dtype=torch.int32, device="cuda")


def grouped(shape):
    """A decode case as (batch, heads, kv_heads, max_seq, length, head_dim, key_start)."""
    return shape if len(shape) >= 7 else (shape[0], shape[1], shape[1], *shape[2:5], None)


def cache_with_tail(shape, length, seed):
    """A cache (batch, heads, max_seq, head_dim) whose positions from `length` on (an int, or one per
    sequence) hold NaN."""
    cache = random_tensor(shape, seed)
    for b, end in enumerate([length] * shape[0] if isinstance(length, int) else length):
        cache[b, :, max(end, 0):] = math.nan
    return cache


def run_update(worker, case, dtype=torch.float32):
    """The update of a case, run: ((k_new, v_new), the caches' values before, the caches), or the guard bands'
    damage (a failed CheckResult). A 16-bit dtype: the cache of step 6 (update_cache_half)."""
    b, h, max_seq, pos, n, d = case.shape
    k_new, v_new = (random_tensor((b, h, n, d), case.seed + i).to(dtype) for i in range(2))
    before = [random_tensor((b, h, max_seq, d), case.seed + 2 + i).to(dtype) for i in range(2)]
    news = [guarded_input(name, t) for name, t in (("k_new", k_new), ("v_new", v_new))]
    caches = [guarded_output(name, (b, h, max_seq, d), dtype=dtype) for name in ("k_cache", "v_cache")]
    for cache, values in zip(caches, before):
        cache.tensor.copy_(values)
    call, limit = ("update_cache", {}) if dtype == torch.float32 else ("update_cache_half", HALF_CALL_LIMIT)
    worker.call(call, news[0].tensor, news[1].tensor, caches[0].tensor, caches[1].tensor, on_gpu(pos), **limit)
    return guard_damage(*news, *caches) or ((k_new, v_new), before, caches)


def update_step(dtype) -> int:
    """The README step of an update: step 1's float32 cache, or step 6's 16-bit one."""
    return 1 if dtype == torch.float32 else 6


def bits(t):
    """A tensor's values as integers of their width: rows compared bit for bit."""
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def check_update(worker, case, dtype=torch.float32):
    b, h, max_seq, pos, n, d = case.shape
    if not isinstance(pos, int):
        return check_update_per_sequence(worker, case, dtype)
    ran = run_update(worker, case, dtype)
    if isinstance(ran, CheckResult):
        return ran  # the guard bands' damage
    step = update_step(dtype)
    (k_new, v_new), before, caches = ran
    for cache, values, new in zip(caches, before, (k_new, v_new)):
        expected = values.clone()
        expected[:, :, pos:pos + n] = new
        got = cache.tensor.cpu()
        wrong = (bits(got) != bits(expected)).any(dim=-1)  # (b, h, max_seq) rows
        if not wrong.any():
            continue
        if torch.equal(bits(got), bits(values)):
            return CheckResult(False, f"`{cache.name}` is unchanged: rows {pos} .. {pos + n - 1} were not written",
                               untouched=True)
        rows = sorted({int(r) for r in wrong.nonzero()[:, 2]})
        outside = [r for r in rows if not pos <= r < pos + n]
        shown = ", ".join(map(str, (outside or rows)[:5]))

        def holds_new(at):
            return torch.equal(bits(got[:, :, at:at + n].contiguous()), bits(new))

        landed = [at for at in range(max_seq - n + 1) if at != pos and holds_new(at)]
        if landed and not holds_new(pos):
            off = landed[0] - pos
            return False, (f"looks like the new rows written at other rows than pos .. pos + n_new - 1 (row pos + t "
                           f"of the cache takes new row t): see README, Task 5, step {step}. `{cache.name}`: they landed "
                           f"{abs(off)} row{'s' if abs(off) > 1 else ''} {'past' if off > 0 else 'before'} pos, at rows "
                           f"{landed[0]} to {landed[0] + n - 1}, not {pos} to {pos + n - 1}"), {}
        if outside:
            return False, (f"`{cache.name}`: rows outside pos .. pos + n_new - 1 = {pos} .. {pos + n - 1} "
                           f"changed (rows {shown}); only the new positions may be written"), {}
        return False, f"`{cache.name}`: rows {shown} do not hold the new K/V values (an index off?)", {}
    return True, f"rows {pos} .. {pos + n - 1} written exactly, the other {max_seq - n} untouched", {}


def check_update_per_sequence(worker, case, dtype=torch.float32):
    """update_cache with one position per sequence (int32 on the GPU): each sequence's rows where its pos says,
    and nothing written for a sequence whose rows would not fit."""
    b, h, max_seq, pos, n, d = case.shape
    ran = run_update(worker, case, dtype)
    if isinstance(ran, CheckResult):
        return ran  # the guard bands' damage
    step = update_step(dtype)
    (k_new, v_new), before, caches = ran
    for cache, values, new in zip(caches, before, (k_new, v_new)):
        got = bits(cache.tensor.cpu())
        for seq, p in enumerate(pos):
            expected = values[seq].clone()
            fits = 0 <= p <= max_seq - n
            if fits:
                expected[:, p:p + n] = new[seq]
            if torch.equal(got[seq], bits(expected)):
                continue
            rows = sorted({int(r) for r in (got[seq] != bits(expected)).any(dim=-1).nonzero()[:, 1]})
            shown = ", ".join(map(str, rows[:5]))
            if not fits:
                return False, (f"`{cache.name}`, sequence {seq}: pos[{seq}] = {p} with {n} new row(s) does not fit in "
                               f"max_seq = {max_seq}, so nothing may be written, but rows {shown} changed: skip such "
                               f"a sequence (README, Task 5, step {step})"), {}
            return False, (f"`{cache.name}`, sequence {seq}: rows {shown} are wrong; its new rows go to pos[{seq}] .. "
                           f"pos[{seq}] + n_new - 1 = {p} .. {p + n - 1}: each sequence reads its own pos (README, "
                           f"Task 5, step {step})"), {}
    skipped = sum(not 0 <= p <= max_seq - n for p in pos)
    return True, (f"each sequence's rows written at its own pos, the rest untouched"
                  f"{f'; {skipped} that did not fit wrote nothing' if skipped else ''}"), {}


def decode_inputs(shape, seed):
    b, h, kvh, max_seq, length, d, _ = grouped(shape)
    q = random_tensor((b, h, 1, d), seed)
    return q, cache_with_tail((b, kvh, max_seq, d), length, seed + 1), cache_with_tail((b, kvh, max_seq, d), length,
                                                                                    seed + 2)


def launcher_splits(worker, shape, splits) -> int:
    """The splits a decode ran with: `splits`, or for 0 what the student's launcher says it picks (a number
    only used to name a mistake, so anything but a sensible int is taken as one split)."""
    if splits:
        return splits
    b, h, kvh, max_seq, length, d, _ = grouped(shape)
    most = length if isinstance(length, int) else max_seq  # what the launcher chooses for
    try:
        chosen = worker.call("splits_for", b, h, kvh, most, d)
    except (WorkerError, WorkerDied):  # the case's own failure is what it reports
        return 1
    return chosen if isinstance(chosen, int) and 1 <= chosen <= most else 1


def check_decode(worker, shape, seed, splits, constants=None):
    """One decode; a wrong output is compared with the common mistakes (harness/diagnose.py), the online
    softmax's slips laid out as the student's DECODE_WARPS and UNROLL (`constants`) say. shape: (batch,
    heads, max_seq, length, head_dim), or grouped-query and padded as `grouped` says."""
    b, h, kvh, max_seq, length, d, starts = grouped(shape)
    if not isinstance(length, int):
        return check_decode_per_sequence(worker, shape, seed, splits)
    q, k_cache, v_cache = decode_inputs(shape, seed)
    key_start = None if starts is None else torch.tensor(starts, dtype=torch.int32)
    inputs = [guarded_input(name, t) for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache))]
    out = guarded_output("out", q.shape)
    scale = 1.0 / math.sqrt(d)
    worker.call("decode", *(t.tensor for t in inputs), out.tensor, length, scale, splits,
                None if key_start is None else key_start.cuda())
    damage = guard_damage(*inputs, out)
    if damage:
        return damage
    # each query head's cache head repeated for it: the checks' float64 side only
    k_seen, v_seen = (expand_kv_heads(c[:, :, :length], h) for c in (k_cache, v_cache))
    expected = attention_reference(q, k_seen, v_seen, False, scale, key_start)[0]
    bits = out.tensor.view(torch.int32)
    result = compare(out.tensor, expected, atol=ATOL, rtol=RTOL, poisoned=bool((bits == GUARD_BITS).all()))
    if result.passed or key_start is not None:  # the known mistakes are modelled without padding
        return result
    used = launcher_splits(worker, shape, splits)
    step = 3 if used > 1 else 2
    if (torch.isnan(out.tensor) & (bits != GUARD_BITS)).any():  # NaN the kernel computed: from where?
        if length < max_seq and not nan_without_the_tail(worker, q, k_cache, v_cache, length, scale, splits):
            result.message = (f"looks like a decode that reads past `length` (the cache holds NaN from that position "
                              f"on, and NaN came out; with zeros there, none does): read rows 0 to length - 1 only: "
                              f"see README, Task 5, step {step}. The cache holds NaN from position {length}; "
                              f"{result.message}")
            return result
        if used > 1 and -(-length // used) * (used - 1) >= length:  # the last splits get no row
            result.message = (f"looks like a split with no rows that computed 0/0 (with more splits than "
                              f"ceil(length / rows per split), the last ones are empty: give them lse = -inf and a "
                              f"zero output): see README, Task 5, step 3. {used} splits over {length} rows; "
                              f"{result.message}")
            return result
    return diagnose(5, result, out.tensor, q, k_seen, v_seen, False, atol=ATOL,
                    rtol=RTOL, scale=scale, splits=used, schedules=decode_schedules(constants or {}, d, length, used))


def check_decode_per_sequence(worker, shape, seed, splits):
    """The decode with one length per sequence, int32 on the GPU: each sequence against the reference over its
    own rows, and NaN for a sequence whose length or key_start is out of range."""
    b, h, kvh, max_seq, lengths, d, starts = grouped(shape)
    q, k_cache, v_cache = decode_inputs(shape, seed)
    inputs = [guarded_input(name, t) for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache))]
    out = guarded_output("out", q.shape)
    scale = 1.0 / math.sqrt(d)
    worker.call("decode", *(t.tensor for t in inputs), out.tensor, on_gpu(lengths), scale, splits,
                None if starts is None else on_gpu(starts))
    damage = guard_damage(*inputs, out)
    if damage:
        return damage
    got, said = out.tensor.cpu(), []
    for seq, (end, first) in enumerate(zip(lengths, starts or (0,) * b)):
        if not 0 <= first < end <= max_seq:
            passed, words = out_of_range(got[seq], seq, end, first, max_seq, GUARD_BITS)
            if not passed:
                return False, words, {}
            said.append(words)
            continue
        expected = attention_reference(q[seq:seq + 1], k_cache[seq:seq + 1, :, first:end],
                                       v_cache[seq:seq + 1, :, first:end], False, scale)[0]
        result = compare(got[seq:seq + 1], expected, atol=ATOL, rtol=RTOL, name=f"sequence {seq}'s output",
                         poisoned=True)
        if not result.passed:
            result.message = (f"{result.message} (its rows are {first} .. {end - 1}: each sequence reads its own "
                              "length from the tensor: README, Task 5, step 2)")
            return result
        said.append(result.message)
    return True, f"each sequence over its own rows: {'; '.join(said)}", {}


def out_of_range(got, seq, end, first, max_seq, fill, keep="") -> tuple[bool, str]:
    """A sequence whose length or key_start is out of range: its output must be NaN, every element written (none
    left at the output's `fill`). keep: more of what to keep, said when it is not."""
    if torch.isnan(got).all() and not bool((bits(got) == fill).any()):
        return True, f"sequence {seq} out of range: NaN"
    return False, (f"sequence {seq} has length {end} and key_start {first}, out of range for a cache of max_seq = "
                   f"{max_seq}: its output must be NaN (the given check in block_rows makes it so: keep it{keep}), "
                   "got numbers or nothing written")


def nan_without_the_tail(worker, q, k_cache, v_cache, length, scale, splits) -> bool:
    """Whether the decode still computes NaN when the cache past `length` holds zeros instead of NaN."""
    caches = [guarded_input(name, t.nan_to_num(0.0)) for name, t in (("k_cache", k_cache), ("v_cache", v_cache))]
    q_in, out = guarded_input("q", q), guarded_output("out", q.shape)
    worker.call("decode", q_in.tensor, *(c.tensor for c in caches), out.tensor, length, scale, splits)
    return bool((torch.isnan(out.tensor) & (out.tensor.view(torch.int32) != GUARD_BITS)).any())


def check_half_decode(worker, shape, seed, splits, dtype):
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
        expected = attention_reference(q[seq:seq + 1], *rows, False, scale)[0]
        allowed, why = task4_measure.half_allowance(q[seq:seq + 1], *rows, False, scale, None, expected)
        result = compare(got[seq:seq + 1], expected, atol=allowed, rtol=0.0, name=f"sequence {seq}'s output",
                         poisoned=True)
        if not result.passed:
            result.message = (f"{result.message} ({why}; its rows are {first} .. {end - 1}: README, Task 5, "
                              "step 6)")
            return result
        said.append(f"{result.message}, {allowed:.1e} allowed")
    return True, (f"each sequence over its own rows, within 2x SDPA's error in {str(dtype)[6:]} on its inputs (or "
                  f"half a unit in the last place): {'; '.join(said)}"), {}


def check_layer(worker, hidden, heads, max_seq, prompt_len, steps, seed, prefill):
    """The layer's prefill (your Task 4 kernel) and decode steps against nn.MultiheadAttention. When the
    prefill is wrong, the steps are checked again after a prefill in plain PyTorch: Task 5's kernels are
    graded here on their own, Task 4's by its test. prefill: {"by": "task4" or "pytorch", "why": ...},
    what the layers of this run use (the first layer whose prefill fails switches it, and says why)."""
    torch.manual_seed(seed)
    reference = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True)
    weights = [w.cuda() for w in mha_weights(reference)]
    x = random_tensor((2, prompt_len + steps, hidden), seed + 1)
    with torch.no_grad(), exact_float32():
        seq = prompt_len + steps
        x64 = x.double()
        expected, _ = reference.double()(x64, x64, x64, attn_mask=causal_mask(seq, seq), need_weights=False)
    atol = ATOL * float(expected.abs().max())

    def generate():
        worker.call("make_layer", hidden, heads, max_seq, weights, prefill["by"])
        out_prompt = torch.full((2, prompt_len, hidden), math.nan, device="cuda")
        out_steps = torch.full((2, steps, hidden), math.nan, device="cuda")
        worker.call("prefill", x[:, :prompt_len].cuda(), out_prompt)
        worker.call("steps", x[:, prompt_len:].cuda().contiguous(), out_steps)
        return out_prompt, out_steps

    def prompt_wrong(out_prompt):
        checked = compare(out_prompt, expected[:, :prompt_len], atol=atol, rtol=RTOL, name="prefill output")
        return None if checked.passed else checked.message

    try:
        out_prompt, out_steps = generate()
        failed = prompt_wrong(out_prompt)
    except WorkerError as err:
        if prefill["by"] == "pytorch" or TASK4_DID_NOT_BUILD not in err.message:
            raise
        failed = err.message.splitlines()[0]
    if failed and prefill["by"] == "task4":  # Task 4's kernel is wrong: check Task 5's steps without it
        prefill.update(by="pytorch", why=failed)
        out_prompt, out_steps = generate()
        failed = prompt_wrong(out_prompt)
    if failed:  # the prompt's attention was plain PyTorch's: the layer around it is wrong
        return CheckResult(False, f"{failed}; the prefill's attention was plain PyTorch's here and its output is still "
                                  "wrong: does a kernel write outside its rows (python -m task5.test --cache)?")
    result = compare(out_steps, expected[:, prompt_len:], atol=atol, rtol=RTOL, name="decode steps' output",
                     poisoned=True)
    if result.passed:
        full = " (the cache is full at the end)" if seq == max_seq else ""
        by = "" if prefill["by"] == "task4" else " (the prefill in plain PyTorch: your Task 4 kernel's was wrong)"
        result.message = f"prefill of {prompt_len} and {steps} steps match{full}{by}; {result.message}"
    return result


def page_pool(batch, kv_heads, page_size, max_pages, head_dim, seed, spare=3):
    """A pool of pages holding NaN, and a block table handing each sequence max_pages of them in a random order
    (`spare` pages belong to no sequence): (k_pages, v_pages, table)."""
    num_pages = batch * max_pages + spare
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
    table = order[:batch * max_pages].view(batch, max_pages).to(torch.int32).contiguous()
    shape = (num_pages, kv_heads, page_size, head_dim)
    return torch.full(shape, math.nan), torch.full(shape, math.nan), table


def to_pages(cache, pages, table):
    """Copy a contiguous cache (batch, kv_heads, max_pages * page_size, head_dim) into the pool's pages."""
    batch, _, _, head_dim = cache.shape
    page_size = pages.shape[2]
    for b in range(batch):
        for i, page in enumerate(table[b].tolist()):
            pages[page] = cache[b, :, i * page_size:(i + 1) * page_size]


def check_update_paged(worker, case):
    """update_cache_paged: each new row in the page the block table names, nothing else of the pool changed. The
    last sequence's table names a page outside the pool (-1) where its last new row goes: that row is not
    written."""
    b, kvh, page_size, max_pages, pos, n, d = case.shape
    k_new, v_new = random_tensor((b, kvh, n, d), case.seed), random_tensor((b, kvh, n, d), case.seed + 1)
    k_pages, v_pages, table = page_pool(b, kvh, page_size, max_pages, d, case.seed)
    if 0 <= pos[-1] <= max_pages * page_size - n:
        table[-1, (pos[-1] + n - 1) // page_size] = -1
    before = [random_tensor(k_pages.shape, case.seed + 2 + i) for i in range(2)]
    pools = [guarded_output(name, k_pages.shape) for name in ("k_pages", "v_pages")]
    for pool, values in zip(pools, before):
        pool.tensor.copy_(values)
    worker.call("update_cache_paged", k_new.cuda(), v_new.cuda(), *(p.tensor for p in pools), table.cuda(),
                on_gpu(pos))
    damage = guard_damage(*pools)
    if damage:
        return damage
    for pool, values, new in zip(pools, before, (k_new, v_new)):
        expected = values.clone()
        for seq, p in enumerate(pos):
            if 0 <= p <= max_pages * page_size - n:
                for t in range(n):
                    page = int(table[seq, (p + t) // page_size])
                    if page >= 0:
                        expected[page, :, (p + t) % page_size] = new[seq, :, t]
        got = pool.tensor.cpu()
        wrong = (got.view(torch.int32) != expected.view(torch.int32)).any(dim=-1).nonzero()
        if len(wrong):
            page, head, row = wrong[0].tolist()
            owner = (table == page).nonzero()
            where = (f"page {page} (sequence {owner[0, 0]}'s page {owner[0, 1]}, positions "
                     f"{owner[0, 1] * page_size} ..)" if len(owner) else f"page {page} (no sequence's)")
            return False, (f"`{pool.name}`: {where}, head {head}, row {row} is wrong: position p of sequence b goes to "
                           f"page block_table[b, p / page_size], row p % page_size, and nowhere when that entry is "
                           f"outside the pool (README, Task 5, step 5)"), {}
    return True, "each new row in the page its block table names, the rest of the pool untouched", {}


def check_decode_paged(worker, case):
    """decode_paged against the contiguous decode on the same rows (the student's, same splits): bit for bit."""
    b, h, kvh, page_size, max_pages, lengths, d, starts, splits = case.shape
    shape = (b, h, kvh, max_pages * page_size, lengths, d, starts)
    contiguous = check_decode_per_sequence(worker, shape, case.seed, splits)
    passed = contiguous.passed if isinstance(contiguous, CheckResult) else contiguous[0]
    if not passed:
        message = contiguous.message if isinstance(contiguous, CheckResult) else contiguous[1]
        return False, f"the contiguous decode these rows are compared with is wrong: {message}", {}
    q, k_cache, v_cache = decode_inputs(shape, case.seed)
    scale = 1.0 / math.sqrt(d)
    k_pages, v_pages, table = page_pool(b, kvh, page_size, max_pages, d, case.seed)
    to_pages(k_cache, k_pages, table)
    to_pages(v_cache, v_pages, table)
    for seq, end in enumerate(lengths):  # the table past a sequence's pages is not to be read
        table[seq, -(-max(end, 0) // page_size):] = -1
    outs = [guarded_output(name, q.shape) for name in ("out (contiguous)", "out (paged)")]
    key_start = None if starts is None else on_gpu(starts)
    worker.call("decode", q.cuda(), k_cache.cuda(), v_cache.cuda(), outs[0].tensor, on_gpu(lengths), scale, splits,
                key_start)
    worker.call("decode_paged", q.cuda(), k_pages.cuda(), v_pages.cuda(), outs[1].tensor, table.cuda(),
                on_gpu(lengths), scale, splits, key_start)
    damage = guard_damage(*outs)
    if damage:
        return damage
    paged, flat = (o.tensor.cpu().view(torch.int32) for o in outs[::-1])
    if not torch.equal(paged, flat):
        seq, head = (paged != flat).any(dim=-1).nonzero()[0, :2].tolist()
        nan = bool(torch.isnan(outs[1].tensor.cpu()[seq, head]).any())
        return False, (f"sequence {seq}, head {head}: the paged decode differs from the contiguous one on the same rows"
                       f"{' (NaN: a row read from a page the sequence does not own, or a table entry past its pages)' if nan else ''}; "
                       "offset(row) must find row p in page block_table[b, p / page_size] (README, Task 5, step 5)"), {}
    return True, f"bit for bit the contiguous decode's output over pages of {page_size}", {}


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




def check_half_errors(worker):
    """The given binding's errors for the 16-bit cache (not the student's work: reported, not scored)."""
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
    return expect_errors(lambda *call: worker.call(*call), bad)


def half_sanitizer_calls(hidden: cli.Hidden | None) -> list[sanitize.Call]:
    """Step 6's pass: the update (one sequence that does not fit), and the decode with 16-byte rows and with a
    value at a time, groups, padding, a length out of range and splits, bf16 and fp16 in turn."""
    calls = []
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


def half_part(report, worker, hidden_cases) -> bool:
    """Step 6 (optional): the 16-bit cache's update and decode in both types; whether every case passed. The
    first case whose process crashed or hung ends the part (the rest would wait as long)."""
    report.begin_part("half", (6,), optional=True)
    runs = [(case, lambda c=case, t=dtype: check_update(worker, c, t))
            for name, dtype in task4_measure.HALF_TYPES.items()
            for case in cli.cases(5, "half update", HALF_UPDATE_CASES, hidden_cases, causal=(False,),
                                  shape_text=lambda s, n=name: f"{n} update batch {s[0]} heads {s[1]} cache {s[2]} "
                                                               f"pos {s[3]} n_new {s[4]} head_dim {s[5]}")]
    runs += [(case, lambda c=case, t=dtype: check_half_decode(worker, c.shape[:7], c.seed, c.shape[7], t))
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


def optional_half(report, worker, args, passes: list) -> bool:
    """Step 6 (optional): the 16-bit cache's checks, then bad input while its own sanitizer pass runs (added to
    `passes`); every case optional, so nothing here moves a point. Whether the checks passed (then its benchmarks
    come last)."""
    if not half_part(report, worker, args.hidden):
        return False
    passes.append(sanitize.start(report, 5, args, half_sanitizer_calls(args.hidden), HALF_KERNEL_STEPS.get,
                                 HALF_PASS_NAME, kind="optional", part="half"))
    report.run("bad input to the bf16/fp16 cache raises clear errors (the given binding)",
               lambda: check_half_errors(worker), kind="optional")
    return not report.stopped


def main(argv=None) -> int:
    parser = cli.parser(5, __doc__.splitlines()[2])
    for part, (steps, optional) in PARTS.items():
        parser.add_argument(f"--{part}", action="store_true",
                            help=f"test only README step{'s' if len(steps) > 1 else ''} "
                                 f"{', '.join(map(str, steps))}{' (optional)' if optional else ''}")
    args = parser.parse_args(argv)
    chosen = [p for p in PARTS if getattr(args, p)] or list(PARTS)
    report = Report(5, args.solution, "KV cache and decode kernels", args.student_dir)
    with cli.worker(report, 5, args) as worker:
        if worker is None:
            return report.finish(args.json)
        split_passed = paged_passed = False
        prefill = {"by": "task4", "why": ""}  # the layer's prefill: your Task 4 kernel, unless it fails
        constants = kernel_constants("task5/kernels/decode.cu", args.student_dir, args.solution)
        for part in [] if args.sanitize else [p for p in chosen if p != "half"]:
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
                for i, (hidden, heads, max_seq, prompt_len, n) in enumerate(LAYER_CASES):
                    report.run(f"layer hidden {hidden} heads {heads} cache {max_seq}: prefill {prompt_len}, "
                               f"{n} steps vs nn.MultiheadAttention",
                               lambda: check_layer(worker, hidden, heads, max_seq, prompt_len, n,
                                                   cli.seed(13 + i, args.hidden), prefill))
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
        if (args.sanitize and chosen != ["half"]) or any(c.passed and c.kind == "check" for c in report.cases):
            with_splits = split_passed or (args.sanitize and "split" in chosen)
            with_pages = paged_passed or (args.sanitize and "paged" in chosen)
            passes.append(sanitize.start(report, 5, args, sanitizer_calls(args.hidden, with_splits, with_pages),
                                         KERNEL_STEPS.get))
        if args.sanitize:
            sanitize.finish(report, passes.pop() if passes else None)
            if "half" in chosen:
                sanitize.add_to_report(report, 5, args, half_sanitizer_calls(args.hidden), HALF_KERNEL_STEPS.get,
                                       HALF_PASS_NAME, kind="optional")
            return report.finish(args.json)
        if chosen != ["half"]:  # the optional part alone: its own bad input and benchmarks follow it
            report.run("bad input raises clear errors (the given binding and layer)", lambda: check_errors(worker),
                       kind="given")
            report.run("a step past a full cache raises a clear error (the given layer)",
                       lambda: check_cache_full(worker), kind="given")
            report.run("task 6's decode-step products (the given linear) match float64",
                       lambda: check_linear(worker, args.hidden), kind="given")
        half_timed = False
        if "half" in chosen and not report.stopped:
            # In a process of its own (the next call starts one): a crash or a hang in the optional kernels costs
            # their own part, never the float32 checks or the sanitizer pass before it, or the benchmarks after it.
            worker.stop_until_next_call()
            half_timed = optional_half(report, worker, args, passes) and not args.grading
        if any(passes):
            report.heading("compute-sanitizer")
        for started in passes:
            sanitize.finish(report, started)
        # The timings last: in a grading, the other tasks' tests check side by side with this one, and a timed
        # part waits until none of them is in the middle of its checks (harness/gpu_share.py).
        required = [c for c in report.cases if c.kind != "optional"]
        if chosen == ["half"]:
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
                measure.run_half_benchmarks(report, worker)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(5, args.solution, args.student_dir, report.attention_ops), kind="rule")
    if chosen == ["half"]:  # the status below counts required checks only, and this run has none
        optional = [c for c in report.cases if c.kind == "optional"]
        report.note(f"--half tests the optional part alone: {sum(c.passed for c in optional)} of its "
                    f"{len(optional)} checks passed")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
