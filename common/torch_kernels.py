"""The kernels of tasks 4 and 5 as their bindings define them, in plain PyTorch: what runs on the CPU.

Given code (not graded). Tasks 6 and 7 call three kernels through one small interface, the kernel
set of common/kernel_set.py. On a GPU that is task5/attention.py's `CudaKernels`; on the CPU this
class plays them.
"""

from __future__ import annotations

import math

import torch

from common.kernel_set import hidden_keys


class PyTorchKernels:
    """The three kernels as task 4's and task 5's bindings define them, in plain PyTorch: for the CPU.

    It refuses what the bindings refuse (a write past the cache, a length outside it,
    non-contiguous tensors), so code that works with it asks the CUDA kernels for the same.
    """

    def attention(self, q, k, v, causal: bool, key_start=None, *, window_left=None, softcap=None):
        self._contiguous(q=q, k=k, v=v)
        if window_left is not None and (not causal or isinstance(window_left, bool) or not isinstance(window_left, int)
                                        or window_left < 0):
            raise ValueError(f"window_left must be None or an int >= 0, with causal=True; got {window_left!r} "
                             f"(causal={causal})")
        if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                    or not math.isfinite(softcap) or softcap <= 0):
            raise ValueError(f"softcap must be None or a finite number > 0, got {softcap!r}")
        heads, kv_heads = q.shape[1], k.shape[1]
        if kv_heads < 1 or heads % kv_heads:
            raise ValueError(f"k's heads (kv_heads = {kv_heads}) must divide q's heads ({heads})")
        # Grouped-query attention: query head h reads key/value head h // (heads // kv_heads). A copy per
        # query head is fine here (plain PyTorch on the CPU); the kernels read the shared heads in place.
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if softcap is not None:  # task 4's steps 23-24: after the scale, before any mask
            scores = softcap * torch.tanh(scores / softcap)
        seq_q, seq_k = q.shape[-2], k.shape[-2]
        if key_start is not None and seq_q > seq_k:
            raise ValueError(f"key_start needs seq_q <= seq_k (the queries are the last seq_q positions of the keys), "
                             f"got seq_q = {seq_q} and seq_k = {seq_k}")
        # Left padding: keys before key_start[b] are hidden, and so are the queries at those positions,
        # whose rows are zeros (they see no key).
        first = None if key_start is None else self._key_start(key_start, q.shape[0], seq_k, "seq_k")
        hidden, padded_query = hidden_keys(seq_q, seq_k, causal, first, q.device)
        if window_left is not None:  # query i sees keys i + seq_k - seq_q - window_left .. its own
            hidden = hidden | torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril(
                seq_k - seq_q - window_left - 1)
        scores = scores.masked_fill(hidden, -math.inf)
        if padded_query is None:
            return torch.softmax(scores, dim=-1) @ v
        scores = scores.masked_fill(padded_query, 0.0)  # a finite row, replaced by zeros below
        return (torch.softmax(scores, dim=-1) @ v).masked_fill(padded_query, 0.0)

    def update_cache(self, k_new, v_new, k_cache, v_cache, pos) -> None:
        self._contiguous(k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache)
        n, max_seq = k_new.shape[2], k_cache.shape[2]
        if isinstance(pos, torch.Tensor):  # one position per sequence; one whose rows would not fit writes nothing
            for b, p in enumerate(self._per_sequence(pos, "pos", k_cache.shape[0])):
                if 0 <= p <= max_seq - n:
                    k_cache[b, :, p:p + n], v_cache[b, :, p:p + n] = k_new[b], v_new[b]
            return
        if pos < 0 or pos + n > max_seq:
            raise ValueError(f"update_cache: pos = {pos} with {n} new row(s): pos must be at least 0 and "
                             f"pos + n_new must be at most max_seq = {max_seq}")
        k_cache[:, :, pos:pos + n] = k_new
        v_cache[:, :, pos:pos + n] = v_new

    def decode(self, q, k_cache, v_cache, length, key_start=None):
        self._contiguous(q=q, k_cache=k_cache, v_cache=v_cache)
        if q.shape[2] != 1:
            raise ValueError(f"decode: q must hold one query per (batch, head), got {tuple(q.shape)}")
        max_seq = k_cache.shape[2]
        if isinstance(length, torch.Tensor):  # one length per sequence; out of range: NaN, as the kernel does
            lengths = self._per_sequence(length, "length", q.shape[0])
            starts = [0] * q.shape[0] if key_start is None else self._per_sequence(key_start, "key_start", q.shape[0])
            out = torch.full_like(q, math.nan)
            for b, (end, first) in enumerate(zip(lengths, starts)):
                if 0 <= first < end <= max_seq:
                    k, v = (c[b:b + 1, :, first:end].contiguous() for c in (k_cache, v_cache))
                    out[b:b + 1] = self.attention(q[b:b + 1], k, v, False)
            return out
        if not 1 <= length <= max_seq:
            raise ValueError(f"decode: length must be between 1 and max_seq = {max_seq}, got {length}")
        if key_start is not None:  # the newest position is the query's own: never padding
            self._key_start(key_start, q.shape[0], length - 1, "length - 1")
        return self.attention(q, k_cache[:, :, :length].contiguous(), v_cache[:, :, :length].contiguous(), False,
                              key_start)

    @staticmethod
    def _per_sequence(t, name: str, batch: int) -> list[int]:
        """pos or length as the bindings take a tensor of them: int32, (batch,); its values."""
        if t.dtype != torch.int32 or tuple(t.shape) != (batch,):
            raise ValueError(f"{name} must be an int or int32 of shape ({batch},), got {t.dtype} of shape "
                             f"{tuple(t.shape)}")
        return t.tolist()

    @staticmethod
    def _key_start(key_start, batch: int, most: int, most_what: str):
        """key_start as the bindings take it: int32, (batch,), values between 0 and `most`."""
        if key_start.dtype != torch.int32 or tuple(key_start.shape) != (batch,):
            raise ValueError(f"key_start must be int32 of shape ({batch},), got {key_start.dtype} of shape "
                             f"{tuple(key_start.shape)}")
        if batch and not (int(key_start.min()) >= 0 and int(key_start.max()) <= most):
            raise ValueError(f"key_start must hold values between 0 and {most_what} = {most}, got "
                             f"{key_start.tolist()}")
        return key_start.long()

    @staticmethod
    def _contiguous(**tensors):
        for name, t in tensors.items():
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous (the kernels read raw rows), got strides {t.stride()}")
