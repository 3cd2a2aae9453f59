"""The kernel set a cached attention layer runs: one interface, three implementations.

Given code (not graded). Task 5's layer, task 6's model and task 7's Hugging Face models run their
attention through an object with the three methods of `KernelSet`, all with the scale
1/sqrt(head_dim):
- `attention(q, k, v, causal, key_start=None, *, window_left=None, softcap=None)`: task 4's kernel, for a
  prompt (window_left and softcap: its masks beyond causal, steps 23-24, float32; `common/masks.py` says each);
- `update_cache(k_new, v_new, k_cache, v_cache, pos)` and `decode(q, k_cache, v_cache, length,
  key_start=None)`: task 5's kernels, for the cache and each new token.
k, v and the caches may have fewer heads than q (grouped-query attention: query head h reads
key/value head h // (heads // kv_heads)). The queries are the last seq_q positions of the keys, so
`causal` hides the keys after each query's own position. `key_start`, None or an int32 tensor of
one value per sequence, marks each sequence's left padding: its keys before key_start are hidden,
and a query at one of those positions is padding itself, its output row zeros. `pos` and `length`
are an int (every sequence) or an int32 tensor of one value per sequence (the form a CUDA graph
replays).

The three sets: task5/attention.py's `CudaKernels` (task 4's and task 5's kernels on the GPU,
yours or the reference's), common/torch_kernels.py's `PyTorchKernels` (the same in plain PyTorch,
which plays them on the CPU) and checks/task5/generation.py's `SdpaKernels` (PyTorch's SDPA, the checks'
baseline). tests/test_kernel_set.py holds all three to this interface.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class KernelSet(Protocol):
    def attention(self, q, k, v, causal: bool, key_start=None, *, window_left=None, softcap=None) -> torch.Tensor:
        ...

    def update_cache(self, k_new, v_new, k_cache, v_cache, pos) -> None: ...

    def decode(self, q, k_cache, v_cache, length, key_start=None) -> torch.Tensor: ...


def hidden_keys(seq_q: int, seq_k: int, causal: bool, first, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The keys each query may not see, and the queries that are padding themselves: (hidden, padded), boolean,
    broadcastable to (batch, heads, seq_q, seq_k) and (batch, heads, seq_q, 1). first: None, or each sequence's
    key_start as an int64 tensor (batch,): padded is None without it. A padded query's row of hidden is all True."""
    hidden = torch.zeros(seq_q, seq_k, dtype=torch.bool, device=device)
    if causal:
        hidden = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).triu(seq_k - seq_q + 1)
    if first is None:
        return hidden, None
    first = first[:, None, None, None]
    padded_key = torch.arange(seq_k, device=device) < first
    padded = (torch.arange(seq_q, device=device) + seq_k - seq_q)[:, None] < first
    return hidden | padded_key | padded, padded
