"""The stand-in kernels as their builds' PyTorch operators, with the schemas taskN/binding.cpp registers."""

from __future__ import annotations

import functools
import re

import torch
from tests.stand_in.gpu import REPO
from tests.stand_in.kernels import StandInKernels, overlaps




# -- the kernels as operators ---------------------------------------------------------------

def binding_schemas(task: int) -> dict[str, str]:
    """The operators taskN/binding.cpp registers, {name: schema}, read from its KIT_OPERATORS block."""
    source = (REPO / f"task{task}" / "binding.cpp").read_text()
    block = re.search(r"^KIT_OPERATORS\(m\) \{\n(.*?)^\}", source, re.S | re.M).group(1)
    schemas = ["".join(re.findall(r'"([^"]*)"', literals))
               for literals in re.findall(r'm\.def\(((?:\s*"[^"]*")+)\s*\);', block)]
    found = {schema.split("(", 1)[0]: schema for schema in schemas}
    if len(found) != block.count("m.def(") or len(found) != len(schemas):  # a def this reader missed, or twice
        raise ValueError(f"task{task}/binding.cpp: {block.count('m.def(')} m.def calls in KIT_OPERATORS, {len(found)} "
                         "schemas read (write each as m.def(\"...\" \"...\"); with plain string literals only)")
    return found


_LIBRARIES: dict[str, torch.library.Library] = {}  # a namespace is defined once a process, then kept
_OPERATOR_MODULES: dict[str, StandInKernels] = {}  # the stand-in module each namespace's operators call now


OPERATOR_CALLS: dict[str, int] = {}  # "namespace.name": calls that reached a stand-in through its operator


def with_operators(module: StandInKernels, task: int, solution: bool, kernels: str | None = None) -> StandInKernels:
    """module, named and registered as a build of taskN/binding.cpp is: its functions are the operators
    torch.ops.taskN_stand_in_<student|solution>[_<kernels>].<name>, with the binding's schemas, for CPU tensors (a
    real build's namespace is taskN_student, taskN_solution or taskN_solution_<kernels>; these keep clear of them
    where a GPU run loads those)."""
    name = f"task{task}_stand_in_{'solution' if solution else 'student'}{f'_{kernels}' if kernels else ''}"
    module.__name__ = name
    _OPERATOR_MODULES[name] = module
    if name not in _LIBRARIES:
        library = torch.library.Library(name, "DEF")
        for op, schema in binding_schemas(task).items():
            library.define(schema)
            library.impl(op, functools.partial(_operator_call, name, op), "CPU")
        _LIBRARIES[name] = library
    return module


def _operator_call(namespace, op, *args):
    if op == "softmax" and overlaps(args[1], args[0]):  # the operator form's own rule (task2/binding.cpp)
        raise RuntimeError("out must not share memory with x in the operator form (the module's softmax takes out = x)")
    OPERATOR_CALLS[f"{namespace}.{op}"] = OPERATOR_CALLS.get(f"{namespace}.{op}", 0) + 1
    return getattr(_OPERATOR_MODULES[namespace], op)(*args)
