"""The multi-head attention layer every task shares, with a slot for the attention core.

Given code (not graded). A layer is `torch.nn.MultiheadAttention(bias=False, batch_first=True)`:
four bias-free projections, the heads split, an attention core on
(batch, heads, seq, head_dim), the heads merged, the output projection. Each task plugs its
attention into `attend` (task 1: PyTorch; task 4: the fused kernel; tasks 5 and 6 add a KV
cache), and task 1 also writes the head split and merge.
"""

from __future__ import annotations

import torch
from torch import nn

from common.validate import check_hidden, check_qkv


class AttentionLayer(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, device=None, dtype=None):
        super().__init__()
        self.head_dim = check_hidden(hidden_size, num_heads)
        self.hidden_size, self.num_heads = hidden_size, num_heads
        make = lambda: nn.Linear(hidden_size, hidden_size, bias=False, device=device, dtype=dtype)  # noqa: E731
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = make(), make(), make(), make()

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)"""
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, heads, seq, head_dim) -> (batch, seq, heads * head_dim)"""
        batch, heads, seq, head_dim = x.shape
        return x.transpose(1, 2).reshape(batch, seq, heads * head_dim)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        """The attention core on (batch, heads, seq, head_dim): each task's slot."""
        raise NotImplementedError(f"{type(self).__name__} has no attention core (override attend)")

    def forward(self, query, key, value, causal: bool = False) -> torch.Tensor:
        """query (batch, seq_q, hidden); key, value (batch, seq_k, hidden) -> (batch, seq_q, hidden)"""
        check_qkv(query, key, value, dims=3, seq_dim=1, causal=causal, hidden=self.hidden_size)
        q = self.split_heads(self.q_proj(query))
        k = self.split_heads(self.k_proj(key))
        v = self.split_heads(self.v_proj(value))
        return self.out_proj(self.merge_heads(self.attend(q, k, v, causal)))

    @torch.no_grad()
    def load_weights(self, w_q, w_k, w_v, w_out) -> AttentionLayer:
        """Each (hidden, hidden), as nn.Linear keeps them (out_features, in_features)."""
        for linear, w in zip((self.q_proj, self.k_proj, self.v_proj, self.out_proj), (w_q, w_k, w_v, w_out)):
            linear.weight.copy_(w)
        return self

    def load_from_torch(self, mha: nn.MultiheadAttention) -> AttentionLayer:
        """Copy the weights of a bias-free nn.MultiheadAttention, so both compute the same function."""
        return self.load_weights(*mha_weights(mha))


def mha_weights(mha: nn.MultiheadAttention) -> tuple[torch.Tensor, ...]:
    """(w_q, w_k, w_v, w_out) of a bias-free nn.MultiheadAttention."""
    return (*mha.in_proj_weight.detach().chunk(3), mha.out_proj.weight.detach())
