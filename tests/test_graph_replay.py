"""Task 5's kernels with positions and lengths in GPU memory, captured once in a CUDA graph and replayed (GPU only).

A generation loop replayed as a graph repeats the same launches with the same arguments: the
reference's update_cache and decode must take the changing values from memory, never read them
back to the host during capture (capture refuses a synchronisation), and give at every replay what
a fresh eager call with the same values gives.
"""

import math

import pytest
import torch

from harness.attention_math import attention_float64
from tests.conftest import needs_cuda, needs_solution

pytestmark = [needs_cuda, needs_solution(5)]


@pytest.fixture(scope="module")
def ext():
    from task5 import attention

    return attention.extension(solution=True)


@pytest.mark.parametrize("splits", [1, 3, 0])
def test_a_decode_step_replays_in_a_cuda_graph_with_lengths_on_the_gpu(ext, splits):
    batch, heads, kv_heads, max_seq, d = 3, 8, 2, 200, 64
    gen = torch.Generator(device="cuda").manual_seed(splits)
    k_cache, v_cache = (torch.randn(batch, kv_heads, max_seq, d, device="cuda", generator=gen) for _ in range(2))
    lengths = torch.tensor([5, 90, 150], dtype=torch.int32, device="cuda")  # each sequence's cache so far
    key_start = torch.tensor([0, 3, 149], dtype=torch.int32, device="cuda")
    q = torch.zeros(batch, heads, 1, d, device="cuda")
    k_new, v_new = (torch.zeros(batch, kv_heads, 1, d, device="cuda") for _ in range(2))
    out = torch.zeros_like(q)

    def step():  # append the new row at each sequence's length, count it, attend over the cache
        ext.update_cache(k_new, v_new, k_cache, v_cache, lengths)
        lengths.add_(1)
        ext.decode(q, k_cache, v_cache, out, lengths, 1 / math.sqrt(d), splits, key_start)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as torch.cuda.graphs asks
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()  # recorded, not run: the cache and lengths stay as the warm-up left them
    for _ in range(4):
        before = lengths.tolist()
        for t in (q, k_new, v_new):
            t.copy_(torch.randn(t.shape, device="cuda", generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        assert lengths.tolist() == [n + 1 for n in before]
        for b, (end, first) in enumerate(zip(lengths.tolist(), key_start.tolist())):
            assert torch.equal(k_cache[b, :, end - 1], k_new[b, :, 0]) and torch.equal(v_cache[b, :, end - 1],
                                                                                         v_new[b, :, 0])
            expected = attention_float64(q[b:b + 1], k_cache[b:b + 1, :, first:end], v_cache[b:b + 1, :, first:end],
                                           False, 1 / math.sqrt(d))[0]
            assert torch.allclose(out[b:b + 1].double(), expected, atol=1e-5, rtol=1e-4), (b, end)


def test_the_int_forms_are_checked_on_the_host_and_the_tensor_forms_are_not_read_back(ext):
    """The int form with key_start reads its values back (one synchronisation), so capture refuses it with
    CUDA's own error; the tensor form is what a graph takes, and its replay computes the output anew."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(1, 2, 1, 64, device="cuda", generator=gen)
    k_cache, v_cache = (torch.randn(1, 2, 16, 64, device="cuda", generator=gen) for _ in range(2))
    key_start = torch.ones(1, dtype=torch.int32, device="cuda")
    lengths = torch.full((1,), 4, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    ext.decode(q, k_cache, v_cache, out, 4, 0.125, 0, key_start)  # warm-up
    with pytest.raises(RuntimeError, match="captur"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            ext.decode(q, k_cache, v_cache, out, 4, 0.125, 0, key_start)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ext.decode(q, k_cache, v_cache, out, lengths, 0.125, 0, key_start)
    out.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    expected = attention_float64(q, k_cache[:, :, 1:4], v_cache[:, :, 1:4], False, 0.125)[0]
    assert torch.allclose(out.double(), expected, atol=1e-5, rtol=1e-4)
