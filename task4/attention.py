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
from common.operators import function
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
    function(extension(solution), "forward_half" if half else "forward")(q, k, v, out, causal, scale, key_start)
    return out


class _FlashAttention(torch.autograd.Function):
    """The kernels as an autograd function: the forward saves what FlashAttention-2 saves (q, k, v, the output and
    each row's log-sum-exp L, from forward_lse: step 12), and the backward runs kernels/attention_backward.cu
    (steps 13-16), which computes the probabilities again from L, tile by tile."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, solution):
        module = extension(solution)
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
        module.forward_lse(q, k, v, out, lse, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.solution = causal, scale, solution
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        extension(ctx.solution).backward(q, k, v, out, d_out.contiguous(), lse, dq, dk, dv, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None


def flash_attention_trainable(q, k, v, causal: bool = False, scale: float | None = None, solution: bool = False):
    """flash_attention (float32, no padding) that autograd can differentiate through your backward kernels."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _FlashAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale, solution)


class FlashMultiHeadAttention(AttentionLayer):
    """Multi-head attention (common/layer.py) whose core is the fused kernel."""

    def __init__(self, hidden_size: int, num_heads: int, device=None, solution: bool = False):
        super().__init__(hidden_size, num_heads, device=device)
        self.solution = solution

    def split_heads(self, x):
        return super().split_heads(x).contiguous()  # the kernel reads (B, H, S, D) rows

    def attend(self, q, k, v, causal):
        return flash_attention(q, k, v, causal, solution=self.solution)
