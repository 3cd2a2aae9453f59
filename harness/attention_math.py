"""Attention in float64, which every task is checked against (`attention_float64`, its masks and gradients), the
flops it takes and the GPU's bounds. ("The reference" in this kit is the reference solution, taskN/solution/.)

Shapes follow the handout: per-head tensors are (batch, heads, seq, head_dim).
Causal masking with seq_q != seq_k is aligned to the end: query i sees key j
when j <= i + (seq_k - seq_q), so the last query sees every key (decoding).
"""

from __future__ import annotations

import math

import torch

from harness.checks import exact_float32


def causal_mask(seq_q: int, seq_k: int, device=None) -> torch.Tensor:
    """Boolean (seq_q, seq_k) mask, True where a query must NOT see a key."""
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).triu(diagonal=1 + seq_k - seq_q)


def expand_kv_heads(k, heads: int):
    """k (or v) of (batch, kv_heads, seq, head_dim) with each key/value head repeated for the heads / kv_heads
    query heads that share it (grouped-query attention): query head h reads head h // (heads // kv_heads).
    For the trusted side only (references, diagnoses): the kernels read the shared heads in place."""
    kv_heads = k.shape[-3]
    return k if kv_heads == heads else k.repeat_interleave(heads // kv_heads, dim=-3)


def padding_mask(key_start, seq_q: int, seq_k: int) -> torch.Tensor:
    """Boolean (batch, 1, seq_q, seq_k), True where a key is padding: before its sequence's first valid key
    key_start[b] (left padding). A query is padding too when its position, seq_k - seq_q + i, is."""
    keys = torch.arange(seq_k, device=key_start.device)
    return (keys < key_start.long()[:, None]).view(-1, 1, 1, seq_k).expand(-1, 1, seq_q, seq_k)


def padded_queries(key_start, seq_q: int, seq_k: int) -> torch.Tensor:
    """Boolean (batch, 1, seq_q, 1), True for the queries whose position is before key_start: they see no key,
    and their output is defined as zero."""
    positions = torch.arange(seq_q, device=key_start.device) + (seq_k - seq_q)
    return (positions < key_start.long()[:, None]).view(-1, 1, seq_q, 1)


def window_mask(seq_q: int, seq_k: int, window_left: int, device=None) -> torch.Tensor:
    """Boolean (seq_q, seq_k), True where a key is before query i's sliding window: j < i + offset - window_left
    (the causal mask hides the keys after it)."""
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).tril(diagonal=seq_k - seq_q - window_left - 1)


def document_mask(documents, device=None) -> torch.Tensor:
    """Boolean (seq, seq), True where a key is in another document than the query (documents: cu_seqlens,
    0 = c_0 < ... < c_n = seq). Built here from the lengths, not with common/masks.py's helper the students use."""
    ids = torch.cat([torch.full((b - a,), d) for d, (a, b) in enumerate(zip(documents, documents[1:]))])
    return (ids[:, None] != ids[None, :]).to(device)


def masked_scores(q, k, causal: bool, scale: float, *, window_left=None, documents=None, softcap=None):
    """scale * q k^T (k with q's heads), soft-capped where softcap is given, then -inf where a mask hides a key:
    causal (aligned to the end), a sliding window (window_left, with causal), packed documents (cu_seqlens)."""
    scores = (q @ k.transpose(-2, -1)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    return apply_masks(scores, causal, window_left, documents)


def apply_masks(scores, causal: bool, window_left=None, documents=None):
    """scores (.., seq_q, seq_k) with -inf where causal, the window or the documents hide a key."""
    (seq_q, seq_k), device = scores.shape[-2:], scores.device
    if causal:
        scores = scores.masked_fill(causal_mask(seq_q, seq_k, device), -math.inf)
    if window_left is not None:
        scores = scores.masked_fill(window_mask(seq_q, seq_k, window_left, device), -math.inf)
    if documents is not None:
        scores = scores.masked_fill(document_mask(documents, device), -math.inf)
    return scores


def attention_float64(q, k, v, causal: bool = False, scale: float | None = None, key_start=None, *,
                      window_left=None, documents=None, softcap=None):
    """softmax(scale * q k^T + mask) v in float64; returns (out, logsumexp) in float64.

    k and v may have fewer heads than q (grouped-query attention). key_start: each sequence's first valid
    key (left padding); the padded queries' rows are zeros, their logsumexp -inf. window_left, documents
    (cu_seqlens as a list) and softcap: the masks beyond causal of Task 3's steps 9-12 (masked_scores)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    with exact_float32():
        q, k, v = (t.detach().double() for t in (q, k, v))
        if q.dim() >= 3:
            k, v = expand_kv_heads(k, q.shape[-3]), expand_kv_heads(v, q.shape[-3])
        scores = masked_scores(q, k, causal, scale, window_left=window_left, documents=documents, softcap=softcap)
        if key_start is None:
            return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)
        key_start = key_start.to(q.device)
        scores = scores.masked_fill(padding_mask(key_start, q.shape[-2], k.shape[-2]), -math.inf)
        padded = padded_queries(key_start, q.shape[-2], k.shape[-2])
        scores = scores.masked_fill(padded, 0.0)  # any finite row: its result is replaced below
        out = (torch.softmax(scores, dim=-1) @ v).masked_fill(padded, 0.0)
        return out, torch.logsumexp(scores, dim=-1).masked_fill(padded[..., 0], -math.inf)


def attention_gradients(q, k, v, d_out, causal: bool = False, scale: float | None = None, dtype=torch.float64, *,
                        window_left=None, documents=None, softcap=None):
    """(dq, dk, dv) in float64: autograd through softmax(scale q k^T + mask) v on float64 copies, for the
    gradient d_out of the output (the backward passes of tasks 3 and 4 are checked against it). k and v may have
    fewer heads than q (grouped-query attention): their gradients add up over the query heads that share them.
    dtype=torch.float32: the same in plain float32 (no TF32), whose error on hard inputs bounds what a float32
    kernel can be held to."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    with exact_float32(), torch.enable_grad():
        q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
        heads = q.shape[-3]
        scores = masked_scores(q, expand_kv_heads(k, heads), causal, scale, window_left=window_left,
                               documents=documents, softcap=softcap)
        (torch.softmax(scores, dim=-1) @ expand_kv_heads(v, heads)).backward(d_out.detach().to(dtype))
        return q.grad, k.grad, v.grad


def backward_from_saved(q, k, v, out, lse, d_out, causal: bool = False, scale: float | None = None, *,
                        window_left=None, documents=None):
    """(dq, dk, dv) in float64 as Algorithm 2 computes them from the forward pass's saved out and lse, whatever
    those are: P = exp(S - L), D = rowsum(dO * O), dS = P (dP - D). The forward's own out and lse give
    attention_gradients; task 3's timed backward runs are given a float32 forward's, and checked against this."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    with exact_float32():
        q, k, v, out, lse, d_out = (t.detach().double().cpu() for t in (q, k, v, out, lse, d_out))
        p = torch.exp(masked_scores(q, k, causal, scale, window_left=window_left, documents=documents)
                      - lse[..., None])
        d_s = p * (d_out @ v.transpose(-2, -1) - (d_out * out).sum(dim=-1, keepdim=True))
        return scale * d_s @ k, scale * d_s.transpose(-2, -1) @ q, p.transpose(-2, -1) @ d_out


def attention_rows(q, k, v, rows, causal: bool = False, scale: float | None = None, *, window_left=None,
                   documents=None, softcap=None, d_out=None):
    """Rows `rows` of attention_float64's output, and of dq for the gradient d_out where given, each computed from
    that query's row of scores alone: the memory cases' outputs are checked on a sample of their rows, whose full
    score matrix the checks could not hold either. q (batch, heads, seq_q, d), k and v with as many heads."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    keys = torch.arange(seq_k)
    ids = None if documents is None else torch.bucketize(keys, torch.tensor(documents[1:-1]), right=True)
    outs, grads = [], []
    with exact_float32():
        q, k, v = (t.detach().double().cpu() for t in (q, k, v))
        for i in rows:
            hidden = torch.zeros(seq_k, dtype=torch.bool)
            if causal:
                hidden |= keys > i + seq_k - seq_q
            if window_left is not None:
                hidden |= keys < i + seq_k - seq_q - window_left
            if ids is not None:
                hidden |= ids != ids[i]
            raw = (q[..., i, None, :] @ k.transpose(-2, -1)) * scale  # (batch, heads, 1, seq_k)
            capped = raw if softcap is None else softcap * torch.tanh(raw / softcap)
            p = torch.softmax(capped.masked_fill(hidden, -math.inf), dim=-1)
            outs.append(p @ v)
            if d_out is not None:
                d_o = d_out[..., i, None, :].detach().double().cpu()
                d_s = p * (d_o @ v.transpose(-2, -1) - (d_o * outs[-1]).sum(dim=-1, keepdim=True))
                if softcap is not None:
                    d_s = d_s * (1 - (capped / softcap) ** 2)
                grads.append(scale * d_s @ k)
    out = torch.cat(outs, dim=-2)
    return (out, torch.cat(grads, dim=-2)) if d_out is not None else (out, None)


def naive_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """The unfused baseline in the inputs' dtype: matmul, mask, softmax, matmul (the whole score matrix)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        scores = scores.masked_fill(causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def attention_flops(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, causal: bool) -> float:
    """4 * B * H * (query, key) pairs * D: two matmuls of 2 flops per multiply-add, over the pairs computed.

    Causal (end-aligned, seq_q <= seq_k) keeps query i's first i + 1 + seq_k - seq_q keys: about half.
    """
    pairs = seq_q * (seq_q + 1) // 2 + seq_q * (seq_k - seq_q) if causal else seq_q * seq_k
    return 4.0 * batch * heads * pairs * head_dim


def fp32_peak_tflops(device=None) -> float:
    """An upper bound on the GPU's float32 FFMA (non-tensor-core) rate: 128 lanes per SM, 2 flops per FMA, 2 GHz.

    Real chips run at most at this: the share of it a kernel reaches says how close to the arithmetic's
    limit it is. (A kernel on the tensor cores can pass it: fp32_tensor_core_bound_tflops.)
    """
    props = torch.cuda.get_device_properties(device)
    return props.multi_processor_count * 128 * 2 * 2.0e9 / 1e12


def half_tensor_core_bound_tflops(device=None) -> float:
    """An upper bound on dense bf16/fp16 products with float32 accumulators on the tensor cores, at 2 GHz:
    4096 flops per clock per SM on Hopper (its wgmma rate; mma.sync reaches about two thirds of it), 2048 on the
    A100 (8.0), 1024 on other Ampere and Ada GPUs. A kernel above it skipped work."""
    props = torch.cuda.get_device_properties(device)
    per_sm = 4096 if props.major >= 9 else 2048 if (props.major, props.minor) == (8, 0) else 1024
    return props.multi_processor_count * per_sm * 2.0e9 / 1e12


def fp32_tensor_core_bound_tflops(device=None) -> float:
    """An upper bound on float32-accurate products on the tensor cores (3xTF32: three TF32 products each).

    Hopper's TF32 rate, 2048 flops per clock per SM (Ampere's is half), at 2 GHz, divided by three: a
    kernel that uses the tensor cores close to float32's accuracy stays under it; one above it skipped work.
    """
    props = torch.cuda.get_device_properties(device)
    return props.multi_processor_count * 2048 * 2.0e9 / 3 / 1e12
