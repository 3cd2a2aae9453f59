"""Task 4's stand-in kernels: the fused attention (float32, bf16/fp16) and its backward pass."""

from __future__ import annotations

import math

import torch


from harness.attention_math import attention_gradients, expand_kv_heads, masked_scores
from harness.diagnose_backward import gradients_with
from harness.diagnose_masks import gradients_with_cap_slope
from tests.stand_in.gpu import launched
from tests.stand_in.kernels import (Hang, StandInKernels, attention_in_torch, attention_seconds, check_cuda_float32,
                                    check_dim, check_finite, check_key_start, check_no_overlap, with_padding)


class Task4Kernels(StandInKernels):
    """task4/binding.cpp's `forward`, computed in PyTorch."""

    @launched
    def forward(self, q, k, v, out, causal, scale, key_start=None):
        self._forward(q, k, v, out, causal, scale, key_start, check_cuda_float32)

    @launched
    def forward_half(self, q, k, v, out, causal, scale, key_start=None):
        """The bf16/fp16 kernel: the same checks for one 16-bit type, computed in float32, written in that type."""
        self._forward_16bit(q, k, v, out, causal, scale, key_start, "forward_half", self.behaviour.half)

    @launched
    def forward_hopper(self, q, k, v, out, causal, scale, key_start=None):
        """The Hopper kernel (steps 17-22): forward_half's checks and result; behaviour.hopper as .half."""
        self._forward_16bit(q, k, v, out, causal, scale, key_start, "forward_hopper", self.behaviour.hopper)

    @staticmethod
    def _same_type_as(q, function):
        """The binding's check of a 16-bit kernel's tensors: q bf16 or fp16, and each tensor given of q's type."""
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise RuntimeError(f"q must be bfloat16 or float16 for {function}, got {str(q.dtype)[6:]} "
                               "(float32 goes to forward)")

        def same_type(t, name):
            if getattr(t, "on_host", False):
                raise RuntimeError(f"{name} must be a CUDA tensor, got one on cpu (move it with .cuda())")
            if t.dtype != q.dtype:
                raise RuntimeError(f"{name} must be {str(q.dtype)[6:]} like q, got {str(t.dtype)[6:]}")
            if not t.is_contiguous():
                raise RuntimeError(f"{name} must be contiguous (call .contiguous() first)")
        return same_type

    def _forward_16bit(self, q, k, v, out, causal, scale, key_start, function, behaviour):
        if behaviour == "trap":  # a kernel that traps: CUDA's words, and the process's context gone with it
            raise RuntimeError("CUDA error: unspecified launch failure")
        if behaviour == "hang":
            raise Hang()
        same_type = self._same_type_as(q, function)
        kept = out.clone() if behaviour == "unwritten" else None
        self._forward(q, k, v, out, causal, scale, key_start, same_type)
        if behaviour == "wrong":
            out.mul_(1.01)
        elif kept is not None:
            out.copy_(kept)

    def _forward(self, q, k, v, out, causal, scale, key_start, check_type):
        check_type(q, "q")
        for t, name in ((q, "q"), (k, "k"), (v, "v"), (out, "out")):
            check_dim(t, name, 4)
        batch, heads, seq_q, head_dim = q.shape
        kv_heads = k.shape[1]
        if k.shape[0] != batch or k.shape[3] != head_dim:
            raise RuntimeError(f"k must be (batch, kv_heads, seq_k, head_dim) with q's batch and head_dim "
                               f"(q is {list(q.shape)}), got {list(k.shape)}")
        if heads and (kv_heads < 1 or heads % kv_heads):
            raise RuntimeError(f"k's heads (kv_heads = k.size(1)) must divide q's heads: each group of heads / "
                               f"kv_heads query heads shares one key/value head; got heads = {heads} and "
                               f"kv_heads = {kv_heads}")
        if v.shape != k.shape:
            raise RuntimeError(f"v must have k's shape {list(k.shape)}, got {list(v.shape)}")
        if out.shape != q.shape:
            raise RuntimeError(f"out must have q's shape {list(q.shape)}, got {list(out.shape)}")
        if not 1 <= head_dim <= self.max_head_dim():
            raise RuntimeError(f"head_dim must be at most {self.max_head_dim()}, got {head_dim}")
        if causal and seq_q > k.shape[2]:
            raise RuntimeError(f"causal attention needs seq_q <= seq_k, got seq_q = {seq_q} and seq_k = {k.shape[2]}")
        check_finite(scale)
        for t, name in ((k, "k"), (v, "v"), (out, "out")):
            check_type(t, name)
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            check_no_overlap(out, "out", t, name)
        if key_start is not None and seq_q > k.shape[2]:
            raise RuntimeError(f"key_start needs seq_q <= seq_k (the queries are the last seq_q positions of the "
                               f"keys), got seq_q = {seq_q} and seq_k = {k.shape[2]}")
        check_key_start(key_start, batch, k.shape[2], "seq_k")
        if not heads:
            return
        q, k, v = q.float(), expand_kv_heads(k, heads).float(), expand_kv_heads(v, heads).float()
        with self.work(attention_seconds(q, k, causal)):
            self.write(out, with_padding(lambda *qkv: attention_in_torch(*qkv, causal, self.applied(scale)), q, k, v,
                                         key_start))

    @launched
    def forward_masks(self, q, k, v, out, causal, scale, key_start=None, window_left=None, softcap=None,
                      cu_seqlens=None):
        """Steps 23-24 (float32), and step 25 (bf16/fp16: the Hopper kernel's, behaviour.hopper as forward_hopper's
        too): the binding's checks of the masks, then the masked attention in float32, row by row of the scores, written
        in q's type (behaviour.masks: "unwritten", or "window_wide", in either type)."""
        if q.dtype in (torch.bfloat16, torch.float16):
            self._forward_16bit(q, k, v, out.clone(), causal, scale, key_start, "forward_masks", self.behaviour.hopper)
        else:
            self._forward(q, k, v, out.clone(), causal, scale, key_start, check_cuda_float32)
        if window_left is not None and window_left < 0:
            raise RuntimeError(f"window_left must be None or >= 0 (the keys a query sees before its own), got "
                               f"{window_left}")
        if window_left is not None and not causal:
            raise RuntimeError("window_left needs causal=True: the window is the window_left keys before a query's "
                               "own position, and the query's own")
        if softcap is not None and not 1e-30 <= softcap <= 1e30:
            raise RuntimeError(f"softcap must be None or a finite number > 0 (from 1e-30 to 1e30: the kernel holds it "
                               f"as a float32), got {softcap}")
        seq_q, seq_k = q.shape[2], k.shape[2]
        if cu_seqlens is not None:
            if getattr(cu_seqlens, "on_host", False) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
                raise RuntimeError(f"cu_seqlens must be a contiguous 1-D int32 CUDA tensor, got {list(cu_seqlens.shape)}"
                                   f" {str(cu_seqlens.dtype)[6:]}")
            if seq_q != seq_k:
                raise RuntimeError(f"cu_seqlens packs documents into one sequence of queries and keys: it needs seq_q "
                                   f"== seq_k, got {seq_q} and {seq_k}")
            ends = cu_seqlens.tolist()
            if len(ends) < 2 or ends[0] != 0 or ends[-1] != seq_k or any(a >= b for a, b in zip(ends, ends[1:])):
                raise RuntimeError(f"cu_seqlens must rise from 0 to the sequence length {seq_k}, got {ends}")
        starts = key_start.tolist() if key_start is not None else [0] * q.shape[0]
        if self.behaviour.masks == "unwritten":  # the skeleton: the given lines zero the padded queries, then return
            for b, first in enumerate(starts):
                out[b, :, :min(seq_q, max(0, first - (seq_k - seq_q)))] = 0.0
            return
        if not q.shape[1]:
            return
        wide = 1 if self.behaviour.masks == "window_wide" else 0
        rows, keys = torch.arange(seq_q)[:, None] + (seq_k - seq_q), torch.arange(seq_k)[None, :]
        hidden = keys > rows if causal else torch.zeros(seq_q, seq_k, dtype=torch.bool)
        if window_left is not None:
            hidden |= keys < rows - window_left - wide
        if cu_seqlens is not None:
            ids = torch.bucketize(torch.arange(seq_k), cu_seqlens.cpu()[1:], right=True)
            hidden |= ids[:, None] != ids[None, :]
        heads = q.shape[1]
        scores = (q.float() @ expand_kv_heads(k, heads).float().transpose(-2, -1)) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        result = torch.zeros_like(out, dtype=torch.float32)
        for b, first in enumerate(starts):
            seen = ~hidden & (keys >= first)
            live = rows[:, 0] >= first  # a query before its sequence's first key is padding: zeros
            weights = torch.softmax(scores[b].masked_fill(~seen, -math.inf), dim=-1)
            result[b][:, live] = (weights @ expand_kv_heads(v, heads)[b].float())[:, live]
        with self.work(attention_seconds(q, k, causal)):
            self.write(out, result)
        if self.behaviour.hopper == "wrong" and q.dtype != torch.float32:
            out.mul_(1.01)

    @launched
    def forward_lse(self, q, k, v, out, lse, causal, scale, window_left=None, softcap=None, cu_seqlens=None):
        """Step 12: forward without padding, and each row's log-sum-exp; with the masks (step 26), forward_masks's
        output and their log-sum-exp; in bf16/fp16 (step 27), forward_half's output and the log-sum-exp in float32."""
        half = q.dtype in (torch.bfloat16, torch.float16)
        self._forward(q, k, v, out, causal, scale, None,
                      self._same_type_as(q, "forward_lse") if half else check_cuda_float32)
        self._check_lse(lse, q, {"q": q, "k": k, "v": v, "out": out})
        masks = dict(window_left=window_left, softcap=softcap, cu_seqlens=cu_seqlens)
        if half:
            self._no_16_bit_masks(masks)
            if self.behaviour.backward_half != "lse unwritten":
                lse.copy_(torch.logsumexp(masked_scores(q.float(), expand_kv_heads(k, q.shape[1]).float(), causal,
                                                        scale), dim=-1))
            return
        if any(m is not None for m in masks.values()):
            self.forward_masks(q, k, v, out, causal, scale, None, **masks)
        scores = masked_scores(q, expand_kv_heads(k, q.shape[1]), causal, scale, **self._plain_masks(**masks))
        lse.copy_(torch.logsumexp(scores, dim=-1))

    @staticmethod
    def _plain_masks(window_left, softcap, cu_seqlens):
        return dict(window_left=window_left, softcap=softcap,
                    documents=None if cu_seqlens is None else cu_seqlens.tolist())

    @launched
    def backward(self, q, k, v, out, dout, lse, dq, dk, dv, causal, scale, window_left=None, softcap=None,
                 cu_seqlens=None):
        """Steps 13-16: the binding's checks, then the gradients written out in float64 (`gradients_with`; they
        do not depend on out and lse, given that they are the forward's). With the masks (step 26): float64
        autograd under them (behaviour.backward "no cap slope": dS not taken back through the cap; "masks unwritten":
        the skeleton's step 26)."""
        half = q.dtype in (torch.bfloat16, torch.float16)
        check_type = self._same_type_as(q, "backward") if half else check_cuda_float32
        self._forward(q, k, v, out.clone(), causal, scale, None, check_type)  # q, k, v, out checked alike
        self._check_lse(lse, q, {})
        for t, name, model, model_name in ((dout, "dout", q, "q"), (dq, "dq", q, "q"), (dk, "dk", k, "k"),
                                           (dv, "dv", k, "k")):
            check_type(t, name)
            if t.shape != model.shape:
                raise RuntimeError(f"{name} must have {model_name}'s shape {list(model.shape)}, got {list(t.shape)}")
        outputs = {"dq": dq, "dk": dk, "dv": dv}
        for o_name, o in outputs.items():
            for name, t in {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse, **outputs}.items():
                if name != o_name:
                    check_no_overlap(o, o_name, t, name)
        behaviour = self.behaviour.backward_half if half else self.behaviour.backward
        kept = dk.clone() if behaviour == "unwritten" else None
        if half:
            self._no_16_bit_masks(dict(window_left=window_left, softcap=softcap, cu_seqlens=cu_seqlens))
        masks = self._plain_masks(window_left, softcap, cu_seqlens)
        if any(m is not None for m in masks.values()):
            if self.behaviour.backward == "masks unwritten":  # the skeleton's step 26: dK, dV zeros, dQ unwritten
                dk.zero_()
                dv.zero_()
                return
            slope = (lambda cap, c: torch.ones_like(cap)) if self.behaviour.backward == "no cap slope" \
                else (lambda cap, c: 1 - (cap / c) ** 2)
            grads = (gradients_with_cap_slope(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), causal, scale,
                                              masks["window_left"], masks["documents"], softcap, slope) if softcap
                     else attention_gradients(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), causal, scale, **masks))
            for got, grad in zip((dq, dk, dv), grads):
                got.copy_(grad)
            return
        with self.work(2.5 * attention_seconds(q, expand_kv_heads(k, q.shape[1]), causal)):
            how = behaviour if behaviour not in ("wrong", "unwritten", "lse unwritten", None) else ""
            for got, grad in zip((dq, dk, dv), gradients_with(q, k, v, dout, causal, scale, how, dq_with_dk=half)):
                got.copy_(grad)
        if behaviour == "wrong":
            dk.mul_(1.01)
        elif kept is not None:
            dk.copy_(kept)

    @staticmethod
    def _no_16_bit_masks(masks):
        if any(m is not None for m in masks.values()):
            raise RuntimeError("the bf16/fp16 backward part (steps 27-30) takes no window_left, softcap or cu_seqlens: "
                               "the masks beyond causal in the backward pass are float32's (step 26): give float32 "
                               "tensors")

    @staticmethod
    def _check_lse(lse, q, others):
        check_cuda_float32(lse, "lse")
        if lse.shape != q.shape[:3]:
            raise RuntimeError(f"lse must be (batch, heads, seq_q) = {tuple(q.shape[:3])}, got {list(lse.shape)}")
        for name, t in others.items():
            check_no_overlap(lse, "lse", t, name)

    def max_head_dim(self):
        return 128

    def has_half(self):
        return True

    def has_hopper(self):
        return True

    def has_masks(self):
        return True

    def has_hopper_masks(self):
        return True

    def has_backward(self):
        return True

    def has_backward_half(self):
        return True

    def tile_sizes(self):
        return 64, 64
