"""The kernel set's interface (common/kernel_set.py): the CUDA, PyTorch and SDPA sets implement it, and the two that
run on the CPU agree with each other and with float64 on what it promises (grouped-query heads, causal queries that
are the last positions of the keys, left padding, per-sequence positions and lengths)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from common.kernel_set import KernelSet
from common.torch_kernels import PyTorchKernels
from task5.attention import CudaKernels
from checks.task5.generation import SdpaKernels

SETS = [CudaKernels, PyTorchKernels, SdpaKernels]


@pytest.mark.parametrize("kernels", SETS, ids=lambda k: k.__name__)
def test_each_set_declares_the_interface(kernels):
    assert isinstance(kernels(), KernelSet)
    for name in ("attention", "update_cache", "decode"):
        declared = list(inspect.signature(getattr(KernelSet, name)).parameters)
        assert list(inspect.signature(getattr(kernels, name)).parameters) == declared, (kernels.__name__, name)


def float64_attention(q, k, v, causal, first):
    """Each (sequence, head, query) on its own, in float64: the keys it may see, softmax, the values."""
    batch, heads, seq_q, head_dim = q.shape
    group, seq_k = heads // k.shape[1], k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(seq_q):
                position = seq_k - seq_q + i
                start = first[b] if first is not None else 0
                if position < start:
                    continue  # a padding query: zeros
                end = position + 1 if causal else seq_k
                keys = k[b, h // group, start:end].double()
                weights = torch.softmax(keys @ q[b, h, i].double() / math.sqrt(head_dim), 0)
                out[b, h, i] = weights @ v[b, h // group, start:end].double()
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("seq_q, seq_k", [(7, 7), (3, 9)])
def test_pytorch_and_sdpa_attention_agree_with_float64(causal, padded, seq_q, seq_k):
    torch.manual_seed(seq_q * 10 + seq_k)
    q = torch.randn(3, 6, seq_q, 16)
    k, v = (torch.randn(3, 2, seq_k, 16) for _ in range(2))  # grouped: 3 query heads per key/value head
    first = torch.tensor([0, seq_k - 2, seq_k], dtype=torch.int32) if padded else None  # the last: all padding
    expected = float64_attention(q, k, v, causal, None if first is None else first.tolist())
    for kernels in (PyTorchKernels(), SdpaKernels()):
        got = kernels.attention(q, k, v, causal, first)
        assert got.shape == q.shape and torch.allclose(got.double(), expected, atol=1e-5), type(kernels).__name__


def test_pytorch_and_sdpa_caches_agree():
    """update_cache and decode, with an int and with a tensor of one position or length per sequence."""
    torch.manual_seed(5)
    caches = {type(s).__name__: (s, torch.zeros(2, 2, 12, 8), torch.zeros(2, 2, 12, 8))
              for s in (PyTorchKernels(), SdpaKernels())}
    steps = [(5, 0, torch.tensor([0, 2], dtype=torch.int32)), (1, 5, torch.tensor([1, 2], dtype=torch.int32)),
             (1, torch.tensor([6, 6], dtype=torch.int32), torch.tensor([3, 0], dtype=torch.int32))]
    length = 0
    for n, pos, first in steps:
        k_new, v_new = torch.randn(2, 2, n, 8), torch.randn(2, 2, n, 8)
        q = torch.randn(2, 4, 1, 8)
        length += n
        lengths = torch.tensor([length, length], dtype=torch.int32) if isinstance(pos, torch.Tensor) else length
        outs = []
        for kernels, k_cache, v_cache in caches.values():
            kernels.update_cache(k_new, v_new, k_cache, v_cache, pos)
            outs.append(kernels.decode(q, k_cache, v_cache, lengths, first))
        (_, k_cache, v_cache), (_, k_other, v_other) = caches.values()
        assert torch.equal(k_cache, k_other) and torch.equal(v_cache, v_other)
        expected = float64_attention(q, k_cache[:, :, :length], v_cache[:, :, :length], False, first.tolist())
        assert all(torch.allclose(out.double(), expected, atol=1e-5) for out in outs), (n, pos)
