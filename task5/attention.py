"""Task 5: the Python side of the KV cache and the decode kernels.

Given: not graded; edits here are not submitted (you write kernels/decode.cu).

`update_cache` and `decode` hand tensors to the kernels in kernels/decode.cu (built on
first use; `python -m task5.compile` builds them ahead). `CachedMultiHeadAttention` is a
whole layer that generates: `prefill` runs task 4's kernel on the prompt and fills the
cache, then each `step` projects one new token, appends its K and V to the cache and
runs the decode kernel over the cache.
"""

from __future__ import annotations

import math

import torch

from common.build import TaskExtension
from common.kernel_set import KernelSet
from common.operators import function
from common.layer import AttentionLayer

# The compiled kernel module: extension() is yours, extension(solution=True) the reference.
extension = TaskExtension(5)


def update_cache(k_new, v_new, k_cache, v_cache, pos, solution: bool = False) -> None:
    """Write k_new, v_new (batch, kv_heads, n_new, head_dim) into the caches at positions pos .. pos + n_new - 1.

    pos: an int (every sequence), or int32 (batch,) on the GPU, one position per sequence: the form a
    CUDA graph can replay, its values read by the kernel (a sequence whose rows would not fit writes
    nothing). A bfloat16 or float16 cache (and new rows of its type) goes to step 6's kernels
    (kernels/decode_half.cu).
    """
    name = "update_cache_half" if is_half(k_cache) else "update_cache"
    # an int pos is the module's alone (an operator takes the tensor form, which a compiled graph can replay)
    call = function(extension(solution), name) if isinstance(pos, torch.Tensor) else getattr(extension(solution), name)
    call(k_new, v_new, k_cache, v_cache, pos)


def decode(q, k_cache, v_cache, length, scale: float | None = None, out=None, splits: int = 0,
           solution: bool = False, key_start=None):
    """One query per (batch, head), q (batch, heads, 1, head_dim), over positions 0 .. length - 1 of the cache
    (batch, kv_heads, max_seq, head_dim); kv_heads divides heads (grouped-query attention).

    length: an int (every sequence), or int32 (batch,) on the GPU, one per sequence: the form a CUDA
    graph can replay, its values read by the kernel, never by the host (a sequence whose length is out
    of range gets NaN). splits: 1 = no split (step 2), 0 = the launcher's choice (for an int32 length,
    chosen for sequences up to max_seq), more = split-KV with that many splits (step 3). key_start,
    int32 (batch,) on the GPU: each sequence's first valid position (a batch padded on the left); the
    positions before it take no weight. A bfloat16 or float16 cache (q and out of its type) goes to
    step 6's kernel (kernels/decode_half.cu).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.full_like(q, math.nan) if out is None else out  # NaN: an element the kernel never wrote shows
    name = "decode_half" if is_half(k_cache) else "decode"
    call = function(extension(solution), name) if isinstance(length, torch.Tensor) else getattr(extension(solution), name)
    call(q, k_cache, v_cache, out, length, scale, splits, key_start)
    return out


def is_half(cache) -> bool:
    """A cache of 16-bit values: step 6's kernels read it (the binding checks that every tensor matches)."""
    return cache.dtype in (torch.bfloat16, torch.float16)


def update_cache_paged(k_new, v_new, k_pages, v_pages, block_table, pos, solution: bool = False) -> None:
    """Step 5 (optional): write k_new, v_new (batch, kv_heads, n_new, head_dim) into a paged cache.

    k_pages, v_pages: (num_pages, kv_heads, page_size, head_dim), page_size a power of two;
    block_table: int32 (batch, max_pages) on the GPU, sequence b's position p in page
    block_table[b, p // page_size]; pos: an int or int32 (batch,) on the GPU. Pools of bfloat16 or
    float16 (new rows of their type) go to step 7's kernels (kernels/decode_half.cu).
    """
    most = block_table.shape[1] * k_pages.shape[2] - k_new.shape[2]  # the last start that fits
    name = "update_cache_paged_half" if is_half(k_pages) else "update_cache_paged"
    getattr(extension(solution), name)(k_new, v_new, k_pages, v_pages, block_table,
                                       per_sequence(pos, "pos", 0, most, block_table))


def decode_paged(q, k_pages, v_pages, block_table, length, scale: float | None = None, out=None, splits: int = 0,
                 solution: bool = False, key_start=None):
    """Step 5 (optional): decode as `decode` does, over a paged cache (see update_cache_paged); pools of bfloat16
    or float16 (q and out of their type) go to step 7's kernel."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.full_like(q, math.nan) if out is None else out
    most = block_table.shape[1] * k_pages.shape[2]  # the positions a sequence's pages hold
    name = "decode_paged_half" if is_half(k_pages) else "decode_paged"
    getattr(extension(solution), name)(q, k_pages, v_pages, out, block_table,
                                       per_sequence(length, "length", 1, most, block_table), scale, splits, key_start)
    return out


def per_sequence(value, name: str, least: int, most: int, block_table):
    """An int, checked to lie in least .. most, as int32 (batch,) on the block table's device; a tensor as it is
    (the binding checks it, and the kernels its values)."""
    if not isinstance(value, int):
        return value
    if not least <= value <= most:
        raise ValueError(f"{name} must be between {least} and {most} (what max_pages pages of page_size positions "
                         f"hold), got {value}")
    return torch.full((block_table.shape[0],), value, dtype=torch.int32, device=block_table.device)


# What the layer's prefill raises when Task 4's kernel does not build: checks/task5/test.py and measure.py read it
TASK4_DID_NOT_BUILD = "the prefill runs your Task 4 kernel, which did not build"


class CudaKernels:
    """The kernels a cached layer runs: task 4's for the prompt, task 5's for the cache and each step.
    prefill="pytorch": the prompt's attention in plain PyTorch instead (task 5's test, when task 4's kernel
    fails: task 5's own kernels are still tested and timed)."""

    def __init__(self, solution: bool = False, prefill: str = "task4"):
        self.solution, self.prefill = solution, prefill

    def attention(self, q, k, v, causal: bool, key_start=None, *, window_left=None, softcap=None):
        masks = {name: value for name, value in (("window_left", window_left), ("softcap", softcap))
                 if value is not None}  # task 4's steps 23-24 (float32), only where a model has them
        if self.prefill == "pytorch":
            from common.torch_kernels import PyTorchKernels

            return PyTorchKernels().attention(q, k, v, causal, key_start, **masks)
        from task4.attention import flash_attention

        return flash_attention(q, k, v, causal, solution=self.solution, key_start=key_start, **masks)

    def update_cache(self, k_new, v_new, k_cache, v_cache, pos) -> None:
        update_cache(k_new, v_new, k_cache, v_cache, pos, solution=self.solution)

    def decode(self, q, k_cache, v_cache, length, key_start=None):
        return decode(q, k_cache, v_cache, length, solution=self.solution, key_start=key_start)

    def linear(self, x, weight, out) -> None:
        """Given, not yours: out = x @ weight^T for a decode step's few rows (common/csrc/linear_rows.cu,
        built into this task's extension); task 6's model runs its products through it."""
        function(extension(self.solution), "linear")(x, weight, out)

    def linear_max_rows(self) -> int:
        return extension(self.solution).linear_max_rows()


def built_kernels(solution: bool = False) -> CudaKernels:
    """Task 4's and task 5's kernels, built first, so a build error names its task (tasks 6 and 7 run them)."""
    from common.build import BuildError
    from task4.attention import extension as task4_extension

    for number, build in ((4, task4_extension), (5, extension)):
        try:
            build(solution)
        except BuildError as err:
            raise RuntimeError(f"the model runs your Task {number} kernels, which did not build: {err}") from None
    return CudaKernels(solution)


class CachedMultiHeadAttention(AttentionLayer):
    """Causal multi-head attention for generation, with a cache of every position's K and V.

    `prefill(x)` takes the prompt (batch, prompt_len, hidden) and returns its outputs;
    `step(x)` takes one new token per sequence (batch, 1, hidden) and returns its output.
    The cache holds `max_seq` positions per sequence, (batch, heads, max_seq, head_dim)
    each for K and V: a head's keys are consecutive rows, so the decode kernel reads them
    in one contiguous, coalesced sweep.
    """

    def __init__(self, hidden_size: int, num_heads: int, max_seq: int, device=None, kernels: KernelSet | None = None):
        super().__init__(hidden_size, num_heads, device=device)
        if not isinstance(max_seq, int) or max_seq < 1:
            raise ValueError(f"max_seq must be a positive int (the positions the cache holds), got {max_seq!r}")
        self.max_seq = max_seq
        self.kernels = kernels if kernels is not None else CudaKernels()
        self.k_cache = self.v_cache = None
        self.length = 0  # positions of the cache written so far

    def heads(self, x):
        """The projections of x, as (batch, heads, seq, head_dim) rows the kernels read."""
        return [self.split_heads(proj(x)).contiguous() for proj in (self.q_proj, self.k_proj, self.v_proj)]

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """Start a new generation from the prompt x (batch, prompt_len, hidden): fill the cache."""
        self._check_input(x, "x")
        batch, prompt_len, _ = x.shape
        if prompt_len > self.max_seq:
            raise ValueError(f"the prompt has {prompt_len} tokens but the cache holds max_seq = {self.max_seq} "
                             "positions; make the layer with a larger max_seq")
        shape = (batch, self.num_heads, self.max_seq, self.head_dim)
        if self.k_cache is None or self.k_cache.shape != shape or self.k_cache.device != x.device:
            self.k_cache = torch.zeros(shape, device=x.device, dtype=x.dtype)
            self.v_cache = torch.zeros_like(self.k_cache)
        q, k, v = self.heads(x)
        self.kernels.update_cache(k, v, self.k_cache, self.v_cache, 0)
        self.length = prompt_len
        return self.out_proj(self.merge_heads(self.kernels.attention(q, k, v, True)))

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """One new token per sequence, x (batch, 1, hidden): append its K and V, attend over the cache."""
        self._check_input(x, "x")
        if self.k_cache is None:
            raise RuntimeError("step() before prefill(): there is no cache yet; start with prefill(prompt)")
        if x.shape[0] != self.k_cache.shape[0] or x.shape[1] != 1:
            raise ValueError(f"x must be (batch, 1, hidden) with the prompt's batch {self.k_cache.shape[0]}, "
                             f"got {tuple(x.shape)}")
        if self.length >= self.max_seq:
            raise ValueError(f"the cache is full: it holds max_seq = {self.max_seq} positions, all written; "
                             "make the layer with a larger max_seq")
        q, k, v = self.heads(x)
        self.kernels.update_cache(k, v, self.k_cache, self.v_cache, self.length)
        self.length += 1
        return self.out_proj(self.merge_heads(self.kernels.decode(q, self.k_cache, self.v_cache, self.length)))

    def forward(self, query, key, value, causal: bool = True):
        raise TypeError("CachedMultiHeadAttention generates: call prefill(prompt), then step(token)")

    def _check_input(self, x, name):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.hidden_size or x.shape[1] < 1:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must be (batch, seq, hidden = {self.hidden_size}) with seq >= 1, got {got}")
