"""Diagnoses of the backward pass's common mistakes (task 4's steps 13-16), tried when a gradient fails its check.

As harness/diagnose.py does for the forward pass: each mistake is the float64 gradients computed wrong in one
place, written out as the kernels compute them (P = softmax(scale Q K^T + mask), dV = P^T dO, dP = dO V^T,
D = rowsum(dO * O), dS = P (dP - D), dK = scale dS^T Q, dQ = scale dS K; the query heads of a group add up into
their key/value head's dK and dV). A failed gradient is compared with each mistake that can show in it; the first
it matches is said, with its step. A correct submission never pays for this: it runs only after a check failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.attention_math import causal_mask, expand_kv_heads
from harness.checks import CheckResult, compare


@dataclass(frozen=True)
class GradientMistake:
    says: str  # what the gradient looks like, after "looks like "
    grad: str  # "dq", "dk" or "dv": the gradient it shows in
    step: int  # task 4's README step where it is made
    how: str  # the one thing done wrong (gradients_with)
    needs: str = ""  # "causal" or "grouped": it shows only there


MISTAKES = [
    GradientMistake("dS without D (dS = P dP: the D = rowsum(dO * O) term left out of dK)", "dk", 15, "no D"),
    GradientMistake("dS without D (dS = P dP: the D = rowsum(dO * O) term left out of dQ, or D never computed "
                    "by its kernel, when dK fails so too)", "dq", 16, "no D"),
    GradientMistake("dS without P (dS = dP - D where P (dP - D) is meant) in dK", "dk", 15, "no P"),
    GradientMistake("dS without P (dS = dP - D where P (dP - D) is meant) in dQ", "dq", 16, "no P"),
    GradientMistake("dK without its scale (write scale * dK at the end)", "dk", 15, "dk unscaled"),
    GradientMistake("dQ without its scale (write scale * dQ at the end)", "dq", 16, "dq unscaled"),
    GradientMistake("dK of one query head of each group alone: the heads that share a key/value head not summed",
                    "dk", 14, "one head", "grouped"),
    GradientMistake("dV of one query head of each group alone: the heads that share a key/value head not summed",
                    "dv", 14, "one head", "grouped"),
    GradientMistake("dK of no query tile at all (the first query tile past the last: first_query = seq_q?)", "dk",
                    14, "no queries"),
    GradientMistake("dV of no query tile at all (the first query tile past the last: first_query = seq_q?)", "dv",
                    14, "no queries"),
    GradientMistake("dK with the causal skip a query tile late (the first tile that sees a block's keys skipped)",
                    "dk", 14, "late", "causal"),
    # where dQ is added up by the dK/dV kernel (the 16-bit part, steps 28-30: dq_with_dk), its walk shows in dQ too,
    # and dQ is checked first; with a dQ kernel of its own (steps 13-16) these dQ are right, and name nothing
    GradientMistake("dQ of one query head of each group alone: the key blocks do not walk the group's other heads",
                    "dq", 14, "one head", "grouped"),
    GradientMistake("dQ of no query tile at all (the first query tile past the last)", "dq", 14, "no queries"),
    GradientMistake("dQ with the causal skip a query tile late (the first tile that sees a block's keys skipped)",
                    "dq", 14, "late", "causal"),
    GradientMistake("dV with the causal skip a query tile late (the first tile that sees a block's keys skipped)",
                    "dv", 14, "late", "causal"),
]


def gradients_with(q, k, v, d_out, causal: bool, scale: float, how: str = "", tiles=(64, 64), head: int = 0,
                   dq_with_dk: bool = False):
    """(dq, dk, dv) in float64 with one mistake (`how`, GradientMistake.how; "" for none). tiles: the backward's
    (BLOCK_ROWS, BLOCK_COLS), for the pairs its kernels visit ("late", "no P"); head: which head of a group
    "one head" keeps (0, the first, or -1, the last). dq_with_dk: dQ is added up by the dK/dV kernel (the 16-bit
    part), so it visits that kernel's pairs, and a walk that leaves some out leaves them out of dQ too."""
    heads, kv_heads = q.shape[-3], k.shape[-3]
    q, k, v, d_out = (t.detach().to("cpu", torch.float64) for t in (q, k, v, d_out))
    k_all, v_all = expand_kv_heads(k, heads), expand_kv_heads(v, heads)
    scores = (q @ k_all.transpose(-2, -1)) * scale
    if causal:
        scores = scores.masked_fill(causal_mask(q.shape[-2], k.shape[-2]), -math.inf)
    p = torch.softmax(scores, dim=-1)
    d_p = d_out @ v_all.transpose(-2, -1)
    delta = 0.0 if how == "no D" else (d_out * (p @ v_all)).sum(dim=-1, keepdim=True)
    d_s = p * (d_p - delta)
    d_s_for_q = d_s
    if how == "no P":  # dP - D on every pair a kernel visits: masked pairs of the tiles it computes count too
        seq_q, seq_k = q.shape[-2], k.shape[-2]
        d_s = (d_p - delta).masked_fill(~_visited(seq_q, seq_k, causal, *tiles, "dk"), 0.0)
        d_s_for_q = (d_p - delta).masked_fill(~_visited(seq_q, seq_k, causal, *tiles, "dk" if dq_with_dk else "dq"),
                                              0.0)
    kept = p, d_s
    if how == "late":  # the first query tile that sees each key block's keys: left out of dK and dV
        kept = tuple(t.masked_fill(_skipped_late(q.shape[-2], k.shape[-2], *tiles), 0.0) for t in kept)
    if how == "no queries":
        kept = tuple(torch.zeros_like(t) for t in kept)
    if dq_with_dk and how in ("late", "no queries"):
        d_s_for_q = kept[1]
    d_q = (1.0 if how == "dq unscaled" else scale) * d_s_for_q @ k_all
    if dq_with_dk and how == "one head":  # the heads of a group past the first (or before the last) never walked
        group = heads // kv_heads
        walked = torch.zeros(group, dtype=torch.bool)
        walked[head] = True
        d_q = d_q * walked.repeat(kv_heads).view(1, heads, 1, 1)
    d_v = kept[0].transpose(-2, -1) @ d_out
    d_k = (1.0 if how == "dk unscaled" else scale) * kept[1].transpose(-2, -1) @ q
    group = heads // kv_heads

    def per_kv_head(t):  # (batch, heads, seq_k, d) -> (batch, kv_heads, seq_k, d)
        t = t.unflatten(-3, (kv_heads, group))
        return t[..., head, :, :] if how == "one head" else t.sum(dim=-3)
    return d_q, per_kv_head(d_k), per_kv_head(d_v)


def _visited(seq_q: int, seq_k: int, causal: bool, block_rows: int, block_cols: int, kernel: str) -> torch.Tensor:
    """(seq_q, seq_k): the (query, key) pairs the reference's kernels compute, masked ones of a tile that crosses the
    diagonal included. "dk": a block of block_rows keys walks the query tiles (block_cols) from the first that sees
    them; "dq": a block of block_rows queries walks the key tiles (block_cols) up to its last query's diagonal."""
    i, j = torch.arange(seq_q)[:, None], torch.arange(seq_k)[None, :]
    if not causal:
        return torch.ones(seq_q, seq_k, dtype=torch.bool)
    offset = seq_k - seq_q
    if kernel == "dk":
        return i >= (j // block_rows * block_rows - offset).clamp_min(0) // block_cols * block_cols
    last = (torch.minimum(i // block_rows * block_rows + block_rows, torch.tensor(seq_q)) + offset).clamp_max(seq_k)
    return j // block_cols * block_cols < last


def _skipped_late(seq_q: int, seq_k: int, block_rows: int, block_cols: int) -> torch.Tensor:
    """(seq_q, seq_k): the (query, key) pairs a causal dK/dV kernel leaves out when each key block starts its
    query tiles one tile after the first that sees its keys."""
    offset = seq_k - seq_q
    key_block_start = torch.arange(seq_k) // block_rows * block_rows
    first = (key_block_start - offset).clamp_min(0) // block_cols * block_cols  # the right first tile
    return torch.arange(seq_q)[:, None] < (first + block_cols)[None, :]


def diagnose_gradient(result: CheckResult, name: str, got, q, k, v, d_out, causal: bool, scale: float, *,
                      atol: float, rtol: float, tiles=(64, 64), steps: dict[int, int] | None = None,
                      dq_with_dk: bool = False) -> CheckResult:
    """`result`, a failed comparison of the gradient `name` ("dq", "dk" or "dv") with float64, with the first
    mistake it matches said in front ("looks like ...: see README, Task 4, step N."). tiles: the student's
    (BLOCK_ROWS, BLOCK_COLS). steps: where another part makes each mistake, by float32's step (the 16-bit
    backward's, steps 28-30); dq_with_dk: as gradients_with's."""
    if result.passed or result.untouched or not isinstance(got, torch.Tensor):
        return result
    grouped = q.shape[-3] != k.shape[-3]
    which = "dq dk dv".split().index(name)
    right = gradients_with(q, k, v, d_out, causal, scale, "", tiles, dq_with_dk=dq_with_dk)[which]
    size = float(right.abs().max())
    for mistake in MISTAKES:
        if mistake.grad != name or (mistake.needs == "causal" and not causal) or (
                mistake.needs == "grouped" and not grouped):
            continue
        for head in (0, -1) if mistake.how == "one head" else (0,):
            wrong = gradients_with(q, k, v, d_out, causal, scale, mistake.how, tiles, head, dq_with_dk)[which]
            # a mistake that does not show on these inputs (its gradient within twice the tolerance of the right
            # one) names nothing: an output that only just misses the tolerance would match it too
            if compare(wrong, right, atol=2 * atol, rtol=2 * rtol).passed:
                continue
            # a mistake that makes the gradient larger makes its rounding larger too (in 16 bits dS is rounded
            # before its product): got is held to it at the tolerance's share of its size, as to the right one
            scaled = atol * max(1.0, float(wrong.abs().max()) / size) if size > 0 else atol
            if compare(got, wrong, atol=scaled, rtol=rtol).passed:
                step = (steps or {}).get(mistake.step, mistake.step)
                result.message = f"looks like {mistake.says}: see README, Task 4, step {step}. {result.message}"
                return result
    return result
