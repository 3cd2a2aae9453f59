"""Task 3: FlashAttention-2 in PyTorch: the forward pass (Algorithm 1 of Dao, 2023), the backward pass
(Algorithm 2, optional: steps 6-8, after it) and the masks beyond causal (optional: steps 9-12: a sliding
window, packed documents and soft-capped scores, in both passes).

Shapes: q is (batch, heads, seq_q, head_dim); k and v are (batch, heads, seq_k, head_dim).
The loop walks over query tiles of `block_rows` (Br) rows and, inside, key/value
tiles of `block_cols` (Bc) rows. It keeps, per query row, the running maximum m_i,
the running sum l_i and the unnormalised output acc, so it never holds more than
a (Br x Bc) block of scores: the full (seq_q x seq_k) matrix is never built.

Erratum: the paper's line 10 rescales the old output by diag(exp(m_old - m_new))^-1;
the inverse is wrong. Since m_new >= m_old, the factor exp(m_old - m_new) <= 1
itself shrinks what was accumulated under the old maximum.
"""

from __future__ import annotations

import math

import torch

from common.masks import check_masks, document_ids, document_of
from common.validate import check_qkv


def cap_scores(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """The scores soft-capped: softcap * tanh(S / softcap), or S itself without softcap (steps 3 and 8 call it)."""
    # BEGIN SOLUTION "step 11: soft-capping: softcap * tanh(S / softcap)"
    return s if softcap is None else softcap * torch.tanh(s / softcap)
    # SKELETON
    # if softcap is None:
    #     return s
    # raise NotImplementedError("see README, Task 3, step 11: soft-capping: softcap * tanh(S / softcap)")
    # END SOLUTION


def mask_tile(s: torch.Tensor, row_start: int, col_start: int, offset: int, causal: bool,
              window_left: int | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The tile of scores s (.., rows, cols) whose first query is row_start and first key col_start, with -inf
    where a query must not see a key (steps 3, 9 and 10; steps 3 and 8 call it)."""
    row_end, col_end = row_start + s.shape[-2], col_start + s.shape[-1]
    rows = torch.arange(row_start, row_end, device=s.device)[:, None]
    cols = torch.arange(col_start, col_end, device=s.device)[None, :]
    # BEGIN SOLUTION "step 3: the causal mask: -inf where a key is in a query's future"
    if causal and col_end - 1 > row_start + offset:  # only tiles that cross the diagonal need a mask
        s = s.masked_fill(cols > rows + offset, -math.inf)
    # END SOLUTION
    # BEGIN SOLUTION "step 9: the sliding window: -inf where a key is before a query's window"
    if window_left is not None and col_start < row_end - 1 + offset - window_left:  # the tile crosses its edge
        s = s.masked_fill(cols < rows + offset - window_left, -math.inf)
    # SKELETON
    # if window_left is not None:
    #     raise NotImplementedError("see README, Task 3, step 9: the sliding window: -inf where a key is before a query's window")
    # END SOLUTION
    # BEGIN SOLUTION "step 10: packed documents: -inf where a key is in another document than its query"
    if doc_ids is not None:
        row_docs, col_docs = doc_ids[rows], doc_ids[cols]
        s = s.masked_fill(row_docs != col_docs, -math.inf)
    # SKELETON
    # if doc_ids is not None:
    #     raise NotImplementedError("see README, Task 3, step 10: packed documents: -inf where a key is in another document than its query")
    # END SOLUTION
    return s


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_rows: int = 64,
    block_cols: int = 64,
    return_lse: bool = False,
    window_left: int | None = None,
    cu_seqlens=None,
    softcap: float | None = None,
):
    """softmax(q k^T / sqrt(d) + mask) v, tile by tile. Returns out, or (out, lse) with lse (batch, heads, seq_q).

    Causal masking is aligned to the end: query i sees key j when j <= i + (seq_k - seq_q).
    The masks beyond causal (optional, steps 9-12; common/masks.py): window_left, a sliding window (with causal:
    query i sees keys i + offset - window_left .. i + offset); cu_seqlens, packed documents (0 = c_0 < c_1 < ...
    < c_n = seq: a query sees the keys of its own document only); softcap, scores softcap * tanh(S / softcap).
    """
    check_qkv(q, k, v, dims=4, seq_dim=2, causal=causal)
    if block_rows < 1 or block_cols < 1:
        raise ValueError(f"block_rows and block_cols must be positive, got {block_rows} and {block_cols}")
    seq_q, seq_k, head_dim = q.shape[2], k.shape[2], q.shape[3]
    window_left, documents, softcap = check_masks(seq_q, seq_k, causal, window_left, cu_seqlens, softcap)
    doc_ids = None if documents is None else document_ids(documents, q.device)  # each position's document
    scale = 1.0 / math.sqrt(head_dim)
    offset = seq_k - seq_q  # query i is aligned with key i + offset
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=q.dtype, device=q.device)

    for row_start in range(0, seq_q, block_rows):
        row_end = min(row_start + block_rows, seq_q)
        # BEGIN SOLUTION "step 1: load the query tile Q_i and start m_i = -inf, l_i = 0, acc = 0"
        q_i = q[:, :, row_start:row_end]  # (B, H, Br, d)
        m_i = torch.full(q_i.shape[:3], -math.inf, dtype=q.dtype, device=q.device)  # running max
        l_i = torch.zeros(q_i.shape[:3], dtype=q.dtype, device=q.device)  # running sum of exp
        acc = torch.zeros_like(q_i)  # unnormalised output
        # END SOLUTION

        # BEGIN SOLUTION "step 2: stop the key loop after the last tile a causal query tile can see"
        # With a causal mask the last row of this tile sees keys up to row_end - 1 + offset;
        # later tiles are entirely masked, so they are skipped rather than computed.
        col_stop = min(seq_k, row_end + offset) if causal else seq_k
        # SKELETON
        # col_stop = seq_k
        # END SOLUTION
        col_begin = 0
        # BEGIN SOLUTION "step 9: begin the key loop at the tile of the first key the tile's first query's window holds"
        if window_left is not None:  # the tile's first query has the earliest window
            col_begin = max(0, row_start + offset - window_left) // block_cols * block_cols
        # SKELETON
        # if window_left is not None:
        #     raise NotImplementedError("see README, Task 3, step 9: begin the key loop at the tile of the first key the tile's first query's window holds")
        # END SOLUTION
        # BEGIN SOLUTION "step 10: the key loop from the first query's document to the end of the last query's"
        if documents is not None:
            col_begin = max(col_begin, documents[document_of(documents, row_start)] // block_cols * block_cols)
            col_stop = min(col_stop, documents[document_of(documents, row_end - 1) + 1])
        # SKELETON
        # if documents is not None:
        #     raise NotImplementedError("see README, Task 3, step 10: the key loop from the first query's document to the end of the last query's")
        # END SOLUTION
        for col_start in range(col_begin, col_stop, block_cols):
            col_end = min(col_start + block_cols, seq_k)
            k_j, v_j = k[:, :, col_start:col_end], v[:, :, col_start:col_end]  # (B, H, Bc, d)
            # BEGIN SOLUTION "step 3: scores S_ij = scale * Q_i K_j^T, through cap_scores, then mask_tile"
            s_ij = cap_scores((q_i @ k_j.transpose(-2, -1)) * scale, softcap)  # (B, H, Br, Bc)
            s_ij = mask_tile(s_ij, row_start, col_start, offset, causal, window_left, doc_ids)
            # END SOLUTION

            # BEGIN SOLUTION "step 4: online softmax: new max, rescale l_i and acc by exp(m_old - m_new), add P_ij V_j"
            m_new = torch.maximum(m_i, s_ij.amax(dim=-1))
            # A row that has seen no key yet (its window or document starts in a later tile: steps 9-10) has
            # m_new = -inf, and exp(-inf - (-inf)) is NaN: such a row subtracts 0 instead (its p_ij and correction
            # are then 0). m_i itself stays -inf until the row sees a key.
            m_sub = m_new.masked_fill(m_new == -math.inf, 0.0)
            p_ij = torch.exp(s_ij - m_sub[..., None])  # (B, H, Br, Bc), unnormalised probabilities
            correction = torch.exp(m_i - m_sub)  # <= 1: what was summed under the old max shrinks
            l_i = correction * l_i + p_ij.sum(dim=-1)
            acc = correction[..., None] * acc + p_ij @ v_j
            m_i = m_new
            # END SOLUTION

        # BEGIN SOLUTION "step 5: normalise, O_i = acc / l_i, and save the log-sum-exp L_i = m_i + log(l_i)"
        out[:, :, row_start:row_end] = acc / l_i[..., None]
        lse[:, :, row_start:row_end] = m_i + torch.log(l_i)
        # END SOLUTION

    return (out, lse) if return_lse else out


# -- the backward pass (optional: README, Task 3, steps 6-8) -------------------------------------------------


def flash_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    causal: bool = False,
    block_rows: int = 64,
    block_cols: int = 64,
    window_left: int | None = None,
    cu_seqlens=None,
    softcap: float | None = None,
):
    """dq, dk, dv of out = flash_attention(q, k, v, causal, ...) for d_out = dLoss/d out (Algorithm 2 of the paper),
    with the same masks (steps 9-12).

    Tile by tile, as the forward pass: each tile of the probabilities P is computed again from the saved
    log-sum-exp (P_ij = exp(S_ij - L_i)), so neither the full score matrix nor P is ever held. The outer loop
    walks the key/value tiles, whose dK_j and dV_j it sums over the query tiles of the inner loop; dQ_i
    collects a part from every key tile.
    """
    check_qkv(q, k, v, dims=4, seq_dim=2, causal=causal)
    if block_rows < 1 or block_cols < 1:
        raise ValueError(f"block_rows and block_cols must be positive, got {block_rows} and {block_cols}")
    seq_q, seq_k, head_dim = q.shape[2], k.shape[2], q.shape[3]
    window_left, documents, softcap = check_masks(seq_q, seq_k, causal, window_left, cu_seqlens, softcap)
    doc_ids = None if documents is None else document_ids(documents, q.device)
    scale = 1.0 / math.sqrt(head_dim)
    offset = seq_k - seq_q  # query i is aligned with key i + offset
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    # BEGIN SOLUTION "step 7: D_i = rowsum(dO_i * O_i), once for all tiles"
    delta = (d_out * out).sum(dim=-1)  # D: (B, H, seq_q), what softmax's gradient subtracts, once per row
    # SKELETON
    # delta = torch.zeros_like(lse)
    # END SOLUTION

    for col_start in range(0, seq_k, block_cols):
        col_end = min(col_start + block_cols, seq_k)
        k_j, v_j = k[:, :, col_start:col_end], v[:, :, col_start:col_end]  # (B, H, Bc, d)
        dk_j, dv_j = torch.zeros_like(k_j), torch.zeros_like(v_j)
        # BEGIN SOLUTION "step 7: with a causal mask, start at the first query tile this key tile reaches"
        # With a causal mask, query i sees key col_start only from i = col_start - offset on: the query tiles
        # before that one are entirely masked for this key tile, so they are skipped.
        row_begin = max(0, col_start - offset) // block_rows * block_rows if causal else 0
        # SKELETON
        # row_begin = 0
        # END SOLUTION
        row_stop = seq_q
        # BEGIN SOLUTION "step 12: the query tiles a key tile's window and documents reach, and no others"
        if window_left is not None:  # key j is in the window of queries j - offset .. j - offset + window_left
            row_stop = min(seq_q, col_end - offset + window_left)
        if documents is not None:
            row_begin = max(row_begin, documents[document_of(documents, col_start)] // block_rows * block_rows)
            row_stop = min(row_stop, documents[document_of(documents, col_end - 1) + 1])
        # SKELETON
        # if window_left is not None or documents is not None:
        #     raise NotImplementedError("see README, Task 3, step 12: the query tiles a key tile's window and documents reach, and no others")
        # END SOLUTION
        for row_start in range(row_begin, row_stop, block_rows):
            row_end = min(row_start + block_rows, seq_q)
            q_i, do_i = q[:, :, row_start:row_end], d_out[:, :, row_start:row_end]  # (B, H, Br, d)
            lse_i, delta_i = lse[:, :, row_start:row_end], delta[:, :, row_start:row_end]  # (B, H, Br)
            # BEGIN SOLUTION "step 8: S_ij as in step 3, P_ij = exp(S_ij - L_i), dV_j, dP_ij, dS_ij (cap_gradient), the parts of dQ_i and dK_j"
            s_ij = cap_scores((q_i @ k_j.transpose(-2, -1)) * scale, softcap)  # (B, H, Br, Bc)
            # s_ij itself stays unmasked: cap_gradient below takes the capped scores, and a masked -inf would make
            # its slope -inf (0 * -inf is NaN)
            p_ij = torch.exp(mask_tile(s_ij, row_start, col_start, offset, causal, window_left, doc_ids)
                             - lse_i[..., None])  # the forward's probabilities, normalised by L_i
            dv_j += p_ij.transpose(-2, -1) @ do_i
            dp_ij = do_i @ v_j.transpose(-2, -1)  # (B, H, Br, Bc)
            ds_ij = p_ij * (dp_ij - delta_i[..., None])  # softmax's gradient: P * (dP - rowsum(P * dP)), D_i that sum
            ds_ij = cap_gradient(ds_ij, s_ij, softcap)  # through the cap, back to the scaled scores
            dq[:, :, row_start:row_end] += (ds_ij @ k_j) * scale
            dk_j += (ds_ij.transpose(-2, -1) @ q_i) * scale
            # END SOLUTION
        dk[:, :, col_start:col_end] = dk_j
        dv[:, :, col_start:col_end] = dv_j
    return dq, dk, dv


def cap_gradient(ds: torch.Tensor, s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """dS through the cap (step 8 calls it): the gradient with respect to the scores before cap_scores, given the
    capped scores s, before mask_tile (a masked -inf has no slope: 1 - inf is -inf, and 0 * -inf is NaN); ds itself
    without softcap."""
    # BEGIN SOLUTION "step 12: through the cap: d(softcap * tanh(x / softcap)) / dx = 1 - (S / softcap)^2"
    return ds if softcap is None else ds * (1 - (s / softcap) ** 2)
    # SKELETON
    # if softcap is None:
    #     return ds
    # raise NotImplementedError("see README, Task 3, step 12: through the cap: d(softcap * tanh(x / softcap)) / dx = 1 - (S / softcap)^2")
    # END SOLUTION


class FlashAttention(torch.autograd.Function):
    """flash_attention as a PyTorch operation with a gradient: the forward pass saves q, k, v, the output and the
    log-sum-exp (one number per query row, never P), and the backward pass is flash_attention_backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_rows=64, block_cols=64, masks=None):
        # BEGIN SOLUTION "step 6: run the forward, and save q, k, v, out and the log-sum-exp for the backward"
        masks = masks or {}  # the masks beyond causal (steps 9-12): window_left, cu_seqlens, softcap
        out, lse = flash_attention(q, k, v, causal, block_rows, block_cols, return_lse=True, **masks)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_rows, ctx.block_cols, ctx.masks = causal, block_rows, block_cols, masks
        return out
        # END SOLUTION

    @staticmethod
    def backward(ctx, d_out):
        # BEGIN SOLUTION "step 6: the backward: dq, dk, dv from the saved tensors (None for the other arguments)"
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, d_out, ctx.causal, ctx.block_rows, ctx.block_cols,
                                              **ctx.masks)
        return dq, dk, dv, None, None, None, None  # no gradient for causal, the tile sizes and the masks
        # END SOLUTION


def flash_attention_trainable(q, k, v, causal: bool = False, block_rows: int = 64, block_cols: int = 64, **masks):
    """flash_attention that autograd can differentiate (given); masks: window_left, cu_seqlens, softcap (steps 9-12)."""
    if isinstance(masks.get("cu_seqlens"), torch.Tensor):  # kept on ctx, where a tensor would be one more saved
        masks["cu_seqlens"] = masks["cu_seqlens"].tolist()
    return FlashAttention.apply(q, k, v, causal, block_rows, block_cols, masks)
