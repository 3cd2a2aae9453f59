"""Choose between the student's code and the reference solution.

`taskN/<name>.py` is the student's file; `taskN/solution/<name>.py` is the
reference. Every report line says which one ran, so a passing reference is never
mistaken for a passing student.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from torch.utils._python_dispatch import TorchDispatchMode

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


# PyTorch's own attention: a task that asks you to write attention must not call it.
PYTORCH_ATTENTION = ("scaled_dot_product_attention", "multi_head_attention_forward", "MultiheadAttention(")
PYTORCH_ATTENTION_OPS = ("scaled_dot_product", "multi_head_attention")


class AttentionOpWatch(TorchDispatchMode):
    """Records PyTorch's attention operators run while active, however they were reached."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(op in str(func) for op in PYTORCH_ATTENTION_OPS):
            self.seen.add(str(func))
        return func(*args, **(kwargs or {}))


def _code_lines(path: Path):
    comment = "#" if path.suffix == ".py" else "//"
    for number, line in enumerate(path.read_text().splitlines(), 1):
        yield number, line.split(comment)[0]


def borrowed_work(task: int, solution: bool, ops_seen=()) -> list[str]:
    """What in the student's files is not their own work: PyTorch's attention, or the reference solution."""
    if solution:
        return []
    found = [f"ran {op}" for op in sorted(ops_seen)]
    for path in student_files(task):
        rel = path.relative_to(REPO)
        for number, code in _code_lines(path):
            found += [f"{rel}:{number}: {name}" for name in PYTORCH_ATTENTION if name in code]
            if "solution" in code and ("import" in code or "#include" in code):
                found.append(f"{rel}:{number}: uses the reference solution")
    return found


def check_own_work(task: int, solution: bool, ops_seen=()):
    """A rule case: fails (and the task scores 0) if the student's code borrows the attention it should write."""
    found = borrowed_work(task, solution, ops_seen)
    if found:
        return False, "uses PyTorch's own attention or the reference solution, which this task asks you to " \
                      "write yourself: " + "; ".join(found), {}
    return True, "no PyTorch attention and no reference solution used", {}
