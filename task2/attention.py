"""Task 2: the Python side of the separate kernels (softmax, GEMM_NT, GEMM_NN, attention).

Given: not graded; edits here are not submitted (you write kernels/attention.cu).

Each function allocates its output when none is given and calls the kernels in
kernels/attention.cu (built on first use; `python -m task2.compile` builds ahead).
Pass solution=True for the reference kernels.
"""

from __future__ import annotations

import math

import torch

from common.build import TaskExtension

# The compiled kernel module: extension() is yours, extension(solution=True) the reference.
extension = TaskExtension(2)


def softmax(x, out=None, solution=False):
    """Row-wise softmax of x (rows, cols)."""
    out = torch.empty_like(x) if out is None else out
    extension(solution).softmax(x, out)
    return out


def gemm_nt(a, b, out=None, solution=False):
    """a (batch, m, k) @ b (batch, n, k)^T -> (batch, m, n)"""
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[1]) if out is None else out
    extension(solution).gemm_nt(a, b, out)
    return out


def gemm_nn(a, b, out=None, solution=False):
    """a (batch, m, k) @ b (batch, k, n) -> (batch, m, n)"""
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[2]) if out is None else out
    extension(solution).gemm_nn(a, b, out)
    return out


def attention(q, k, v, causal=False, scale=None, out=None, solution=False):
    """softmax(scale * q k^T + mask) v from the separate kernels; q (B, H, Sq, D), k and v (B, H, Sk, D)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.empty_like(q) if out is None else out
    extension(solution).attention(q, k, v, out, causal, scale)
    return out
