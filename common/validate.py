"""Input checks shared by every attention entry point, so bad input gets one clear error.

Errors name the argument and say what was expected; they are raised before any
work, so a wrong shape never turns into a silently wrong result.
"""

from __future__ import annotations

import torch


def check_tensor(t, name: str, dims: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")


def check_hidden(hidden_size: int, num_heads: int) -> int:
    """Returns head_dim."""
    if num_heads < 1 or hidden_size < 1:
        raise ValueError(f"hidden_size and num_heads must be positive, got {hidden_size} and {num_heads}")
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}: "
            "every head needs the same head_dim = hidden_size / num_heads"
        )
    return hidden_size // num_heads


def _check_same(tensors: dict, what: str, get) -> None:
    (first, t0), *rest = tensors.items()
    for name, t in rest:
        if get(t) != get(t0):
            raise ValueError(f"{name} has {what} {get(t)} but {first} has {get(t0)}")


def check_qkv(q, k, v, *, dims: int, seq_dim: int, causal: bool, hidden: int | None = None) -> None:
    """q, k, v with `dims` dimensions; seq at `seq_dim`; k and v alike; q matches all but seq."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        check_tensor(t, name, dims)
    named = {"query": q, "key": k, "value": v}
    _check_same(named, "device", lambda t: t.device)
    _check_same(named, "dtype", lambda t: t.dtype)
    if k.shape != v.shape:
        raise ValueError(f"key and value must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    for d in range(dims):
        if d != seq_dim and q.shape[d] != k.shape[d]:
            raise ValueError(
                f"query and key disagree in dimension {d}: {q.shape[d]} vs {k.shape[d]} "
                f"(shapes {tuple(q.shape)} and {tuple(k.shape)})"
            )
    if hidden is not None and q.shape[-1] != hidden:
        raise ValueError(f"query's last dimension is {q.shape[-1]}, but the layer's hidden_size is {hidden}")
    seq_q, seq_k = q.shape[seq_dim], k.shape[seq_dim]
    if seq_q < 1 or seq_k < 1:
        raise ValueError(f"sequence lengths must be at least 1, got query {seq_q} and key {seq_k}")
    if causal and seq_q > seq_k:
        raise ValueError(
            f"causal attention needs seq_q <= seq_k (the mask is aligned to the end), got {seq_q} > {seq_k}"
        )
