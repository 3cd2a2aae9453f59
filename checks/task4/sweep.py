"""python -m task4.test --sweep: Task 4's kernel, naive PyTorch and SDPA over seq 128..8192.

Runs once every check passes, with the same timing as the benchmarks (harness/bench.py):
32 heads, head_dim 128, batch 16384 / seq, causal and not. Writes task4-sweep.csv, and
task4-sweep.png when matplotlib is installed.
"""

from __future__ import annotations

import csv

import torch

from harness.attention_math import attention_flops
from checks.task4.measure import TimedCase, run_benchmarks

SEQS = (128, 256, 512, 1024, 2048, 4096, 8192)
TOKENS, HEADS, HEAD_DIM = 16384, 32, 128  # batch x seq is TOKENS at every length


def sweep(report, worker, path="task4-sweep.csv", with_tensor_cores=False):
    cases = []
    for seq in SEQS:
        batch = max(1, TOKENS // seq)
        for causal in (False, True):
            cases.append(TimedCase(f"sweep seq {seq} batch {batch}{' causal' if causal else ''}", batch, HEADS, seq,
                                   HEAD_DIM, causal))
    run_benchmarks(report, worker, cases, [], with_tensor_cores=with_tensor_cores)
    rows = []
    for timed, case in zip(cases, [c for c in report.cases if c.name.startswith("sweep")]):
        m = case.metrics
        rows.append({"seq": timed.seq, "batch": timed.batch, "heads": timed.heads, "head_dim": timed.head_dim,
                     "causal": timed.causal,
                     "kernel_correct": case.passed, "kernel_ms": m.get("kernel_ms"), "naive_ms": m.get("naive_ms"),
                     "sdpa_ms": m.get("sdpa_ms"), "kernel_tflops": m.get("tflops")})
        if with_tensor_cores:
            rows[-1]["tensor_core_reference_ms"] = m.get("tensor_core_reference_ms")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
    plot_sweep(rows, path)


def plot_sweep(rows, path):
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
