"""Choose between the student's code and the reference solution.

`taskN/<name>.py` is the student's file; `taskN/solution/<name>.py` is the
reference. Every report line says which one ran, so a passing reference is never
mistaken for a passing student.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def label(solution: bool) -> str:
    return "reference solution" if solution else "student code"


def has_solution(task: int) -> bool:
    """False in the student handout, which ships without solutions."""
    return (REPO / f"task{task}" / "solution").is_dir()


def load(task: int, name: str, solution: bool) -> ModuleType:
    if solution and not has_solution(task):
        raise SystemExit(
            f"--solution: this checkout has no reference solution for task {task} (it is the student handout)"
        )
    package = f"task{task}.solution" if solution else f"task{task}"
    return importlib.import_module(f"{package}.{name}")


def student_files(task: int) -> list[Path]:
    """The files students edit in a task: every skeleton generated from its solution/ folder."""
    folder = REPO / f"task{task}"
    return sorted(
        p for p in folder.rglob("*")
        if p.suffix in (".py", ".cu") and "solution" not in p.relative_to(folder).parts
        and p.name not in ("__init__.py", "test.py", "compile.py") and "__pycache__" not in p.parts
    )


# PyTorch's own attention: a task that asks you to write attention must not call these.
PYTORCH_ATTENTION = ("scaled_dot_product_attention", "multi_head_attention_forward", "MultiheadAttention(")


def forbidden_uses(task: int, solution: bool, names=PYTORCH_ATTENTION) -> list[str]:
    """'file:line: name' for each use of `names` in the student's files (none for the reference)."""
    if solution:
        return []
    found = []
    for path in student_files(task):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0].split("//")[0]
            found += [f"{path.relative_to(REPO)}:{number}: {name}" for name in names if name in code]
    return found


def check_no_pytorch_attention(task: int, solution: bool):
    """A report case: passes unless the student's files call PyTorch's attention."""
    uses = forbidden_uses(task, solution)
    if uses:
        return False, "calls PyTorch's own attention, which this task asks you to write: " + "; ".join(uses), {}
    return True, "no call to PyTorch's own attention", {}
