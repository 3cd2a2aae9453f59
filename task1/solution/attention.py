"""Task 1: naive multi-head attention in PyTorch.

Shapes: the layer takes query, key, value of shape (batch, seq, hidden) with
hidden = num_heads * head_dim; inside, each head works on (batch, heads, seq, head_dim).
The functions below are the steps of README, Task 1; `MultiHeadAttention` chains them
inside the layer shell of common/layer.py (projections, input checks).
"""

from __future__ import annotations

import math

import torch

from common.layer import AttentionLayer


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(batch, seq, num_heads * head_dim) -> (batch, num_heads, seq, head_dim)"""
    # BEGIN SOLUTION "step 1: split the heads with view and transpose"
    batch, seq, hidden = x.shape
    return x.view(batch, seq, num_heads, hidden // num_heads).transpose(1, 2)
    # END SOLUTION


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq_q, head_dim), (batch, heads, seq_k, head_dim) -> (batch, heads, seq_q, seq_k)"""
    # BEGIN SOLUTION "step 2: scaled scores q k^T / sqrt(head_dim)"
    return (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    # END SOLUTION


def apply_causal_mask(scores: torch.Tensor) -> torch.Tensor:
    """Hide future keys: query i sees key j only if j <= i + (seq_k - seq_q), aligned to the end."""
    # BEGIN SOLUTION "step 3: causal mask with triu and masked_fill(-inf)"
    seq_q, seq_k = scores.shape[-2:]
    future = torch.ones(seq_q, seq_k, dtype=torch.bool, device=scores.device).triu(diagonal=1 + seq_k - seq_q)
    return scores.masked_fill(future, float("-inf"))
    # END SOLUTION


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v for tensors of shape (batch, heads, seq, head_dim)."""
    scores = attention_scores(q, k)
    if causal:
        scores = apply_causal_mask(scores)
    # BEGIN SOLUTION "step 4: softmax over the keys, then weight the values"
    return torch.softmax(scores, dim=-1) @ v
    # END SOLUTION


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, num_heads, seq, head_dim) -> (batch, seq, num_heads * head_dim)"""
    # BEGIN SOLUTION "step 5: merge the heads back with transpose and reshape"
    batch, heads, seq, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * head_dim)
    # END SOLUTION


class MultiHeadAttention(AttentionLayer):
    """The layer of nn.MultiheadAttention with bias=False, batch_first=True, made of the steps above
    (common/layer.py has the rest)."""

    def split_heads(self, x):
        return split_heads(x, self.num_heads)

    def merge_heads(self, x):
        return merge_heads(x)

    def attend(self, q, k, v, causal):
        return attention(q, k, v, causal)
