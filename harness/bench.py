"""Benchmarks the worker cannot bend: one host clock, the same for the student's code and the baselines.

The vocabulary every task's benchmarks use: `host_clock` times requests, `ratio` compares
two timings of one run, `VS_REFERENCE` is the ratio the rubric scores, `or_out_of_memory`
lets a baseline that does not fit say so, and the physical limits are the float32 FFMA
peak (harness/attention_math.fp32_peak_tflops, for compute-bound kernels; float32 on the tensor cores,
fp32_tensor_core_bound_tflops, is the rate past which work must have been skipped) and
`copy_bandwidth_gbs` (for memory-bound ones).

The student's code runs in another process, so CUDA events of the checks cannot see its
kernels. Instead the checks time whole requests: the worker runs the function over `sets`
distinct input sets and waits for the GPU before it answers, and the clock (here) stops
when the answer arrives. Each request is long next to the cost of a request itself (about
0.1 ms: `sets` is chosen so), and every output of every timed request is checked right
after it, so an answer sent before the kernels finished, or one computed earlier, fails.
The reference kernel and PyTorch's baselines are timed here with the same clock, over the
same number of sets, so the ratios compare like with like.
"""

from __future__ import annotations

import importlib
import time

import torch

from harness.timing import Timing, summarize

VS_REFERENCE = "vs_reference"  # metric: reference time / student time, measured in the same run (the rubric reads it)
SET_MEMORY_BUDGET = 8 << 30  # bytes of GPU memory for the distinct input sets of one request
MIN_REQUEST_MS = 20.0  # a request this long makes its own cost (about 0.1 ms) negligible
COPY_BYTES = 1 << 30  # what copy_bandwidth_gbs copies: far more than the L2 cache holds


def sets_for(set_bytes: int, estimate_ms: float, most: int = 256) -> int:
    """How many distinct input sets a request runs: enough for MIN_REQUEST_MS, within the memory budget."""
    wanted = max(1, int(MIN_REQUEST_MS / max(estimate_ms, 1e-3)) + 1)
    return max(1, min(wanted, most, SET_MEMORY_BUDGET // max(set_bytes, 1)))


def host_clock(request, *, reps: int, per_request: int, before=None, after=None, device="cuda") -> Timing:
    """Median time of one call: `request()` runs `per_request` calls and returns once they are done.

    `before()` runs outside the clock before each request (fresh inputs, poisoned outputs);
    `after()` right after it, also outside the clock (the checks of every output).
    """
    samples = []
    for _ in range(reps):
        if before:
            before()
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        request()
        samples.append((time.perf_counter() - start) * 1e3 / per_request)
        if after:
            after()
    return summarize(samples)


def run_here(fn, sets) -> None:
    """The trusted side's own request: `fn` over every set, then wait for the GPU (as the worker does)."""
    for s in sets:
        fn(*s)
    torch.cuda.synchronize()


def ratio(baseline, ours):
    """How many times faster `ours` is, or None when the baseline did not run (out of memory)."""
    if not isinstance(baseline, Timing) or not isinstance(ours, Timing):
        return None
    return baseline.median_ms / ours.median_ms


def timing_text(t) -> str:
    return t if isinstance(t, str) else f"{t.median_ms:.3f} ms"


def copy_bandwidth_gbs(nbytes: int | None = None, reps: int = 20, warmup: int = 50) -> float:
    """The GPU's memory bandwidth as this run sees it: a device-to-device copy, bytes read plus written.

    The physical limit for a memory-bound kernel (task 5's decode), measured in the same run
    as the kernel it is compared with, so clocks and the GPU model cancel out. The fastest
    copy counts, after enough copies to bring the clocks up from idle: measured right after
    a worker has ended, single copies ran over 10% slow, and a low bandwidth lowers the bar.
    """
    nbytes = nbytes or COPY_BYTES
    src = torch.empty(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (min(samples) * 1e-3) / 1e9


def matmul_tflops(m: int, n: int, k: int, reps: int = 10, warmup: int = 5, dtype=torch.float32) -> float:
    """The rate of one product (m x k) @ (k x n) in `dtype` on the GPU, in TFLOP/s (the fastest of `reps`, CUDA
    events, after a warm-up): the compute floor of a prefill, measured in the same run as it."""
    a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
    for _ in range(warmup):
        a @ b
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    del a, b
    torch.cuda.empty_cache()
    return 2 * m * n * k / (min(samples) * 1e-3) / 1e12


def or_out_of_memory(measure):
    """A Timing, or the string 'out of memory' when a baseline does not fit on the GPU."""
    try:
        return measure()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "out of memory"


def load_reference(report, task: int, kernels: str | None = None):
    """The task's reference kernels, built and run here (never in the worker); None in the student's handout.
    kernels: another folder of the reference's kernels (taskN/solution/<kernels>), None where it is missing."""
    from common.build import kernel_sources
    from common.impl import has_solution

    if not has_solution(task) or (kernels and not kernel_sources(task, True, kernels)):
        return None
    try:
        return importlib.import_module(f"task{task}.attention").extension(solution=True, kernels=kernels)
    except Exception as err:  # noqa: BLE001  the instructor's build: say so, keep the student's numbers
        if kernels:
            report.note(f"the reference's {kernels} kernels could not be built, so they are not timed: {err}")
        else:
            report.note(f"the reference kernels could not be built, so performance is not scored: {err}")
        return None
