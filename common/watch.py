"""Deterrents against PyTorch's own attention, inside the worker.

Runs where the student's code runs, so a determined student can switch it off: the
README calls it a deterrent, not a guarantee. Two layers:
- before the student's module is imported, PyTorch's attention entry points are replaced
  by functions that raise (and record the attempt);
- every call into student code runs under a dispatch mode that records PyTorch's attention
  operators however they were reached (torch.ops, a built name, a thread of the call).
The checks read what was recorded from each reply and gate the task on it.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

# substrings of operator names: aten's, and FlexAttention's higher-order operator (masks and scores of any kind,
# which Task 3's masks ask you to write)
ATTENTION_OPS = ("scaled_dot_product", "multi_head_attention", "flex_attention")
seen: set[str] = set()


class AttentionOpWatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(op in str(func) for op in ATTENTION_OPS):
            seen.add(str(func))
        return func(*args, **(kwargs or {}))


def _blocked(name: str):
    def refuse(*args, **kwargs):
        seen.add(name)
        raise RuntimeError(f"{name} is PyTorch's own attention, which this task asks you to write yourself")

    return refuse


_library = None  # kept alive: the kernels registered below last as long as it does


def block_pytorch_attention() -> None:
    """Make PyTorch's attention raise in this process, from Python and from the dispatcher."""
    global _library
    F.scaled_dot_product_attention = _blocked("torch.nn.functional.scaled_dot_product_attention")
    F.multi_head_attention_forward = _blocked("torch.nn.functional.multi_head_attention_forward")
    torch.nn.MultiheadAttention.forward = _blocked("torch.nn.MultiheadAttention")
    torch._C._nn.scaled_dot_product_attention = _blocked("torch._C._nn.scaled_dot_product_attention")
    try:
        from torch.nn.attention import flex_attention as flex
    except ImportError:  # a PyTorch before FlexAttention (2.5)
        flex = None
    if flex is not None:
        flex.flex_attention = _blocked("torch.nn.attention.flex_attention.flex_attention")
    # torch.ops.aten.* reach the same kernels: register ones that refuse, for both devices.
    _library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel" is the point
        for name in torch._C._dispatch_get_all_op_names():
            op = name.removeprefix("aten::")
            if name.startswith("aten::") and any(words in op for words in ATTENTION_OPS):
                for key in ("CPU", "CUDA"):
                    try:
                        _library.impl(op, _blocked(f"aten::{op}"), key)
                    except RuntimeError:
                        pass
