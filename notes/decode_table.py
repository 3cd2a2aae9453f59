"""The reference decode kernel's bandwidth over many shapes: python notes/decode_table.py (issue 31, item 4).

Each shape is timed as task 5's benchmarks time it (task5/measure.py's TimedDecode: rotating caches so L2
holds none of them, a fresh query and output per call, every output checked, host clock over many calls,
median of 5 requests), against the copy bandwidth measured in the same run. Bytes are K and V as stored.
"""
import math
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from harness import bench  # noqa: E402
from task5.attention import decode, extension  # noqa: E402
from task5.measure import TimedDecode, time_decode_here  # noqa: E402

# (batch, heads, kv_heads, cached tokens, head_dim)
SHAPES = [(16, 32, 32, 4096, 128), (1, 32, 32, 32768, 128), (16, 32, 8, 4096, 128), (3, 5, 5, 7777, 80),
          (64, 8, 8, 1000, 64), (1, 8, 8, 8192, 64), (8, 40, 8, 2048, 128), (2, 12, 12, 16384, 64),
          (4, 32, 32, 1024, 128), (32, 16, 16, 512, 96), (1, 1, 1, 100000, 128), (7, 6, 2, 5000, 40),
          (128, 32, 8, 256, 128), (1, 32, 8, 1024, 128)]


def main():
    copy = bench.copy_bandwidth_gbs()
    ext = extension(True)
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s")
    print("| batch | heads | kv heads | cached | head_dim | K+V MB | splits | time | GB/s | of copy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for batch, heads, kv_heads, length, head_dim in SHAPES:
        timed = TimedDecode(batch, heads, kv_heads, length, head_dim)
        scale = 1 / math.sqrt(head_dim)
        timed.refresh()
        timing = time_decode_here(lambda q, k, v, out: decode(q, k, v, length, scale, out=out, solution=True), timed)
        timed.check(scale)
        splits = ext.splits_for(batch, heads, kv_heads, length, head_dim)
        gbs = timed.bytes_read / (timing.median_ms * 1e-3) / 1e9
        print(f"| {batch} | {heads} | {kv_heads} | {length} | {head_dim} | {timed.bytes_read / 1e6:.1f} | {splits} | "
              f"{timing.median_ms * 1e3:.1f} us | {gbs:.0f} | {gbs / copy:.0%} |", flush=True)
        del timed
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
