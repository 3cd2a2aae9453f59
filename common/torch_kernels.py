"""The kernels of tasks 4 and 5 as their bindings define them, in plain PyTorch: what runs on the CPU.

Given code (not graded). Tasks 6 and 7 call three kernels through one small interface:
`attention(q, k, v, causal)` (task 4), `update_cache(k_new, v_new, k_cache, v_cache, pos)`
and `decode(q, k_cache, v_cache, length)` (task 5), all with the scale 1/sqrt(head_dim).
On a GPU that is task5/attention.py's `CudaKernels`; on the CPU this class plays them.
"""

from __future__ import annotations

import math

import torch


class PyTorchKernels:
    """The three kernels as task 4's and task 5's bindings define them, in plain PyTorch: for the CPU.

    It refuses what the bindings refuse (a write past the cache, a length outside it,
    non-contiguous tensors), so code that works with it asks the CUDA kernels for the same.
    """

    def attention(self, q, k, v, causal: bool):
        self._contiguous(q=q, k=k, v=v)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if causal:
            seq_q, seq_k = q.shape[-2], k.shape[-2]
            future = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).triu(seq_k - seq_q + 1)
            scores = scores.masked_fill(future, -math.inf)
        return torch.softmax(scores, dim=-1) @ v

    def update_cache(self, k_new, v_new, k_cache, v_cache, pos: int) -> None:
        self._contiguous(k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache)
        n, max_seq = k_new.shape[2], k_cache.shape[2]
        if pos < 0 or pos + n > max_seq:
            raise ValueError(f"update_cache: pos = {pos} with {n} new row(s): pos must be at least 0 and "
                             f"pos + n_new must be at most max_seq = {max_seq}")
        k_cache[:, :, pos:pos + n] = k_new
        v_cache[:, :, pos:pos + n] = v_new

    def decode(self, q, k_cache, v_cache, length: int):
        self._contiguous(q=q, k_cache=k_cache, v_cache=v_cache)
        if q.shape[2] != 1:
            raise ValueError(f"decode: q must hold one query per (batch, head), got {tuple(q.shape)}")
        if not 1 <= length <= k_cache.shape[2]:
            raise ValueError(f"decode: length must be between 1 and max_seq = {k_cache.shape[2]}, got {length}")
        return self.attention(q, k_cache[:, :, :length].contiguous(), v_cache[:, :, :length].contiguous(), False)

    @staticmethod
    def _contiguous(**tensors):
        for name, t in tensors.items():
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous (the kernels read raw rows), got strides {t.stride()}")
