"""Task 5's entry points: how the checks call your kernels (task5/kernels/decode.cu).

Given: not graded; edits here are not submitted. This runs in the worker process: it
builds your kernels with task5/binding.cpp and calls them on tensors the checks own
(shared GPU memory), then waits for the GPU, so the checks read finished outputs. The
layer's prefill also runs your task 4 kernel (task4/kernels/attention.cu).
"""

import torch

from common.build import BuildError
from task5 import attention

ext = attention.extension()  # builds on first use; a compiler error is reported as the build check


def update_cache(k_new, v_new, k_cache, v_cache, pos):
    ext.update_cache(k_new, v_new, k_cache, v_cache, pos)
    torch.cuda.synchronize()


def decode(q, k_cache, v_cache, out, length, scale, splits, key_start=None):
    ext.decode(q, k_cache, v_cache, out, length, scale, splits, key_start)
    torch.cuda.synchronize()


def decode_batch(sets, caches, length, scale, splits):
    """The decode over every (q, out, cache index) set, then wait for the GPU: the checks time this request."""
    for q, out, c in sets:
        ext.decode(q, caches[c][0], caches[c][1], out, length, scale, splits)
    torch.cuda.synchronize()


def _half_build_said():
    """Why kernels/decode_half.cu is not in this build, when the build left it out (its compiler errors)."""
    from common.build import OPTIONAL_LEFT_OUT

    left_out = OPTIONAL_LEFT_OUT.get("task5/kernels/decode_half.cu")
    if left_out and not ext.has_half():
        raise RuntimeError(f"task5/kernels/decode_half.cu was left out of the build (the float32 kernels are "
                           f"tested without it): {left_out}")


def update_cache_half(k_new, v_new, k_cache, v_cache, pos):
    """The bf16/fp16 cache of kernels/decode_half.cu (step 6)."""
    _half_build_said()
    ext.update_cache_half(k_new, v_new, k_cache, v_cache, pos)
    torch.cuda.synchronize()


def decode_half(q, k_cache, v_cache, out, length, scale, splits, key_start=None):
    _half_build_said()
    ext.decode_half(q, k_cache, v_cache, out, length, scale, splits, key_start)
    torch.cuda.synchronize()


def decode_half_batch(sets, caches, length, scale, splits):
    """decode_batch for the bf16/fp16 cache."""
    for q, out, c in sets:
        ext.decode_half(q, caches[c][0], caches[c][1], out, length, scale, splits)
    torch.cuda.synchronize()


def linear(x, weight, out):
    """The given product of task 6's decode step (common/csrc/linear_rows.cu): out = x @ weight^T."""
    ext.linear(x, weight, out)
    torch.cuda.synchronize()


def splits_for(batch, heads, kv_heads, length, head_dim):
    return ext.splits_for(batch, heads, kv_heads, length, head_dim)


def update_cache_paged(k_new, v_new, k_pages, v_pages, block_table, pos):
    ext.update_cache_paged(k_new, v_new, k_pages, v_pages, block_table, pos)
    torch.cuda.synchronize()


def decode_paged(q, k_pages, v_pages, out, block_table, length, scale, splits, key_start=None):
    ext.decode_paged(q, k_pages, v_pages, out, block_table, length, scale, splits, key_start)
    torch.cuda.synchronize()


def decode_paged_batch(sets, pages, length, scale, splits):
    """decode_batch over paged caches: pages[c] is (k_pages, v_pages, block_table); 16-bit pools to step 7's."""
    for q, out, c in sets:
        k_pages, v_pages, block_table = pages[c]
        call = ext.decode_paged_half if attention.is_half(k_pages) else ext.decode_paged
        call(q, k_pages, v_pages, out, block_table, length, scale, splits)
    torch.cuda.synchronize()


def update_cache_paged_half(k_new, v_new, k_pages, v_pages, block_table, pos):
    """The paged cache of 16-bit values (kernels/decode_half.cu, step 7)."""
    _half_build_said()
    ext.update_cache_paged_half(k_new, v_new, k_pages, v_pages, block_table, pos)
    torch.cuda.synchronize()


def decode_paged_half(q, k_pages, v_pages, out, block_table, length, scale, splits, key_start=None):
    _half_build_said()
    ext.decode_paged_half(q, k_pages, v_pages, out, block_table, length, scale, splits, key_start)
    torch.cuda.synchronize()


_layer = None


def make_layer(hidden, heads, max_seq, weights, prefill="task4"):
    """The cached layer with your kernels inside, kept here for the calls below. prefill="pytorch": the
    prompt's attention in plain PyTorch, for when your Task 4 kernel fails (the checks say so)."""
    global _layer
    kernels = attention.CudaKernels(prefill="pytorch" if prefill == "pytorch" else "task4")
    _layer = attention.CachedMultiHeadAttention(hidden, heads, max_seq, device="cuda",
                                                kernels=kernels).load_weights(*weights)


def prefill(x, out):
    with torch.no_grad():
        try:
            out.copy_(_layer.prefill(x))
        except BuildError as err:
            raise RuntimeError(f"{attention.TASK4_DID_NOT_BUILD}: {err}") from None
    torch.cuda.synchronize()


def steps(xs, outs):
    """One decode step per token of xs (batch, n, hidden), each output into outs[:, i]: the checks time this."""
    with torch.no_grad():
        for i in range(xs.shape[1]):
            outs[:, i:i + 1].copy_(_layer.step(xs[:, i:i + 1]))
    torch.cuda.synchronize()


def cache_length():
    return _layer.length


def occupancy(symbols):
    """Threads, shared memory and blocks per SM of your kernels as built (python -m task5.tune asks, after a launch)."""
    from common.occupancy import blocks_per_sm

    return blocks_per_sm(ext.__file__, symbols)


def profile_launch(batch, heads, length, head_dim, splits, kv_heads=None):
    """One decode on a cache made here, for python -m task5.profile (ncu profiles it)."""
    q = torch.randn(batch, heads, 1, head_dim, device="cuda")
    k, v = (torch.randn(batch, kv_heads or heads, length, head_dim, device="cuda") for _ in range(2))
    ext.decode(q, k, v, torch.empty_like(q), length, head_dim ** -0.5, splits)
    torch.cuda.synchronize()
