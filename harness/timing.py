"""Timing that tells the truth about asynchronous GPU work.

- `benchmark` times one kernel-sized call: on CUDA a pair of events per repetition
  after warm-up, with a 256 MiB write before each repetition (outside the timed
  interval) so every repetition starts with a cold L2, and a host clock beside
  them that catches work launched on another stream (which the events miss); on
  the CPU `time.perf_counter`. It repeats until the median is known to `rel_err`, or a
  time cap, and reports the median and the spread.
- `wall_clock` times a whole pipeline (TTFT, TBT) with a host clock and
  `torch.cuda.synchronize()` on both sides, since launch overhead is part of it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024
SIDE_STREAM_SLACK_MS = 0.2  # launch and synchronisation overhead the host clock adds
_flush_buffers: dict = {}


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    p25_ms: float
    p75_ms: float
    reps: int

    def metrics(self, prefix: str = "") -> dict:
        return {f"{prefix}{k}": v for k, v in self.__dict__.items()}

    def __str__(self) -> str:
        return f"{self.median_ms:.3f} ms (IQR {self.p25_ms:.3f}-{self.p75_ms:.3f}, {self.reps} runs)"


def summarize(samples_ms: list[float]) -> Timing:
    """Median, quartiles and range of samples in milliseconds."""
    q = statistics.quantiles(samples_ms, n=4) if len(samples_ms) > 1 else samples_ms * 3
    return Timing(statistics.median(samples_ms), min(samples_ms), max(samples_ms), q[0], q[2], len(samples_ms))


def _settled(samples: list[float], min_reps: int, rel_err: float) -> bool:
    """Stop once the spread of the middle half, over sqrt(n), is small next to the median."""
    if len(samples) < min_reps:
        return False
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / len(samples) ** 0.5 <= rel_err * statistics.median(samples)


def _flush_l2(device) -> None:
    buf = _flush_buffers.get(device)
    if buf is None:
        buf = _flush_buffers[device] = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)
    buf.fill_(1.0)


def benchmark(
    fn,
    device="cpu",
    *,
    setup=None,
    warmup: int = 3,
    min_reps: int = 10,
    max_reps: int = 200,
    max_seconds: float = 10.0,
    rel_err: float = 0.01,
) -> Timing:
    """Median time of `fn()` in milliseconds.

    `setup()`, when given, runs before each repetition outside the timed interval
    (for example to write fresh values into the inputs, so a kernel that returns a
    cached result is caught when its last output is checked).
    """
    device = torch.device(device)
    setup = setup or (lambda: None)
    for _ in range(warmup):
        setup()
        fn()
    samples: list[float] = []
    start_time = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        stream = torch.cuda.current_stream(device)
        host_samples: list[float] = []
        while len(samples) < max_reps:
            setup()
            _flush_l2(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            start.record(stream)
            fn()
            end.record(stream)
            torch.cuda.synchronize(device)  # every stream: work the events did not see is waited for too
            host_samples.append((time.perf_counter() - t0) * 1e3)
            samples.append(start.elapsed_time(end))
            if _settled(samples, min_reps, rel_err) or time.perf_counter() - start_time > max_seconds:
                break
        # The events see only the current stream. If the host waited far longer than they
        # measured, the work ran elsewhere (a side stream): the host clock is the honest time.
        if statistics.median(host_samples) > 2 * statistics.median(samples) + SIDE_STREAM_SLACK_MS:
            samples = host_samples
    else:
        while len(samples) < max_reps:
            setup()
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
            if _settled(samples, min_reps, rel_err) or time.perf_counter() - start_time > max_seconds:
                break
    return summarize(samples)


def wall_clock(fn, device="cpu", *, warmup: int = 1, reps: int = 5) -> Timing:
    """Host-clock median of a whole pipeline, synchronising before and after each run."""
    device = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return summarize(samples)
