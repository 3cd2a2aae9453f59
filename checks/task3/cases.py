"""What task 3's checks share (checks/task3/test.py and masks.py): the tolerance, the inputs, the reading of what a
forward pass saved, and the CPU-time ratio the skip checks measure."""

from __future__ import annotations

import statistics

import torch

from harness.checks import random_tensor

ATOL, RTOL = 2e-5, 1e-4
BACKWARD_CALL_TIMEOUT_S = 60  # a call of the backward part: small cases, so a hang costs a minute, not five


def inputs(shape, seed, dtype=torch.float32):
    batch, heads, seq_q, seq_k, d = shape[:5]
    return (random_tensor((batch, heads, seq_q, d), seed, dtype=dtype),
            random_tensor((batch, heads, seq_k, d), seed + 1, dtype=dtype),
            random_tensor((batch, heads, seq_k, d), seed + 2, dtype=dtype))


def saved_wrong(saved, q_shape, k_shape) -> str | None:
    """What is wrong with what the forward pass saved (the worker's description of ctx), or None.

    Exactly q, k, v, the output and one (batch, heads, seq_q) tensor, the log-sum-exp, with
    ctx.save_for_backward; no other tensor on ctx (P, or the scores, kept aside).
    """
    if not (isinstance(saved, tuple) and len(saved) == 2 and all(isinstance(x, list) for x in saved)):
        return "the forward pass's saved tensors could not be read"
    tensors, others = saved
    if others:
        kept = ", ".join(f"ctx.{name} {tuple(shape)}" for name, shape in others[:3])
        return (f"the forward pass keeps tensors on ctx besides ctx.save_for_backward: {kept}; save q, k, v, the "
                f"output and the log-sum-exp with ctx.save_for_backward, nothing else")
    expected = sorted([tuple(q_shape), tuple(k_shape), tuple(k_shape), tuple(q_shape), tuple(q_shape[:3])])
    if sorted(tuple(s) for s in tensors) != expected:
        return (f"the forward pass saved tensors of shapes {[tuple(s) for s in tensors]}; expected q, k, v, the output "
                f"and the log-sum-exp: {expected} in any order (never P: the backward pass computes it again)")
    return None


# The causal-skip check measures pairs of requests, a full run and a causal one back to back (in turn first),
# each request SKIP_CHECK_RUNS runs, and takes the median of the pairs' ratios. One run is about 0.1 s of CPU
# (10 ticks of the clock /proc counts in), and a machine's load changes the CPU time a run takes: on 2 loaded
# cores, the smallest of three single runs each gave ratios of 38-76% over 25 checks, near the 80% that fails
# it; the median of five pairs of two runs gave 53-65% over 20 (about 2 s of CPU per check).
SKIP_CHECK_RUNS, SKIP_CHECK_PAIRS = 2, 5


def causal_cpu_ratio(cpu_seconds) -> tuple[float, float, float]:
    """The median over SKIP_CHECK_PAIRS pairs of cpu_seconds(True) / cpu_seconds(False), and each one's median."""
    pairs = []
    for i in range(SKIP_CHECK_PAIRS):
        spent = {causal: cpu_seconds(causal) for causal in ((False, True) if i % 2 == 0 else (True, False))}
        pairs.append((spent[True], spent[False]))
    return (statistics.median(causal / max(full, 1e-9) for causal, full in pairs),
            statistics.median(c for c, _ in pairs), statistics.median(f for _, f in pairs))


