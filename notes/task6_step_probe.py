"""Issue 31: task 6's given product (task 5's extension `linear`) at the handout's decode step, and the step itself.

python notes/task6_step_probe.py [--step]  (a GPU with 40 GB). Times, each as a CUDA graph (CUDA events around
20 replays after 3, the median): the 97 products of a handout step on fresh weights by the given kernel and by
notes/gemv_step_probe.py's 2-rows-a-warp kernel, then the same products on the handout model's own weights.
--step: the model with the reference kernels and the given products, a decode step launched from Python and
replayed as a graph (30 steps each, the median), each with a kernel profile of 10 steps.
"""
import importlib.util
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from harness import bench  # noqa: E402
from task5.attention import built_kernels, extension  # noqa: E402
from task6.model import SIZES, Decoder, Linear, SmallLM  # noqa: E402
from task6.solution.attention import CachedAttention  # noqa: E402

BATCH = 4


def load_probe():
    spec = importlib.util.spec_from_file_location("gemv_step_probe", "notes/gemv_step_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


def products(copy_gbs, probe):
    """The given kernel and the probe's on fresh weights, twice each, then the given one on the model's."""
    given = extension(True)
    pext = probe.load_inline(
        "gemv_step_probe", cpp_sources="void gemv(torch::Tensor x, torch::Tensor w, torch::Tensor y, int64_t unroll, "
        "int64_t blocks_per_sm); void gemv_rows(torch::Tensor x, torch::Tensor w, torch::Tensor y, int64_t rows, "
        "int64_t unroll, int64_t blocks_per_sm);", cuda_sources=probe.SOURCE, functions=["gemv", "gemv_rows"],
        extra_cuda_cflags=["-O3"])
    weights = [torch.randn(n, k, device="cuda") * 0.01 for _ in range(24) for n, k in probe.SHAPES]
    weights.append(torch.randn(8192, 4096, device="cuda") * 0.01)
    xs = {k: torch.randn(BATCH, k, device="cuda") for k in (4096, 16384)}

    def timed(name, weights, run):
        ys = [torch.empty(BATCH, w.shape[0], device="cuda") for w in weights]
        nbytes = sum(w.nbytes for w in weights)
        ms = probe.graphed_ms(lambda: [run(xs[w.shape[1]], w, y) for w, y in zip(weights, ys)])
        print(f"{name}: {len(weights)} products, {nbytes / 1e9:.2f} GB, {ms:.2f} ms, {nbytes / ms / 1e6 / copy_gbs:.0%} "
              "of copy", flush=True)

    for _ in range(2):
        timed("fresh weights, the given kernel", weights, given.linear)
        timed("fresh weights, the probe's 2 rows x 2 ahead x 4 blocks/SM", weights,
              lambda x, w, y: pext.gemv_rows(x, w, y, 2, 2, 4))
    weights.clear()
    torch.cuda.empty_cache()
    model = SmallLM(SIZES["handout"], CachedAttention, built_kernels(solution=True), device="cuda", seed=0)
    timed("the model's weights, the given kernel", [m.weight for m in model.modules() if isinstance(m, Linear)],
          given.linear)
    return model


def steps(model):
    kernels = built_kernels(solution=True)
    model.set_linear(kernels.linear, kernels.linear_max_rows())
    prompt = torch.randint(0, model.config.vocab, (BATCH, 1024), device="cuda")
    with torch.no_grad():
        for graph in (False, True):
            decoder = Decoder(model, graph)
            token = decoder.prefill(prompt)[:, -1:].argmax(-1)
            for _ in range(3):
                decoder.step(token)
            times = []
            for _ in range(30):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                decoder.step(token)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            print(f"a decode step {'replayed as a CUDA graph' if graph else 'launched from Python'}: "
                  f"{sorted(times)[len(times) // 2]:.2f} ms (median of 30)", flush=True)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    decoder.step(token)
                torch.cuda.synchronize()
            on_gpu = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
            for e in sorted(on_gpu, key=lambda e: -e.self_device_time_total)[:8]:
                print(f"   {e.key[:70]:70s} {e.self_device_time_total / 10 / 1e3:.3f} ms a step, {e.count // 10} calls")
            del decoder


def main():
    copy_gbs = bench.copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbs:.0f} GB/s")
    model = products(copy_gbs, load_probe())
    if "--step" in sys.argv:
        steps(model)


if __name__ == "__main__":
    main()
