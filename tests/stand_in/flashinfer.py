"""A stand-in for FlashInfer's batch decode (harness/flashinfer_decode.py's one call into it), written from its
documentation, in PyTorch: `installed(monkeypatch)` makes `import flashinfer` find it for a test."""

import sys
import types

import torch

from harness.attention_math import attention_float64, expand_kv_heads


class FakeBatchDecode:
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper as documented: sequence b's pages are indices[indptr[b] ..
    indptr[b + 1]], all full but the last, which holds last_page_len[b] positions; pools (num_pages, kv_heads,
    page_size, head_dim) in the "HND" layout; q and out (batch, heads, head_dim)."""

    def __init__(self, workspace, kv_layout):
        assert kv_layout == "HND" and workspace.dtype == torch.uint8
        self.planned = None

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *, q_data_type,
             kv_data_type, sm_scale):
        assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
        assert len(indices) == int(indptr[-1]) and ((last_page_len >= 1) & (last_page_len <= page_size)).all()
        self.planned = (indptr.tolist(), indices, last_page_len.tolist(), num_qo_heads, num_kv_heads, head_dim,
                        page_size, sm_scale, q_data_type)

    def run(self, q, kv, out):
        indptr, indices, last, heads, kv_heads, head_dim, page_size, scale, dtype = self.planned
        k_pages, v_pages = kv
        assert q.shape == out.shape == (len(last), heads, head_dim) and q.dtype == dtype
        assert k_pages.shape[1:] == (kv_heads, page_size, head_dim)
        for b in range(len(last)):
            pages = indices[indptr[b]:indptr[b + 1]].long()
            n = (len(pages) - 1) * page_size + last[b]
            k, v = (p[pages].transpose(0, 1).reshape(kv_heads, -1, head_dim)[:, :n] for p in (k_pages, v_pages))
            k, v = (expand_kv_heads(t[None], heads)[0] for t in (k, v))
            out[b] = attention_float64(q[b][:, None], k, v, False, scale)[0][:, 0].to(out.dtype)


def installed(monkeypatch):
    """`import flashinfer` finds the stand-in until the test ends."""
    module = types.ModuleType("flashinfer")
    module.BatchDecodeWithPagedKVCacheWrapper = FakeBatchDecode
    monkeypatch.setitem(sys.modules, "flashinfer", module)
