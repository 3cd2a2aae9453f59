"""How far a CUDA graph takes task 6's decode step: python notes/task6_graph_probe.py (a GPU with 40 GB).

For issue 31. The handout model (batch 4, prompt 1024) with SDPA over the cache and with the reference
kernels: one decode step eager (host clock around step + sync, median of 30), then the same step
captured in a CUDA graph at one cache length and replayed (median of 50 replays, host clock + sync,
and CUDA events). The cache length is a Python int in today's code, so a captured step always writes
the same position and reads the same length: a fair cost of one step at that length, not a generation.
Also the floor (every weight once + the cache, at the measured copy bandwidth) and cuBLAS's matrix-vector
products at the model's shapes, inside a graph too.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from harness import bench  # noqa: E402
from task5.attention import built_kernels  # noqa: E402
from task6.measure import HANDOUT, SdpaCachedAttention, floor_ms  # noqa: E402
from task6.model import SIZES, SmallLM  # noqa: E402
from task6.solution.attention import CachedAttention  # noqa: E402


def host_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def event_ms(fn, reps):
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


def one_step(model, cache, token):
    lengths = [c.length for c in cache]

    def step():
        for c, n in zip(cache, lengths):
            c.length = n
        return model(token, cache, last=True)
    return step


def graphed(step):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def main():
    config, run = SIZES["handout"], HANDOUT
    kernels = built_kernels(solution=True)
    copy = bench.copy_bandwidth_gbs()
    nbytes, floor = floor_ms(config, run, copy)
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s; floor {floor:.2f} ms ({nbytes / 1e9:.1f} GB)", flush=True)
    base = SmallLM(config, SdpaCachedAttention, device="cuda", seed=0)
    prompt = torch.randint(0, config.vocab, (run.batch, run.prompt), device="cuda")
    token = torch.randint(0, config.vocab, (run.batch, 1), device="cuda")
    for name, model in (("sdpa", base),
                        ("reference kernels", SmallLM(config, CachedAttention, kernels, device="meta")
                         .share_weights(base).set_kernels(kernels))):
        with torch.no_grad():
            cache = model.new_cache(run.batch)
            model(prompt, cache, last=True)
            for _ in range(run.steps // 2):  # the cache at the run's mean length
                model(token, cache, last=True)
            step = one_step(model, cache, token)
            eager = host_ms(step, 30)
            graph, _ = graphed(step)
            replay_host, replay_events = host_ms(graph.replay, 50), event_ms(graph.replay, 50)
        print(f"{name}: eager {eager:.2f} ms ({eager / floor:.2f}x the floor); graph {replay_host:.2f} ms host, "
              f"{replay_events:.2f} ms events ({replay_events / floor:.2f}x the floor)", flush=True)
        del graph, cache
        torch.cuda.empty_cache()
    # the weights' matrix-vector products alone, graphed: what cuBLAS reads them at
    x = torch.randn(run.batch, config.hidden, device="cuda")
    with torch.no_grad():
        h = torch.randn(run.batch, config.mlp, device="cuda")

        def products():
            for layer in base.blocks:
                layer.attention.qkv_proj(x), layer.attention.o_proj(x), layer.mlp.gate_up(x), layer.mlp.down(h)
            base.head(x)
        graph, _ = graphed(products)
        ms = event_ms(graph.replay, 50)
    weights = sum(p.numel() for p in base.parameters()) * 4 - config.vocab * config.hidden * 4
    print(f"cuBLAS products of every weight, graphed: {ms:.2f} ms, {weights / ms / 1e6:.0f} GB/s "
          f"({weights / ms / 1e6 / copy:.0%} of copy)", flush=True)


if __name__ == "__main__":
    main()
