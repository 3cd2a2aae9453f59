"""Student code or the reference solution, and the rule that the student's work is their own.

`taskN/<name>` is the student's file; `taskN/solution/<name>` is the reference. Every
report line says which one ran, so a passing reference is never mistaken for a passing
student.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The line a skeleton (harness/skeleton.py) puts where a student has a step to write
TODO = re.compile(r"TODO \(README, Task (?P<task>\d+), (?P<step>step \d+: .*)\)$")

# PyTorch's own attention: a task that asks you to write attention must not call it.
PYTORCH_ATTENTION = ("scaled_dot_product_attention", "multi_head_attention_forward", "MultiheadAttention(",
                     "flex_attention")


def label(solution: bool) -> str:
    return "reference solution" if solution else "student code"


def source_of(rel: str, student_dir: Path, solution: bool) -> Path:
    """Where a file students write is read from: the student's `rel`, or the reference's copy of it.

    The one place that decides it (the worker's view, the sanitizer's quotes, the tuner's copies).
    """
    if not solution:
        return Path(student_dir) / rel
    head, rest = rel.split("/", 1)  # task4/kernels/attention.cu -> task4/solution/kernels/attention.cu
    return REPO / head / "solution" / rest


def has_solution(task: int) -> bool:
    """False in the student handout, which ships without solutions."""
    return (REPO / f"task{task}" / "solution").is_dir()


def add_solution_flag(parser, task: int, help: str, instead: str) -> None:
    """`--solution` where the checkout has task `task`'s reference; in the students' handout the flag is not
    offered, and given anyway it names what to run instead (`instead`) rather than fail on a missing folder."""
    import argparse

    if has_solution(task):
        parser.add_argument("--solution", action="store_true", help=help)
        return

    class NoSolution(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            parser.error(f"--solution: this checkout has no reference solution (the students' handout leaves it "
                         f"out); {instead}")

    parser.add_argument("--solution", nargs=0, action=NoSolution, default=False, help=argparse.SUPPRESS)


def borrowed_work(task: int, student_dir: Path, attention_ops=()) -> list[str]:
    """What is not the student's own work: PyTorch's attention (run, or named in a student file) or the reference.

    The scan reads the student's files as the checks received them, decoding any bytes; the
    operators come from the worker's watch (common/watch.py), a deterrent the README names.
    """
    from common.tasks import student_files

    found = [f"ran {op}" for op in sorted(attention_ops)]
    for rel in student_files(task):
        path = Path(student_dir) / rel
        if not path.is_file() or path.is_symlink():
            continue
        comment = "#" if path.suffix == ".py" else "//"
        text = path.read_bytes()[:2_000_000].decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            code = line.split(comment)[0]
            found += [f"{rel}:{number}: {name}" for name in PYTORCH_ATTENTION if name in code]
            if any(name in code for name in BORROWED_MODULES) and ("import" in code or "#include" in code):
                found.append(f"{rel}:{number}: uses the reference solution or the checks' own attention")
    return found


# The reference solutions, and the checks' own attention (the float64 one, harness/attention_math.py's
# attention_float64; the diagnoses' wrong-on-purpose versions; the kernels' PyTorch stand-in): importing one is not
# writing it.
BORROWED_MODULES = ("solution", "reference", "attention_math", "attention_float64", "diagnose", "torch_kernels")


def check_own_work(task: int, solution: bool, student_dir: Path, attention_ops=()):
    """A rule case: fails (and the task scores 0) if the student's code borrows the attention it should write."""
    found = [] if solution else borrowed_work(task, student_dir, attention_ops)
    if found:
        return False, "uses PyTorch's own attention or the reference solution, which this task asks you to " \
                      "write yourself: " + "; ".join(found[:10]), {}
    return True, "none found in your code", {}


def remaining_todos(path: Path) -> list[str]:
    """The README steps a student file still marks as TODO, e.g. ['step 2: ...']. Here, not in harness/, as the
    worker runs it too (task4/attention.py's uses_hopper)."""
    if not path.is_file() or path.is_symlink():
        return []
    text = path.read_bytes()[:2_000_000].decode("utf-8", errors="replace")  # a student's file: any bytes
    return [m["step"] for m in map(TODO.search, text.splitlines()) if m]
