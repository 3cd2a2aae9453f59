import time

import torch

from harness.timing import benchmark, wall_clock
from tests.conftest import needs_cuda


def test_cpu_benchmark_measures_a_known_sleep():
    t = benchmark(lambda: time.sleep(0.002), "cpu", warmup=1, min_reps=5, max_reps=20)
    assert 1.9 <= t.median_ms < 20 and t.min_ms <= t.median_ms <= t.max_ms and 5 <= t.reps <= 20


def test_benchmark_stops_at_the_time_cap():
    start = time.perf_counter()
    t = benchmark(lambda: time.sleep(0.05), "cpu", warmup=0, min_reps=1000, max_reps=1000, max_seconds=0.3)
    assert t.reps < 20 and time.perf_counter() - start < 2


def test_wall_clock_cpu():
    assert wall_clock(lambda: time.sleep(0.001), "cpu", reps=3).median_ms >= 0.9


@needs_cuda
def test_cuda_benchmark_sees_work_on_a_side_stream():
    x = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()

    def on_side_stream():
        with torch.cuda.stream(side):
            for _ in range(5):
                x @ x

    on_default = benchmark(lambda: [x @ x for _ in range(5)], "cuda")
    sneaky = benchmark(on_side_stream, "cuda")
    assert sneaky.median_ms > 0.5 * on_default.median_ms
