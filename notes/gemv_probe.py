"""float32 products of a batch of 4 vectors with the handout model's weights, by layout: python notes/gemv_probe.py.

For issue 31: cuBLAS's F.linear at batch 4 read the weights at 62% of the copy bandwidth on an H200 (graphed),
which alone is 1.42x task 6's TBT floor. Which layout or call reads them faster? CUDA events, median of 50.
"""
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from harness import bench  # noqa: E402


def event_ms(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    return statistics.median(samples)


def main():
    copy = bench.copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s")
    for out_f, in_f in ((12288, 4096), (4096, 4096), (32768, 4096), (4096, 16384), (8192, 4096)):
        w = torch.randn(out_f, in_f, device="cuda")
        wt = w.t().contiguous()
        for batch in (4, 8, 16):
            x = torch.randn(batch, in_f, device="cuda")
            calls = {"F.linear (W out x in)": lambda: F.linear(x, w), "x @ Wt (in x out)": lambda: x @ wt,
                     "W @ x.T": lambda: w @ x.t()}
            line = []
            for name, call in calls.items():
                ms = event_ms(call)
                line.append(f"{name} {w.nbytes / ms / 1e6 / copy:.0%}")
            print(f"{out_f}x{in_f} batch {batch}: " + ", ".join(line), flush=True)


if __name__ == "__main__":
    main()
