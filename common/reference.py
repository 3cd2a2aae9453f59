"""Float64 reference attention that every task is checked against.

Shapes follow the handout: per-head tensors are (batch, heads, seq, head_dim).
Causal masking with seq_q != seq_k is aligned to the end: query i sees key j
when j <= i + (seq_k - seq_q), so the last query sees every key (decoding).
"""

from __future__ import annotations

import math

import torch

from common.checks import exact_float32


def causal_mask(seq_q: int, seq_k: int, device=None) -> torch.Tensor:
    """Boolean (seq_q, seq_k) mask, True where a query must NOT see a key."""
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).triu(diagonal=1 + seq_k - seq_q)


def attention_reference(q, k, v, causal: bool = False, scale: float | None = None):
    """softmax(scale * q k^T + mask) v in float64; returns (out, logsumexp) in float64."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    with exact_float32():
        q, k, v = (t.detach().double() for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * scale
        if causal:
            scores = scores.masked_fill(causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
        lse = torch.logsumexp(scores, dim=-1)
        return torch.softmax(scores, dim=-1) @ v, lse
