"""Task 4: the Python side of the fused FlashAttention kernel.

`flash_attention` hands (batch, heads, seq, head_dim) tensors to the CUDA kernel in
kernels/attention.cu (built on first use; `python -m task4.compile` builds it
ahead). `FlashMultiHeadAttention` is a whole layer: projections in PyTorch, the
kernel for attention, the output projection.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from common.build import load_extension
from common.reference import copy_mha_weights
from common.validate import check_hidden, check_qkv

_extensions: dict[bool, object] = {}


def extension(solution: bool = False):
    """The compiled kernel module: yours, or the reference with solution=True."""
    if solution not in _extensions:
        _extensions[solution] = load_extension(4, solution, quiet=True)
    return _extensions[solution]


def flash_attention(q, k, v, causal: bool = False, scale: float | None = None, out=None, solution: bool = False):
    """softmax(scale * q k^T + mask) v in one kernel; q (B, H, Sq, D), k and v (B, H, Sk, D), float32 on CUDA."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.empty_like(q) if out is None else out
    extension(solution).forward(q, k, v, out, causal, scale)
    return out


class FlashMultiHeadAttention(nn.Module):
    """Multi-head attention whose core is the fused kernel; same weights layout as Task 1's layer."""

    def __init__(self, hidden_size: int, num_heads: int, device=None, solution: bool = False):
        super().__init__()
        self.head_dim = check_hidden(hidden_size, num_heads)
        self.hidden_size, self.num_heads, self.solution = hidden_size, num_heads, solution
        make = lambda: nn.Linear(hidden_size, hidden_size, bias=False, device=device)  # noqa: E731
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = make(), make(), make(), make()

    def load_from_torch(self, mha: nn.MultiheadAttention) -> FlashMultiHeadAttention:
        copy_mha_weights(self, mha)
        return self

    def _heads(self, x):
        batch, seq, _ = x.shape  # (B, S, H*D) -> (B, H, S, D), contiguous for the kernel
        return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, query, key, value, causal: bool = False):
        """query (batch, seq_q, hidden); key, value (batch, seq_k, hidden) -> (batch, seq_q, hidden)"""
        check_qkv(query, key, value, dims=3, seq_dim=1, causal=causal, hidden=self.hidden_size)
        q, k, v = self._heads(self.q_proj(query)), self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
        out = flash_attention(q, k, v, causal, solution=self.solution)  # (B, H, Sq, D)
        batch, seq_q = query.shape[:2]
        return self.out_proj(out.transpose(1, 2).reshape(batch, seq_q, self.hidden_size))
