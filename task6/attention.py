"""Task 6: the attention of a small LLM, with a KV cache, on your kernels.

`CachedAttention.forward(x, cache)` gets a layer's input x (batch, n, hidden) and the
layer's `KVCache` (task6/model.py), and runs in one of two phases:
- prefill: the cache is empty and x is the prompt (n >= 1 tokens). Attend causally over
  the prompt with task 4's kernel, and store every prompt token's K and V in the cache.
- decode: the cache holds `cache.length` positions and x is one new token. Append its K
  and V to the cache with task 5's `update_cache`, then attend over the whole cache with
  task 5's `decode`, which reads the cache in place.
Rotary embeddings turn q and k by each token's position in the sequence, so the new
tokens' positions start where the cache ends.
A decode step may be captured once as a CUDA graph and replayed for every later token
(task6/model.py's DecodeGraph): whatever changes from one token to the next must then come
from GPU memory. So the positions and lengths the kernels and RoPE take are
`cache.lengths`, int32 (batch,) on the GPU (the model advances it), never the Python int
`cache.length`, which only decides prefill or decode; and nothing reads a GPU value back.
In a batch padded on the left, `cache.key_start` (int32 (batch,), or None) gives each
sequence's padding: the kernels must not let a padded key take weight. (Its tokens then sit
key_start[b] positions later than alone, which RoPE does not see: a score depends only on
the distance between query and key.)
`self.kernels` holds the kernels (`attention`, `update_cache`, `decode`, as in
task5/attention.py's `CudaKernels`); k, v and the cache may have fewer heads than q
(grouped-query attention), which the kernels read as they are.
"""

from __future__ import annotations

import torch

from task6.model import Attention, KVCache


class CachedAttention(Attention):
    def forward(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """x (batch, n, hidden) -> (batch, n, hidden): a prompt when the cache is empty, else one new token."""
        q, k, v = self.project(x)  # q (batch, heads, n, head_dim), k and v (batch, kv_heads, n, head_dim), contiguous
        q, k = self.rotate(q, k, cache.lengths)
        # TODO (README, Task 6, step 2: prefill when the cache is empty, else decode; then count the new tokens in cache.length)
        raise NotImplementedError("see README, Task 6, step 2: prefill when the cache is empty, else decode; then count the new tokens in cache.length")

    def rotate(self, q, k, start: torch.Tensor):
        """q and k of the tokens at positions start, start + 1, ... of each sequence (start: int32 (batch,) on
        q's device), turned by RoPE (self.rope(x, positions), positions (batch, n))."""
        # TODO (README, Task 6, step 1: sequence b's new tokens sit at positions start[b] .. start[b] + n - 1: rotate q and k there)
        raise NotImplementedError("see README, Task 6, step 1: sequence b's new tokens sit at positions start[b] .. start[b] + n - 1: rotate q and k there")

    def prefill(self, q, k, v, cache: KVCache):
        """The prompt: store its k and v from position 0, and attend causally over it (task 4's kernel),
        each sequence from its first real key (the kernels skip the padding: pass cache.key_start).
        Returns the attention's output, (batch, heads, n, head_dim)."""
        # TODO (README, Task 6, step 3: prefill: k and v into the cache at position 0, causal attention over the prompt past its padding)
        raise NotImplementedError("see README, Task 6, step 3: prefill: k and v into the cache at position 0, causal attention over the prompt past its padding")

    def decode(self, q, k, v, cache: KVCache):
        """One new token: append its k and v at each sequence's position cache.lengths, attend over the cache in
        place (task 5's), each sequence from its first real key. Returns the attention's output, (batch, heads,
        1, head_dim)."""
        # TODO (README, Task 6, step 4: decode: append k and v at positions cache.lengths, then attend over the cache past its padding)
        raise NotImplementedError("see README, Task 6, step 4: decode: append k and v at positions cache.lengths, then attend over the cache past its padding")
