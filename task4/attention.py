"""Task 4: the Python side of the fused FlashAttention kernel.

Given: not graded; edits here are not submitted (you write kernels/attention.cu).

`flash_attention` hands (batch, heads, seq, head_dim) tensors to the CUDA kernel in
kernels/attention.cu (built on first use; `python -m task4.compile` builds it
ahead). `FlashMultiHeadAttention` is a whole layer: projections in PyTorch, the
kernel for attention, the output projection.
"""

from __future__ import annotations

import math

import torch

from common.build import TaskExtension
from common.layer import AttentionLayer

# The compiled kernel module: extension() is yours, extension(solution=True) the reference.
extension = TaskExtension(4)


def flash_attention(q, k, v, causal: bool = False, scale: float | None = None, out=None, solution: bool = False,
                    key_start=None):
    """softmax(scale * q k^T + mask) v in one kernel; q (B, H, Sq, D), k and v (B, KVH, Sk, D), float32 on CUDA,
    or all bfloat16 or all float16 (the tensor-core kernel of kernels/attention_half.cu, steps 8-11).

    KVH may be any divisor of H (grouped-query attention: query head h reads key/value head h // (H // KVH)).
    key_start, int32 (B,) on the GPU: each sequence's first valid key (a batch padded on the left); the
    queries before it are padding, and their rows of the output are zeros."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.empty_like(q) if out is None else out
    half = q.dtype in (torch.bfloat16, torch.float16)
    (extension(solution).forward_half if half else extension(solution).forward)(q, k, v, out, causal, scale, key_start)
    return out


class FlashMultiHeadAttention(AttentionLayer):
    """Multi-head attention (common/layer.py) whose core is the fused kernel."""

    def __init__(self, hidden_size: int, num_heads: int, device=None, solution: bool = False):
        super().__init__(hidden_size, num_heads, device=device)
        self.solution = solution

    def split_heads(self, x):
        return super().split_heads(x).contiguous()  # the kernel reads (B, H, S, D) rows

    def attend(self, q, k, v, causal):
        return flash_attention(q, k, v, causal, solution=self.solution)
