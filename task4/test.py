"""python -m task4.test [--solution] [--json PATH] [--sweep]

Checks Task 4's fused FlashAttention kernel on the GPU, then measures it:
- correctness against a float64 reference (head_dim 17 to 128, sequence lengths
  around the tile edges, seq_q != seq_k, causal and not, outputs pre-filled with
  NaN), the layer against torch.nn.MultiheadAttention, and the binding's errors;
- the handout's cases (hidden 4096, 32 heads; batch 4 seq 128 and batch 64 seq 4096):
  the layer against nn.MultiheadAttention, the attention alone against the naive
  PyTorch attention and scaled_dot_product_attention, with TFLOP/s and peak memory;
- batch 8, 32 heads, seq 4096, head_dim 128 against the same baselines and the
  reference kernel (the grade's performance part), with fresh inputs for every
  timed run and the last output checked afterwards.
--sweep replaces those benchmarks (once the checks pass) by a sweep of the kernel, naive
PyTorch and SDPA over seq 128..8192 into task4-sweep.csv (and a plot when matplotlib
is installed).
"""

from __future__ import annotations

import csv
import math

import torch
import torch.nn.functional as F
from torch import nn

from common import cli, impl
from common.checks import compare, exact_float32, poisoned, random_tensor
from common.records import Report
from common.reference import (attention_flops, attention_reference, causal_mask, fp32_peak_tflops,
                              naive_attention)
from common.timing import benchmark
from task4 import attention as mod

# (batch, heads, seq_q, seq_k, head_dim)
CASES = [
    (1, 1, 1, 1, 32),
    (2, 3, 1, 257, 64),
    (2, 2, 63, 63, 64),
    (1, 2, 64, 64, 64),
    (2, 2, 65, 65, 64),
    (1, 3, 127, 127, 128),
    (1, 2, 128, 128, 128),
    (1, 2, 129, 129, 128),
    (2, 2, 100, 300, 80),
    (1, 2, 300, 300, 80),
    (1, 2, 200, 200, 72),
    (1, 1, 77, 77, 17),
    (1, 2, 1000, 1000, 32),
]
ATOL, RTOL = 2e-5, 1e-4
HANDOUT_CASES = [(4, 128), (64, 4096)]  # (batch, seq) at hidden 4096, 32 heads
PERF_CASE = (8, 32, 4096, 128)  # (batch, heads, seq, head_dim)


def make_inputs(shape, seed, magnitude=1.0):
    b, h, sq, sk, d = shape
    return (random_tensor((b, h, sq, d), seed, "cuda") * magnitude,
            random_tensor((b, h, sk, d), seed + 1, "cuda"),
            random_tensor((b, h, sk, d), seed + 2, "cuda"))


def run_kernel(ext, q, k, v, causal, scale):
    out = poisoned(q.shape, "cuda")
    ext.forward(q, k, v, out, causal, scale)
    torch.cuda.synchronize()
    return out


def check_case(ext, shape, causal, seed, scale=None, magnitude=1.0):
    q, k, v = make_inputs(shape, seed, magnitude)
    scale = 1.0 / math.sqrt(shape[-1]) if scale is None else scale
    out = run_kernel(ext, q, k, v, causal, scale)
    return compare(out, attention_reference(q, k, v, causal, scale)[0], atol=ATOL, rtol=RTOL, poisoned=True)


def check_layer(solution, hidden, heads, seq, causal, seed):
    torch.manual_seed(seed)
    reference = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True, device="cuda")
    layer = mod.FlashMultiHeadAttention(hidden, heads, device="cuda", solution=solution).load_from_torch(reference)
    x = random_tensor((2, seq, hidden), seed + 1, "cuda")
    with torch.no_grad(), exact_float32():
        out = layer(x, x, x, causal=causal)
        mask = causal_mask(seq, seq, "cuda") if causal else None
        expected, _ = reference.double()(x.double(), x.double(), x.double(), attn_mask=mask, need_weights=False)
    return compare(out, expected, atol=ATOL * float(expected.abs().max()), rtol=RTOL, name="layer output")


def check_errors(ext):
    """Bad input must raise a clear error, never crash or compute garbage."""
    q = torch.randn(1, 2, 8, 64, device="cuda")
    bad = {
        "CPU tensor": ((q.cpu(), q, q, q), "must be a CUDA tensor"),
        "float64": ((q.double(), q, q, q), "float32"),
        "half": ((q, q.half(), q, q), "float32"),
        "non-contiguous": ((q.transpose(2, 3), q, q, q), "contiguous"),
        "3 dimensions": ((q[0], q[0], q[0], q[0]), "4 dimensions"),
        "k/v mismatch": ((q, q, q[:, :, :4], q), "shape"),
        "head_dim 256": ((torch.randn(1, 1, 4, 256, device="cuda"),) * 4, "head_dim must be at most 128"),
        "wrong out shape": ((q, q, q, q[:, :1]), "out"),
        "out is q": ((q, q.clone(), q.clone(), q), "must not share memory"),
    }
    for what, (args, words) in bad.items():
        try:
            ext.forward(*args, False, 0.125)
        except RuntimeError as err:
            if words not in str(err):
                return False, f"{what}: the error does not say {words!r}: {err}", {}
            continue
        return False, f"{what}: no error was raised", {}
    try:
        ext.forward(q, q[:, :, :4], q[:, :, :4], q, True, 0.125)
        return False, "causal with seq_q > seq_k: no error was raised", {}
    except RuntimeError:
        pass
    return True, f"{len(bad) + 1} kinds of bad input rejected with clear errors", {}


# -- measuring ------------------------------------------------------------------------------

def timed(fn, **kw):
    """A Timing, or the string 'out of memory' when the baseline does not fit on the GPU."""
    try:
        with torch.no_grad(), exact_float32():
            return benchmark(fn, "cuda", **kw)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "out of memory"


def peak_memory_mb(fn):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        with torch.no_grad(), exact_float32():
            fn()
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "out of memory"
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def describe(t) -> str:
    return t if isinstance(t, str) else f"{t.median_ms:.3f} ms"


def ratio(baseline, ours):
    """How many times faster ours is, or None when the baseline did not run."""
    return None if isinstance(baseline, str) or isinstance(ours, str) else baseline.median_ms / ours.median_ms


def bench_layer(solution, batch, seq, causal):
    hidden, heads = 4096, 32
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True, device="cuda")
    layer = mod.FlashMultiHeadAttention(hidden, heads, device="cuda", solution=solution).load_from_torch(mha)
    x = torch.randn(batch, seq, hidden, device="cuda")
    mask = causal_mask(seq, seq, "cuda") if causal else None
    kw = dict(warmup=1, min_reps=5, max_seconds=4)
    t_ours = timed(lambda: layer(x, x, x, causal=causal), **kw)
    t_mha = timed(lambda: mha(x, x, x, attn_mask=mask, need_weights=False), **kw)
    del x
    speedup = ratio(t_mha, t_ours)
    message = f"layer {describe(t_ours)}, nn.MultiheadAttention {describe(t_mha)}"
    message += f" ({speedup:.2f}x)" if speedup else ""
    return True, message, {"layer_ms": getattr(t_ours, "median_ms", None), "mha_ms": getattr(t_mha, "median_ms", None),
                           "speedup_vs_mha": speedup}


def bench_attention(solution, batch, heads, seq, head_dim, causal, with_reference=False, with_memory=True):
    """The attention alone on (B, H, S, D): kernel vs naive PyTorch vs SDPA (and vs the reference kernel)."""
    shape = (batch, heads, seq, head_dim)
    q, k, v = (torch.randn(shape, device="cuda") for _ in range(3))
    out = torch.empty_like(q)
    fresh = lambda: (q.normal_(), k.normal_(), v.normal_())  # noqa: E731  new values, same buffers
    ext = mod.extension(solution)
    scale = 1.0 / math.sqrt(head_dim)
    kw = dict(warmup=1, min_reps=5, max_seconds=4)
    t_ours = timed(lambda: ext.forward(q, k, v, out, causal, scale), setup=fresh, **kw)
    if isinstance(t_ours, str):
        return False, f"the kernel ran {t_ours}", {}
    # The last timed run's output must still be right: a kernel that caches or skips work fails here.
    for b, h in [(0, 0), (batch - 1, heads - 1)]:
        expected = attention_reference(q[b, h], k[b, h], v[b, h], causal, scale)[0]
        result = compare(out[b, h], expected, atol=ATOL, rtol=RTOL, name=f"output of the last timed run, head ({b}, {h})")
        if not result.passed:
            return False, result.message, {}
    flops = attention_flops(batch, heads, seq, seq, head_dim, causal)
    tflops = flops / (t_ours.median_ms * 1e-3) / 1e12
    metrics = {"kernel_ms": t_ours.median_ms, "tflops": tflops}
    message = f"kernel {t_ours.median_ms:.3f} ms ({tflops:.1f} TFLOP/s)"
    if with_reference and impl.has_solution(4):
        ref = mod.extension(True)  # timed right after the student's kernel, under the same conditions
        t_ref = timed(lambda: ref.forward(q, k, v, out, causal, scale), setup=fresh, **kw)
        metrics |= {"reference_ms": t_ref.median_ms, "vs_reference": t_ref.median_ms / t_ours.median_ms}
        message += f", reference kernel {t_ref.median_ms:.3f} ms ({metrics['vs_reference']:.2f}x its speed)"
    t_naive = timed(lambda: naive_attention(q, k, v, causal, scale), **kw)
    t_sdpa = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale), **kw)
    metrics |= {"naive_ms": getattr(t_naive, "median_ms", None), "sdpa_ms": getattr(t_sdpa, "median_ms", None),
                "speedup_vs_naive": ratio(t_naive, t_ours), "speedup_vs_sdpa": ratio(t_sdpa, t_ours)}
    message += f", naive {describe(t_naive)}, SDPA {describe(t_sdpa)}"
    for name, label in (("naive", "naive"), ("sdpa", "SDPA")):
        if metrics[f"speedup_vs_{name}"]:
            message += f"; {metrics[f'speedup_vs_{name}']:.2f}x {label}"
    if with_memory:
        mem_ours = peak_memory_mb(lambda: ext.forward(q, k, v, out, causal, scale))
        mem_naive = peak_memory_mb(lambda: naive_attention(q, k, v, causal, scale))
        metrics |= {"kernel_peak_mb": mem_ours, "naive_peak_mb": mem_naive}
        mib = lambda m: m if isinstance(m, str) else f"{m:.0f} MiB"  # noqa: E731
        message += f"; extra memory: kernel {mib(mem_ours)}, naive {mib(mem_naive)}"
    bound = fp32_peak_tflops()
    if tflops > bound:
        return False, message + f": faster than the GPU's float32 peak ({bound:.0f} TFLOP/s), so work was skipped", metrics
    return True, message, metrics


def sweep(solution, path="task4-sweep.csv"):
    rows = []
    for seq in (128, 256, 512, 1024, 2048, 4096, 8192):
        batch = max(1, 16384 // seq)
        for causal in (False, True):
            passed, message, m = bench_attention(solution, batch, 32, seq, 128, causal, with_memory=False)
            rows.append({"seq": seq, "batch": batch, "heads": 32, "head_dim": 128, "causal": causal,
                         "kernel_correct": passed, "kernel_ms": m.get("kernel_ms"), "naive_ms": m.get("naive_ms"),
                         "sdpa_ms": m.get("sdpa_ms"), "kernel_tflops": m.get("tflops")})
            print(f"  {'' if passed else 'FAIL '}seq {seq:5d} batch {batch:3d} {'causal' if causal else 'full  '}: "
                  f"{message}")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot, only the CSV (pip install matplotlib for one)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for causal, style in ((False, "-"), (True, "--")):
        sel = [r for r in rows if r["causal"] == causal]
        tag = "causal" if causal else "full"
        for key, label, color in (("kernel_ms", "your kernel", "C0"), ("naive_ms", "naive PyTorch", "C1"),
                                  ("sdpa_ms", "SDPA", "C2")):
            ran = [r for r in sel if r[key] is not None]  # a baseline that ran out of memory has no point
            seqs = [r["seq"] for r in ran]
            tflops = [attention_flops(r["batch"], 32, r["seq"], r["seq"], 128, causal) / (r[key] * 1e-3) / 1e12
                      for r in ran]
            axes[0].plot(seqs, [r[key] for r in ran], style, color=color, marker="o", label=f"{label} ({tag})")
            axes[1].plot(seqs, tflops, style, color=color, marker="o", label=f"{label} ({tag})")
    for ax, ylabel in zip(axes, ("time (ms), batch = 16384 / seq", "TFLOP/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Task 4, 32 heads, head_dim 128, float32 ({torch.cuda.get_device_name()})")
    fig.tight_layout()
    png = path.rsplit(".", 1)[0] + ".png"
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


def main(argv=None) -> int:
    parser = cli.parser(4, __doc__.splitlines()[2])
    parser.add_argument("--sweep", action="store_true", help="time over seq 128..8192, write task4-sweep.csv")
    args = parser.parse_args(argv)
    report = Report(4, args.solution, "fused FlashAttention kernel")
    ext = cli.cuda_extension(report, lambda: mod.extension(args.solution))
    if ext is None:
        return report.finish(args.json)

    cases = CASES + cli.extra_cases(4, args.hidden)
    for i, shape in enumerate(cases):
        for causal in (False, True):
            if causal and shape[2] > shape[3]:
                continue
            name = "batch {} heads {} seq {}x{} head_dim {}".format(*shape) + (" causal" if causal else "")
            seed = cli.seed(100 * i + 10 * causal, args.hidden)
            report.run(name, lambda: check_case(ext, shape, causal, seed))
    seed = cli.seed(7, args.hidden)
    report.run("scale 0.3 and large scores (q x 4)",
               lambda: check_case(ext, (2, 2, 150, 150, 64), True, seed, scale=0.3, magnitude=4.0))
    for hidden, heads, seq in ((256, 4, 100), (4096, 32, 65)):
        for causal in (False, True):
            report.run(f"layer hidden {hidden} heads {heads} seq {seq}{' causal' if causal else ''} "
                       "vs nn.MultiheadAttention",
                       lambda: check_layer(args.solution, hidden, heads, seq, causal, cli.seed(11, args.hidden)))
    report.run("bad input raises clear errors", lambda: check_errors(ext))

    if report.stopped or not all(c.passed for c in report.cases):
        report.note("benchmarks skipped until every check passes")
        return report.finish(args.json)
    if args.sweep:
        sweep(args.solution)
        return report.finish(args.json)
    b, h, s, d = PERF_CASE
    for causal in (False, True):
        tag = " causal" if causal else ""
        report.run(f"attention batch {b} heads {h} seq {s} head_dim {d}{tag}",
                   lambda: bench_attention(args.solution, b, h, s, d, causal, with_reference=True),
                   kind="benchmark")
    for batch, seq in HANDOUT_CASES:
        for causal in (False, True):
            tag = f"batch {batch} seq {seq} hidden 4096 heads 32{' causal' if causal else ''}"
            report.run(f"layer {tag}", lambda: bench_layer(args.solution, batch, seq, causal), kind="benchmark")
            report.run(f"attention alone {tag}",
                       lambda: bench_attention(args.solution, batch, 32, seq, 128, causal), kind="benchmark")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
