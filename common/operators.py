"""A build's kernels as PyTorch operators: torch.ops.<extension name>.<function>.

Given: not graded. Each task's binding (taskN/binding.cpp) registers its functions twice: in the pybind11 module
the tests call (`ext.forward(...)`), and as operators with a schema (common/csrc/operators.h). An operator is what
torch.compile can trace without breaking its graph, and what torch.library.opcheck tests. Tracing runs an
operator on fake tensors (shapes, no data): every one here writes into the arguments its schema marks and returns
nothing, so its fake implementation has nothing to compute, and `operators()` registers that once per build.
"""

from __future__ import annotations

import torch

# What each task's binding registers as operators (their schemas are in the binding, after its module).
OPERATORS = {
    2: ("softmax", "gemm_nt", "gemm_nn", "attention"),
    4: ("forward", "forward_half", "forward_hopper", "forward_masks", "forward_lse", "backward"),
    5: ("update_cache", "update_cache_half", "decode", "decode_half", "update_cache_paged", "decode_paged",
        "update_cache_paged_half", "decode_paged_half", "linear"),
}

_faked: set[str] = set()


def _writes_only(*args, **kwargs) -> None:
    """The fake implementation: the operator writes into tensors it was given and makes none."""
    return None


def task_of(ext) -> int:
    """The task an extension was built for, from its name (task4_student, task5_solution, ...)."""
    name = getattr(ext, "__name__", "")
    if not (name.startswith("task") and name[4:5].isdigit() and int(name[4]) in OPERATORS):
        raise ValueError(f"{name!r} is not a task's kernel extension (task2_..., task4_... or task5_...)")
    return int(name[4])


def operators(ext):
    """torch.ops.<ext's name>: the build's operators, each with its fake implementation registered."""
    name = ext.__name__
    namespace = getattr(torch.ops, name)
    if name not in _faked:
        for op in OPERATORS[task_of(ext)]:
            torch.library.register_fake(f"{name}::{op}")(_writes_only)
        _faked.add(name)
    return namespace


def registered(ext) -> bool:
    """Whether ext is a build that registered its operators (a kernel module stand-in, or a build of a binding from
    before them, did not)."""
    name = getattr(ext, "__name__", "")
    try:
        task = task_of(ext)
    except ValueError:
        return False
    return hasattr(getattr(torch.ops, name), OPERATORS[task][0])


def function(ext, name: str):
    """ext's function `name` as the wrappers call it: the pybind11 function, or, while torch.compile traces, the same
    function as a registered operator (its fake registered by TaskExtension when it loaded the build), which it
    records in its graph instead of breaking the graph there. Eager calls (every check and timing of the tests)
    stay as they were."""
    if torch.compiler.is_compiling() and getattr(ext, "__name__", "") in _faked and name in OPERATORS[task_of(ext)]:
        return getattr(getattr(torch.ops, ext.__name__), name)
    return getattr(ext, name)  # eager, a build without fakes, or a function that is no operator (has_half, ...)
