"""The masks beyond causal (Task 3, steps 9-12): their arguments checked once, and the documents' lookup.

Given: the kernels' masks are the student's work; this only turns the arguments into plain Python values and
says clearly what is wrong with one.

- window_left, a sliding window (Mistral; Gemma 2's local layers), with causal: query i sees the keys
  i + offset - window_left .. i + offset (window_left + 1 keys, its own position the last; offset = seq_k - seq_q).
- cu_seqlens, packed documents (FlashAttention-2's variable-length interface): the cumulative lengths
  0 = c_0 < c_1 < ... < c_n = seq of the documents packed in each row; a query sees the keys of its own
  document only (and with causal, only those up to its own position).
- softcap, soft-capped scores (Gemma 2): S = softcap * tanh(S / softcap), after the scale, before any mask.
"""

from __future__ import annotations

import bisect
import math

import torch


def check_masks(seq_q: int, seq_k: int, causal: bool, window_left=None, cu_seqlens=None, softcap=None):
    """(window_left, documents, softcap) as plain Python values (documents: the list of cu_seqlens), or a
    ValueError/TypeError naming the argument and what it must be."""
    if window_left is not None:
        if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < 0:
            raise ValueError(f"window_left must be None or an int >= 0 (the keys a query sees before its own), "
                             f"got {window_left!r}")
        if not causal:
            raise ValueError("window_left needs causal=True: the window is the window_left keys before a query's "
                             "own position, and the query's own")
    documents = None
    if cu_seqlens is not None:
        if isinstance(cu_seqlens, torch.Tensor):
            if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point() or cu_seqlens.is_complex():
                raise TypeError(f"cu_seqlens must be a 1-D integer tensor or a list of ints, got a "
                                f"{cu_seqlens.dim()}-D {cu_seqlens.dtype} tensor")
            cu_seqlens = cu_seqlens.tolist()
        if not isinstance(cu_seqlens, (list, tuple)) or not all(
                isinstance(c, int) and not isinstance(c, bool) for c in cu_seqlens):
            raise TypeError(f"cu_seqlens must be a list of ints (or a 1-D integer tensor), got {cu_seqlens!r}")
        documents = list(cu_seqlens)
        if seq_q != seq_k:
            raise ValueError(f"cu_seqlens packs documents into one sequence of queries and keys: it needs "
                             f"seq_q == seq_k, got {seq_q} and {seq_k}")
        if len(documents) < 2 or documents[0] != 0 or documents[-1] != seq_k or any(
                a >= b for a, b in zip(documents, documents[1:])):
            raise ValueError(f"cu_seqlens must rise from 0 to the sequence length {seq_k} (0 = c_0 < c_1 < ... < "
                             f"c_n = {seq_k}: each document at least one position), got {documents}")
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) \
                or softcap <= 0:
            raise ValueError(f"softcap must be None or a finite number > 0, got {softcap!r}")
        softcap = float(softcap)
    return window_left, documents, softcap


def document_of(documents: list[int], position: int) -> int:
    """The document that holds a position: d with documents[d] <= position < documents[d + 1]."""
    return bisect.bisect_right(documents, position) - 1


def document_ids(documents: list[int], device=None) -> torch.Tensor:
    """Each position's document, a (seq,) int64 tensor: 0 0 0 1 1 2 ... for cu_seqlens [0, 3, 5, ...]."""
    lengths = torch.tensor([b - a for a, b in zip(documents, documents[1:])], device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
