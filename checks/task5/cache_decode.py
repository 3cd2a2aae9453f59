"""Task 5's checks of the cache's update (step 1), the decode (steps 2 and 3) and the cached layer, which
checks/task5/test.py runs; the paged cache (paged.py) and the 16-bit one (half.py) build on them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from harness.diagnose import decode_schedules, diagnose, diagnose_sequences
from harness.checks import (GUARD_BITS, CheckResult, compare, exact_float32, guard_damage, guarded_input,
                            guarded_output, random_tensor)
from common.layer import mha_weights
from harness.sandbox import WorkerDied, WorkerError
from harness.attention_math import attention_float64, causal_mask, expand_kv_heads
from task5.attention import TASK4_DID_NOT_BUILD
from checks.task5.cases import ATOL, RTOL


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
    """The update of a case, run: (the guard bands' damage, a failed CheckResult or None; (k_new, v_new); the
    caches' values before; the caches). A 16-bit dtype: the cache of step 6 (update_cache_half)."""
    b, h, max_seq, pos, n, d = case.shape
    k_new, v_new = (random_tensor((b, h, n, d), case.seed + i).to(dtype) for i in range(2))
    before = [random_tensor((b, h, max_seq, d), case.seed + 2 + i).to(dtype) for i in range(2)]
    news = [guarded_input(name, t) for name, t in (("k_new", k_new), ("v_new", v_new))]
    caches = [guarded_output(name, (b, h, max_seq, d), dtype=dtype) for name in ("k_cache", "v_cache")]
    for cache, values in zip(caches, before):
        cache.tensor.copy_(values)
    call, limit = ("update_cache", {}) if dtype == torch.float32 else ("update_cache_half", HALF_CALL_LIMIT)
    worker.call(call, news[0].tensor, news[1].tensor, caches[0].tensor, caches[1].tensor, on_gpu(pos), **limit)
    return guard_damage(*news, *caches), (k_new, v_new), before, caches


def update_step(dtype) -> int:
    """The README step of an update: step 1's float32 cache, or step 6's 16-bit one."""
    return 1 if dtype == torch.float32 else 6


def bits(t):
    """A tensor's values as integers of their width: rows compared bit for bit."""
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _rows(got, new, pos):
    """The caches' rows flat as a kernel's index counts them, (batch x heads) x max_seq; the new rows per head; where
    new row t of head bh belongs in the flat rows; which of those a sequence's fitting pos writes."""
    b, h, max_seq, d = got.shape
    n = new.shape[2]
    starts = torch.tensor([pos] * b if isinstance(pos, int) else list(pos)).repeat_interleave(h)  # one per head
    fits = ((starts >= 0) & (starts <= max_seq - n))[:, None].expand(b * h, n)
    base = (torch.arange(b * h) * max_seq + starts)[:, None] + torch.arange(n)[None, :]
    return bits(got).reshape(-1, d), bits(new).reshape(b * h, n, d), base, fits


def rows_in_place(got, new, pos) -> bool:
    """Whether every new row whose sequence fits is where pos says (other rows may be wrong as well)."""
    flat, rows, base, fits = _rows(got, new, pos)
    return torch.equal(flat[base[fits]], rows[fits])


def landed_off(got, new, pos, outside_ok=False) -> int | None:
    """How many rows past pos (negative: before) the new rows landed in the cache `got`: the nearest offset at
    which every new row (of a sequence that fits) holds its values there, bit for bit; None if there is none. pos:
    an int, or one per sequence. The rows are counted as a kernel's index counts them, flat over (batch x heads)
    x max_seq: a row pushed past its head's end lands in the next head's first rows. `outside_ok`: the guard
    band says rows were written outside the cache, so those that fall outside are not asked for (at least one
    row must be inside)."""
    flat, rows, base, fits = _rows(got, new, pos)
    max_seq = got.shape[2]
    for off in sorted((o for o in range(1 - max_seq, max_seq) if o), key=abs):
        at = base + off
        inside = fits & (at >= 0) & (at < flat.shape[0])
        if not inside.any() or (not outside_ok and not torch.equal(inside, fits)):
            continue
        if torch.equal(flat[at[inside]], rows[inside]):
            return off
    return None


def said_off(name: str, off: int, pos, n: int, max_seq: int, step: int) -> str:
    """The diagnosis of new rows that landed `off` rows from pos (one pos, or one per sequence)."""
    rows = f"{abs(off)} row{'s' if abs(off) > 1 else ''} {'past' if off > 0 else 'before'}"
    if isinstance(pos, int):
        span = (lambda first: f"row {first}" if n == 1 else f"rows {first} to {first + n - 1}")
        where = f" pos, at {span(pos + off)}, not {span(pos)}"
        if pos + off + n > max_seq or pos + off < 0:
            where += f" (a row outside 0 .. {max_seq - 1} is another head's, or memory outside the cache)"
    else:
        where = " each sequence's pos"
    return (f"looks like the new rows written at other rows than pos .. pos + n_new - 1 (row pos + t of the cache "
            f"takes new row t): see README, Task 5, step {step}. `{name}`: they landed {rows}{where}")


def shifted_said(caches, news, pos, n: int, step: int, damage=None):
    """The diagnosis of new rows that all landed shifted in a cache, or None. With the guard bands' `damage`,
    rows that fell outside the cache (what wrote there) are allowed, and the damage is said after it."""
    for cache, new in zip(caches, news):
        got = cache.tensor.cpu()
        if (damage is not None and f"`{cache.name}`" not in damage.message) or rows_in_place(got, new, pos):
            continue
        off = landed_off(got, new, pos, outside_ok=damage is not None)
        if off is not None:
            said = said_off(cache.name, off, pos, n, cache.shape[2], step)
            return False, said + (f"; the guard band says: {damage.message}" if damage is not None else ""), {}
    return None


def check_update(worker, case, dtype=torch.float32):
    b, h, max_seq, pos, n, d = case.shape
    if not isinstance(pos, int):
        return check_update_per_sequence(worker, case, dtype)
    damage, (k_new, v_new), before, caches = run_update(worker, case, dtype)
    step = update_step(dtype)
    if damage:
        return shifted_said(caches, (k_new, v_new), pos, n, step, damage) or damage
    shifted = shifted_said(caches, (k_new, v_new), pos, n, step)
    if shifted:
        return shifted
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
        if outside:
            return False, (f"`{cache.name}`: rows outside pos .. pos + n_new - 1 = {pos} .. {pos + n - 1} "
                           f"changed (rows {shown}); only the new positions may be written"), {}
        return False, f"`{cache.name}`: rows {shown} do not hold the new K/V values (an index off?)", {}
    return True, f"rows {pos} .. {pos + n - 1} written exactly, the other {max_seq - n} untouched", {}


def check_update_per_sequence(worker, case, dtype=torch.float32):
    """update_cache with one position per sequence (int32 on the GPU): each sequence's rows where its pos says,
    and nothing written for a sequence whose rows would not fit."""
    b, h, max_seq, pos, n, d = case.shape
    damage, (k_new, v_new), before, caches = run_update(worker, case, dtype)
    step = update_step(dtype)
    if damage:
        return shifted_said(caches, (k_new, v_new), pos, n, step, damage) or damage
    shifted = shifted_said(caches, (k_new, v_new), pos, n, step)  # before any one sequence's words
    if shifted:
        return shifted
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
        return check_decode_per_sequence(worker, shape, seed, splits, constants)
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
    expected = attention_float64(q, k_seen, v_seen, False, scale, key_start)[0]
    bits = out.tensor.view(torch.int32)
    result = compare(out.tensor, expected, atol=ATOL, rtol=RTOL, poisoned=bool((bits == GUARD_BITS).all()))
    if result.passed:
        return result
    used = launcher_splits(worker, shape, splits)
    step = 3 if used > 1 else 2
    if key_start is None and (torch.isnan(out.tensor) & (bits != GUARD_BITS)).any():  # NaN computed: from where?
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
    if key_start is not None:  # each sequence over its own rows, from its first real one
        return diagnose_sequences(5, result, out.tensor, q, k_seen, v_seen, False, [(0, s, length) for s in starts],
                                  atol=ATOL, rtol=RTOL, scale=scale, splits=used,
                                  schedules_for=lambda rows: decode_schedules(constants or {}, d, rows, used))
    return diagnose(5, result, out.tensor, q, k_seen, v_seen, False, atol=ATOL,
                    rtol=RTOL, scale=scale, splits=used, schedules=decode_schedules(constants or {}, d, length, used))


def check_decode_per_sequence(worker, shape, seed, splits, constants=None):
    """The decode with one length per sequence, int32 on the GPU: each sequence against the reference over its
    own rows, and NaN for a sequence whose length or key_start is out of range; the first that fails is compared
    with the common mistakes over its own rows."""
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
        expected = attention_float64(q[seq:seq + 1], k_cache[seq:seq + 1, :, first:end],
                                       v_cache[seq:seq + 1, :, first:end], False, scale)[0]
        result = compare(got[seq:seq + 1], expected, atol=ATOL, rtol=RTOL, name=f"sequence {seq}'s output",
                         poisoned=True)
        if not result.passed:
            result.message = (f"{result.message} (its rows are {first} .. {end - 1}: each sequence reads its own "
                              "length from the tensor: README, Task 5, step 2)")
            used = launcher_splits(worker, shape, splits)
            seen = [expand_kv_heads(c[seq:seq + 1, :, first:end], h) for c in (k_cache, v_cache)]
            return diagnose(5, result, got[seq:seq + 1], q[seq:seq + 1], *seen, False, atol=ATOL, rtol=RTOL,
                            scale=scale, splits=used, schedules=decode_schedules(constants or {}, d, end - first, used))
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
