"""Where a decode step of task 6's handout model goes: python notes/tools/task6_profile.py (a GPU with 40 GB).

python notes/tools/task6_profile.py --cublas: the products by F.linear (cuBLAS), as before the given kernel.
Prints the copy and read bandwidth, cuBLAS's matrix-vector products alone at the model's shapes,
TBT over 100 steps, the host time to launch one step, and a kernel profile of 10 steps
(the reference attention with the reference kernels). notes/task6-performance.md has the results.
"""
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from harness import bench  # noqa: E402
from task5.attention import built_kernels  # noqa: E402
from task6.model import SIZES, SmallLM  # noqa: E402
from task6.solution.attention import CachedAttention  # noqa: E402

BATCH, PROMPT, STEPS = 4, 1024, 100


def event_ms(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return sorted(samples)[reps // 2]


def main():
    config = SIZES["handout"]
    kernels = built_kernels(solution=True)
    x = torch.empty(1 << 29, device="cuda")
    print(f"copy {bench.copy_bandwidth_gbs():.0f} GB/s, read (sum) {x.numel() * 4 / event_ms(x.sum) / 1e6:.0f} GB/s")
    del x
    for rows, cols in [(4096, 4096), (3 * 4096, 4096), (2 * 16384, 4096), (4096, 16384), (8192, 4096)]:
        w, a = torch.randn(rows, cols, device="cuda"), torch.randn(BATCH, cols, device="cuda")
        ms = event_ms(lambda: a @ w.T)
        print(f"linear {rows}x{cols}, batch {BATCH}: {ms * 1e3:.1f} us, {rows * cols * 4 / ms / 1e6:.0f} GB/s")
    model = SmallLM(config, CachedAttention, kernels, device="cuda", seed=0)
    if "--cublas" not in sys.argv:  # as task 6 runs it: a step's products by the given kernel
        model.set_linear(kernels.linear, kernels.linear_max_rows())
    prompt = torch.randint(0, config.vocab, (BATCH, PROMPT), device="cuda")

    def prefill():
        cache = model.new_cache(BATCH)
        logits = model(prompt, cache, last=True)
        torch.cuda.synchronize()
        return cache, logits

    def step(cache, logits):
        return model(logits[:, -1].argmax(-1, keepdim=True), cache, last=True)

    with torch.no_grad():
        for _ in range(3):
            cache, logits = prefill()
            start = time.perf_counter()
            for _ in range(STEPS):
                logits = step(cache, logits)
            torch.cuda.synchronize()
            print(f"TBT {(time.perf_counter() - start) / STEPS * 1e3:.2f} ms")
        cache, logits = prefill()
        launch = []
        for _ in range(20):  # the GPU idle at each start: the host's time alone
            start = time.perf_counter()
            logits = step(cache, logits)
            launch.append(time.perf_counter() - start)
            torch.cuda.synchronize()
        print(f"host time to launch one step: {sorted(launch)[10] * 1e3:.2f} ms")
        cache, logits = prefill()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                logits = step(cache, logits)
            torch.cuda.synchronize()
    averages = prof.key_averages()
    print(averages.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
    on_gpu = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"GPU kernel time per step {sum(e.self_device_time_total for e in on_gpu) / 10 / 1e3:.2f} ms, "
          f"kernels per step {sum(e.count for e in on_gpu) / 10:.0f}")
    print(f"peak memory allocated {torch.cuda.max_memory_allocated() / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
