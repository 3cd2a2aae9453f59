"""harness/flashinfer_decode.py on the CPU: FlashInfer's page table (indptr, indices, last page's length) made from the
kit's block table and lengths reads the rows the kit's own pools hold, checked against a stand-in of FlashInfer's
batch decode written from its documentation (its HND layout: the kit's); and without FlashInfer, one line says so."""

import math
import sys

import torch

from harness import flashinfer_decode
from harness.attention_math import attention_float64, expand_kv_heads
from tests.stand_in.flashinfer import installed


def test_the_kit_s_block_table_reads_the_same_rows_through_flashinfer_s_page_table(monkeypatch):
    installed(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    batch, heads, kv_heads, page_size, max_pages, head_dim = 3, 8, 2, 4, 5, 16
    lengths = [1, 20, 13]  # one position; every page full; the last page partly filled
    cache = torch.randn(2, batch, kv_heads, max_pages * page_size, head_dim, generator=gen)
    order = torch.randperm(batch * max_pages, generator=gen)
    pools = [flashinfer_decode.to_pages(c, page_size, order) for c in cache]
    table = order.view(batch, max_pages).to(torch.int32)
    q = torch.randn(batch, heads, 1, head_dim, generator=gen)
    scale = 1 / math.sqrt(head_dim)
    out = torch.full_like(q, math.nan)
    decode = flashinfer_decode.PagedDecode(pools[0].shape, table, lengths, heads, scale, torch.float32)
    decode(q, *pools, out)
    for b, n in enumerate(lengths):  # against the contiguous cache the pools were made from
        k, v = (expand_kv_heads(c[b:b + 1, :, :n], heads) for c in cache)
        assert torch.allclose(out[b:b + 1].double(), attention_float64(q[b:b + 1], k, v, False, scale)[0], atol=1e-6)


def test_without_flashinfer_one_line_says_it_was_not_timed(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # an import of it fails as when it is not installed
    said = flashinfer_decode.missing()
    assert "FlashInfer is not installed" in said and "[flashinfer]" in said, said
    installed(monkeypatch)
    if not torch.cuda.is_available():
        assert "runs on a GPU" in flashinfer_decode.missing()
