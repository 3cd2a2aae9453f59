"""python -m task3.test [--solution] [--json PATH]

Checks Task 3's FlashAttention-2 (PyTorch) on the CPU (and on CUDA when present):
- output and log-sum-exp against a float64 reference, for several tile sizes,
  sequence lengths that are not multiples of the tiles, seq_q != seq_k, causal and not;
- that no intermediate tensor is as large as the full (seq_q x seq_k) score matrix;
then times it next to Task 1's naive attention on the same inputs.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common import cli, impl
from common.checks import compare, exact_float32, random_tensor
from common.records import Report
from common.reference import attention_reference
from common.timing import benchmark

# (batch, heads, seq_q, seq_k, head_dim, block_rows, block_cols)
CASES = [
    (1, 1, 1, 1, 16, 64, 64),
    (2, 3, 127, 127, 32, 16, 16),
    (2, 3, 127, 127, 32, 32, 64),
    (2, 2, 129, 129, 64, 64, 32),
    (1, 2, 100, 300, 64, 64, 64),
    (1, 2, 1, 257, 64, 64, 64),
    (1, 2, 200, 200, 80, 128, 128),
    (1, 1, 70, 70, 8, 1, 7),
]
ATOL, RTOL = 2e-5, 1e-4
TIMING_SHAPES = {"cpu": (2, 8, 512, 64), "cuda": (4, 32, 1024, 128)}  # (batch, heads, seq, head_dim)


def inputs(shape, seed, device):
    batch, heads, seq_q, seq_k, d = shape[:5]
    return (
        random_tensor((batch, heads, seq_q, d), seed, device),
        random_tensor((batch, heads, seq_k, d), seed + 1, device),
        random_tensor((batch, heads, seq_k, d), seed + 2, device),
    )


WATCH = impl.AttentionOpWatch()  # every call into the student's code runs under it


def check_values(mod, shape, causal, device, seed):
    q, k, v = inputs(shape, seed, device)
    tiles = dict(block_rows=shape[5], block_cols=shape[6])
    with exact_float32(), WATCH:
        result = mod.flash_attention(q, k, v, causal=causal, return_lse=True, **tiles)
        plain = mod.flash_attention(q, k, v, causal=causal, **tiles)
    if not (isinstance(result, tuple) and len(result) == 2):
        return False, "with return_lse=True, flash_attention must return (out, lse)", {}
    if not isinstance(plain, torch.Tensor):
        return False, f"without return_lse, flash_attention must return the output tensor, got {type(plain).__name__}", {}
    out, lse = result
    ref_out, ref_lse = attention_reference(q, k, v, causal)
    checked = compare(out, ref_out, atol=ATOL, rtol=RTOL, name="out")
    if not checked.passed:
        return checked
    checked_lse = compare(lse, ref_lse, atol=ATOL, rtol=RTOL, name="lse (the log-sum-exp m_i + log(l_i))")
    if not checked_lse.passed:
        return checked_lse
    return checked


class TensorStats(TorchDispatchMode):
    """Records the largest tensor, and the elements of all tensors, that PyTorch operations produce."""

    def __init__(self):
        super().__init__()
        self.largest, self.op, self.total = 0, None, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, torch.Tensor):
                self.total += t.numel()
                if t.numel() > self.largest:
                    self.largest, self.op = t.numel(), str(func)
        return result


def run_with_stats(mod, q, k, v, causal, br, bc) -> TensorStats:
    with TensorStats() as stats, WATCH:
        mod.flash_attention(q, k, v, causal=causal, block_rows=br, block_cols=bc)
    return stats


def check_no_full_matrix(mod, device, seed):
    batch, heads, seq, d, br, bc = 1, 2, 512, 32, 64, 64
    q, k, v = inputs((batch, heads, seq, seq, d), seed, device)
    full = batch * heads * seq * seq
    tile_bound = max(batch * heads * br * bc, q.numel())  # a score tile, or a tensor the size of the output
    for causal in (False, True):
        seen = run_with_stats(mod, q, k, v, causal, br, bc)
        if seen.largest > tile_bound:
            return False, (f"{'causal: ' if causal else ''}an intermediate has {seen.largest} elements (from "
                           f"{seen.op}), as many as the full score matrix ({full}): work tile by tile "
                           f"(one {br}x{bc} tile has {batch * heads * br * bc})"), {}
    return True, f"largest intermediate {seen.largest} elements; the full score matrix would have {full}", \
        {"largest_elements": seen.largest}


def check_causal_skips_tiles(mod, device, seed):
    """With a causal mask, tiles past the diagonal must be skipped (step 2), not computed and discarded."""
    q, k, v = inputs((1, 2, 512, 512, 32), seed, device)
    full = run_with_stats(mod, q, k, v, False, 64, 64).total
    causal = run_with_stats(mod, q, k, v, True, 64, 64).total
    # 8 x 8 tiles: the causal loop visits 36 of them, 56% of the work; computing all 64 and masking is >= 100%.
    ratio = causal / full
    message = f"causal run produced {ratio:.0%} of the tensor elements of the full run (36 of 64 tiles is 56%)"
    if ratio > 0.75:
        return False, message + ": the tiles after the diagonal are computed, not skipped (README, Task 3, step 2)", {}
    return True, message, {"causal_work_fraction": ratio}


def time_against_task1(report, flash, device, solution):
    """A benchmark beside Task 1's attention; Task 1's state (not done, broken) only ever adds a note."""
    try:
        naive = impl.load(1, "attention", solution)
        passed, message, metrics = _time_both(flash, naive, device, solution)
    except (Exception, SystemExit) as err:  # NotImplementedError included
        report.note(f"{device}: timing against task 1 skipped: {type(err).__name__}: {err}")
        return
    report.add(f"{device} time against task 1", passed, message, metrics, kind="benchmark")


def _time_both(flash, naive, device, solution):
    batch, heads, seq, d = TIMING_SHAPES[device]
    q, k, v = inputs((batch, heads, seq, seq, d), 7, device)
    metrics, parts = {}, []
    for causal in (False, True):
        tag = "causal" if causal else "full"
        with exact_float32():
            t_flash = benchmark(lambda: flash.flash_attention(q, k, v, causal=causal), device, max_seconds=5)
            t_naive = benchmark(lambda: naive.attention(q, k, v, causal=causal), device, max_seconds=5)
        metrics |= t_flash.metrics(f"{tag}_flash_") | t_naive.metrics(f"{tag}_task1_")
        metrics[f"{tag}_flash_over_task1"] = t_flash.median_ms / t_naive.median_ms
        parts.append(f"{tag}: flash {t_flash.median_ms:.2f} ms, task 1 {t_naive.median_ms:.2f} ms "
                     f"({t_flash.median_ms / t_naive.median_ms:.2f}x the time)")
    shape = f"batch {batch} heads {heads} seq {seq} head_dim {d}"
    return True, f"{shape}, task 1 from {impl.label(solution)}: " + "; ".join(parts), metrics


def main(argv=None) -> int:
    args = cli.parser(3, __doc__.splitlines()[2]).parse_args(argv)
    report = Report(3, args.solution, "FlashAttention-2 in PyTorch")
    mod = cli.student_module(report, 3, "attention", args.solution)
    if mod is None:
        return report.finish(args.json)
    cases = CASES + cli.extra_cases(3, args.hidden)
    for device in cli.devices():
        for i, shape in enumerate(cases):
            for causal in (False, True):
                if causal and shape[2] > shape[3]:
                    continue
                b, h, sq, sk, d, br, bc = shape
                name = f"{device} batch {b} heads {h} seq {sq}x{sk} head_dim {d} tiles {br}x{bc}"
                name += " causal" if causal else ""
                seed = cli.seed(100 * i + 10 * causal, args.hidden)
                report.run(name, lambda: check_values(mod, shape, causal, device, seed))
        report.run(f"{device} never builds the full score matrix",
                   lambda: check_no_full_matrix(mod, device, cli.seed(999, args.hidden)))
        report.run(f"{device} causal skips the tiles after the diagonal",
                   lambda: check_causal_skips_tiles(mod, device, cli.seed(998, args.hidden)))
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(3, args.solution, WATCH.seen), kind="rule")
    if not report.stopped and all(c.passed for c in report.cases):
        for device in cli.devices():
            time_against_task1(report, mod, device, args.solution)
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
