"""The command line every `python -m taskN.test` shares, and its test cases' seeds.

Public cases are listed in each task's test.py. The grader adds `--hidden`: then
`grader/hidden.py` (not in the student handout) adds more cases, and its secret
seed is mixed into every public seed, so memorising outputs does not help.
"""

from __future__ import annotations

import argparse
import importlib

import torch


def parser(task: int, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m task{task}.test", description=description)
    p.add_argument("--solution", action="store_true", help="test the reference solution instead of your code")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (the grader reads these)")
    p.add_argument("--hidden", action="store_true", help=argparse.SUPPRESS)  # the grader's extra cases
    return p


def hidden_module():
    try:
        return importlib.import_module("grader.hidden")
    except ModuleNotFoundError:
        raise SystemExit("--hidden: this checkout has no hidden cases (grader/hidden.py is instructor-only)")


def seed(public: int, hidden: bool) -> int:
    if not hidden:
        return public
    return (public * 1_000_003 + hidden_module().SECRET_SEED) % (2**62)


def extra_cases(task: int, hidden: bool) -> list:
    return list(hidden_module().CASES.get(task, [])) if hidden else []


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def student_module(report, task: int, name: str, solution: bool):
    """Import taskN/<name>.py (or the reference); a file that does not import is a failed case, not a crash."""
    from common import impl

    try:
        return impl.load(task, name, solution)
    except Exception as err:  # SyntaxError, ImportError, anything the module runs at import time
        report.add("import", False, f"could not import task{task}/{'solution/' if solution else ''}{name}.py: "
                   f"{type(err).__name__}: {err}")
        return None


def cuda_extension(report, load):
    """The task's compiled extension from `load()`, or None once the report says why not.

    No GPU is a skip (the task needs one), not a failure; a build error is a failure.
    """
    from common.build import BuildError
    from common.records import NeedsCuda

    def no_gpu():
        raise NeedsCuda("no CUDA GPU is visible (torch.cuda.is_available() is False)")

    if not torch.cuda.is_available():
        report.run("build", no_gpu)
        return None
    try:
        return load()
    except BuildError as err:
        report.add("build", False, str(err))
        return None
