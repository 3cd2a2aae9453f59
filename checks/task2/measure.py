"""Task 2's measuring: your chained attention against naive PyTorch and SDPA (imported by checks/task2/test.py).

Reported, not scored: the same distinct input sets for each, after a warm-up, the median of five
requests on the host clock (one request runs every set, so the clock's cost is spread over them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from harness import bench
from harness.checks import exact_float32
from harness.attention_math import naive_attention

TIMING_SHAPE = (4, 32, 1024, 128)  # (batch, heads, seq, head_dim)


def time_attention(worker):
    """Your attention (in the worker) and PyTorch's, over the same distinct input sets, with one clock."""
    b, h, s, d = TIMING_SHAPE
    n = bench.sets_for(4 * b * h * s * d * 4 + b * h * s * s * 4, estimate_ms=4.0, most=8)
    sets = [tuple(torch.randn(b, h, s, d, device="cuda") for _ in range(4)) for _ in range(n)]
    kept = worker.keep("timing sets", sets)
    scale = 1.0 / math.sqrt(d)
    metrics, parts = {}, []
    for causal in (False, True):
        tag = "causal" if causal else "full"
        worker.call("run_batch", kept, causal, scale)  # warm-up
        ours = bench.host_clock(lambda: worker.call("run_batch", kept, causal, scale), reps=5, per_request=n)
        with torch.no_grad(), exact_float32():
            naive = bench.host_clock(lambda: bench.run_here(lambda q, k, v, o: naive_attention(q, k, v, causal), sets),
                                     reps=5, per_request=n)
            sdpa = bench.host_clock(lambda: bench.run_here(
                lambda q, k, v, o: F.scaled_dot_product_attention(q, k, v, is_causal=causal), sets),
                reps=5, per_request=n)
        metrics |= {f"{tag}_ms": ours.median_ms, f"{tag}_naive_ms": naive.median_ms, f"{tag}_sdpa_ms": sdpa.median_ms}
        parts.append(f"{tag}: {ours.median_ms:.2f} ms, naive PyTorch {naive.median_ms:.2f} ms, "
                     f"SDPA {sdpa.median_ms:.2f} ms")
    worker.drop("timing sets")
    return True, f"batch {b} heads {h} seq {s} head_dim {d}: " + "; ".join(parts), metrics
