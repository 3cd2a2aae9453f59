"""FlashInfer's decode beside the kit's: the library serving engines (vLLM, SGLang) decode with, timed on the same
caches where it is installed and supports the GPU (task 5's bf16/fp16 benchmarks). An optional extra, never
required: `pip install -e ".[flashinfer]"` (the package `flashinfer-python`, which compiles its kernels for this
GPU on first use); without it, the benchmarks say so in one line and time the rest.

FlashInfer's batch decode reads a paged cache in its "HND" layout, (num_pages, kv_heads, page_size, head_dim): the
kit's pools exactly (task 5, steps 5 and 7). A contiguous cache (batch, kv_heads, max_seq, head_dim) is timed over
the same rows copied into pages (`to_pages`): FlashInfer splits a long sequence's keys across blocks by whole pages
only, so one page of max_seq positions a sequence would leave it without split-KV. Its page table is a CSR list
(indptr, indices, the last page's length), made here from the kit's block table and lengths. Trusted code, run in
the checking process, as SDPA is.
"""

from __future__ import annotations

import importlib
import itertools
import math

import torch

MIN_CAPABILITY = (8, 0)  # the GPUs FlashInfer's decode kernels are built for (Ampere and later)
WORKSPACE_BYTES = 128 << 20  # its float workspace: the split-KV partial outputs (its documentation's size)


def missing() -> str | None:
    """Why FlashInfer's decode cannot be timed here (one line), or None when it can."""
    try:
        importlib.import_module("flashinfer")
    except ImportError:
        return ("FlashInfer is not installed, so its decode was not timed beside yours (an optional extra: pip install "
                "-e \".[flashinfer]\")")
    except Exception as err:  # noqa: BLE001 - a broken install says what broke, and the benchmarks go on
        first = (str(err).splitlines() or [type(err).__name__])[0]
        return f"FlashInfer is installed but did not import ({first[:200]}), so its decode was not timed"
    if not torch.cuda.is_available():
        return "FlashInfer's decode runs on a GPU: not timed here"
    if torch.cuda.get_device_capability() < MIN_CAPABILITY:
        major, minor = torch.cuda.get_device_capability()
        return (f"FlashInfer's decode needs compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or later, this "
                f"GPU has {major}.{minor}: not timed")
    return None


class PagedDecode:
    """FlashInfer's batch decode planned once for pools (num_pages, kv_heads, page_size, head_dim) of one shape,
    sequence b holding `lengths[b]` positions in the pages `block_table[b, :]` names in order (the kit's block
    table: int32 (batch, max_pages)). `decode(q, k_pages, v_pages, out)`: q and out (batch, heads, 1, head_dim)."""

    def __init__(self, pool_shape, block_table: torch.Tensor, lengths: list[int], heads: int, scale: float,
                 dtype: torch.dtype):
        import flashinfer

        _, kv_heads, page_size, head_dim = pool_shape
        device = block_table.device
        pages = [-(-n // page_size) for n in lengths]  # each sequence's pages, the last one partly filled
        self.indptr = torch.tensor([0, *itertools.accumulate(pages)], dtype=torch.int32, device=device)
        self.indices = torch.cat([block_table[b, :n] for b, n in enumerate(pages)]).to(torch.int32).contiguous()
        self.last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lengths, pages)], dtype=torch.int32,
                                 device=device)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # zeros before its first use
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "HND")
        self.wrapper.plan(self.indptr, self.indices, self.last, heads, kv_heads, head_dim, page_size,
                          q_data_type=dtype, kv_data_type=dtype, sm_scale=scale)

    def __call__(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, out: torch.Tensor) -> None:
        batch, heads, _, head_dim = q.shape
        self.wrapper.run(q.view(batch, heads, head_dim), (k_pages, v_pages), out=out.view(batch, heads, head_dim))


def to_pages(cache: torch.Tensor, page_size: int, order: torch.Tensor) -> torch.Tensor:
    """A contiguous cache (batch, kv_heads, length, head_dim), length a multiple of page_size, as a pool of pages in
    the kit's layout: page order[b * pages + i] holds positions i * page_size .. of sequence b."""
    batch, kv_heads, length, head_dim = cache.shape
    pages = length // page_size
    pool = torch.empty(batch * pages, kv_heads, page_size, head_dim, device=cache.device, dtype=cache.dtype)
    pool[order] = cache.view(batch, kv_heads, pages, page_size, head_dim).transpose(1, 2).reshape(
        -1, kv_heads, page_size, head_dim)
    return pool


def beside(timed, copy_gbs, time_here) -> tuple[str, dict]:
    """FlashInfer's decode on checks/task5/measure.py's TimedDecode's rows and queries (`time_here`: its clock for a
    trusted decode): the caches
    copied into pages of 16 in a random order (its own layout: FlashInfer splits a sequence by whole pages), timed,
    then run once more and checked as the student's outputs are (every element written, picked heads against
    float64 within the 16-bit allowance): outputs that are wrong, or any failure of FlashInfer's (its first-use
    build, its plan, memory), say so instead of a time and cost the student's line nothing. The words for the
    benchmark's line and their metrics."""
    batch, heads, length, head_dim = timed.shape
    scale = 1.0 / math.sqrt(head_dim)
    page_size = 16
    label = f"FlashInfer over pages of {page_size}"
    if length % page_size:
        return f"{label}: not timed ({length} positions are not whole pages)", {}
    try:
        order = torch.randperm(batch * (length // page_size), device="cuda")
        pools = {id(k): tuple(to_pages(c, page_size, order) for c in (k, v)) for k, v in timed.caches}
        paged = PagedDecode(pools[id(timed.caches[0][0])][0].shape,
                                              order.view(batch, -1).to(torch.int32), [length] * batch, heads, scale,
                                              timed.dtype)

        def decode(q, k, v, out):
            paged(q, *pools[id(k)], out)
        timing = time_here(decode, timed)
        if isinstance(timing, str):
            return f"{label}: {timing}", {}
        timed.refresh()  # the outputs of one more request, checked
        with torch.no_grad():
            for q, out, c in timed.sets:
                decode(q, *timed.caches[c], out)
        torch.cuda.synchronize()
        timed.check(scale)
    except AssertionError as err:
        return f"{label}: its outputs were wrong here, so no time is given ({str(err)[:200]})", {}
    except Exception as err:  # noqa: BLE001 - the library's failure is said, the student's line stands
        first = (str(err).splitlines() or [type(err).__name__])[0]
        return f"{label}: failed here ({type(err).__name__}: {first[:200]})", {}
    gbs = timed.bytes_read / (timing.median_ms * 1e-3) / 1e9
    return (f"{label} {timing.median_ms:.3f} ms ({gbs / copy_gbs:.0%} of copy)",
            {f"flashinfer_paged_{page_size}_ms": timing.median_ms})
