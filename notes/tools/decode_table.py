"""The reference decode kernel's bandwidth over many shapes: python notes/tools/decode_table.py (issue 31, item 4).

Each shape is timed as task 5's benchmarks time it (task5/measure.py's TimedDecode: rotating caches so L2
holds none of them, a fresh query and output per call, every output checked, host clock over many calls,
median of 5 requests), against the copy bandwidth measured in the same run. Bytes are K and V as stored.
Then the same calls as one CUDA graph (lengths on the GPU, as a captured decode step runs them): CUDA events
around a replay, the median of 20, per call; and the floor of a call at that batch and heads, the same graph
over a cache of one position. "bound" says which limits the shape: memory where the bytes at the copy
bandwidth take longer than that floor, launch where they do not.

python notes/tools/decode_table.py --kernels NAME times task5/solution/NAME/decode.cu (a variant of the reference's
kernels) as a graph only, each shape's outputs checked.
"""
import math
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from harness import bench  # noqa: E402
from task5.attention import decode, extension  # noqa: E402
from checks.task5.measure import TimedDecode, time_decode_here  # noqa: E402

# (batch, heads, kv_heads, cached tokens, head_dim)
SHAPES = [(16, 32, 32, 4096, 128), (1, 32, 32, 32768, 128), (16, 32, 8, 4096, 128), (3, 5, 5, 7777, 80),
          (64, 8, 8, 1000, 64), (1, 8, 8, 8192, 64), (8, 40, 8, 2048, 128), (2, 12, 12, 16384, 64),
          (4, 32, 32, 1024, 128), (32, 16, 16, 512, 96), (1, 1, 1, 100000, 128), (7, 6, 2, 5000, 40),
          (128, 32, 8, 256, 128), (1, 32, 8, 1024, 128),
          (16, 32, 4, 4096, 128), (4, 28, 4, 4096, 128), (8, 12, 2, 8192, 128)]


def graphed_us(ext, timed, length, scale) -> float:
    """Per call: every set's decode captured once (lengths on the GPU), CUDA events around replays."""
    lengths = torch.full((timed.shape[0],), length, dtype=torch.int32, device="cuda")

    def calls():
        for q, out, c in timed.sets:
            ext.decode(q, *timed.caches[c], out, lengths, scale, 0)
    calls()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    samples = []
    for _ in range(23):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return sorted(samples[3:])[len(samples[3:]) // 2] * 1e3 / len(timed.sets)


def main():
    kernels = sys.argv[sys.argv.index("--kernels") + 1] if "--kernels" in sys.argv else None
    copy = bench.copy_bandwidth_gbs()
    ext = extension(True, kernels)
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s; kernels: task5/solution/{kernels or 'kernels'}")
    print("| batch | heads | kv heads | cached | head_dim | K+V MB | splits | host loop | of copy | graph | of copy "
          "| floor | bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for batch, heads, kv_heads, length, head_dim in SHAPES:
        timed = TimedDecode(batch, heads, kv_heads, length, head_dim)
        scale = 1 / math.sqrt(head_dim)
        timed.refresh()
        if kernels is None:
            timing = time_decode_here(lambda q, k, v, out: decode(q, k, v, length, scale, out=out, solution=True), timed)
            timed.check(scale)
        splits = ext.splits_for(batch, heads, kv_heads, length, head_dim)
        graph_us = graphed_us(ext, timed, length, scale)
        timed.check(scale)
        host = "- | -"  # a variant (--kernels) is timed as a graph only
        if kernels is None:
            host = f"{timing.median_ms * 1e3:.1f} us | {timed.bytes_read / (timing.median_ms * 1e-3) / 1e9 / copy:.0%}"
        graph_gbs = timed.bytes_read / (graph_us * 1e-6) / 1e9
        floor_us = graphed_us(ext, TimedDecode(batch, heads, kv_heads, 1, head_dim), 1, scale)
        bytes_us = timed.bytes_read / (copy * 1e9) * 1e6
        print(f"| {batch} | {heads} | {kv_heads} | {length} | {head_dim} | {timed.bytes_read / 1e6:.1f} | {splits} | "
              f"{host} | {graph_us:.1f} us | {graph_gbs / copy:.0%} | "
              f"{floor_us:.1f} us | {'memory' if bytes_us > floor_us else 'launch'} |", flush=True)
        del timed
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
