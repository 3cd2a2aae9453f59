"""What every `python -m taskN.test` shares: its command line, its cases and seeds, its worker.

A task's test is the trusted side: it makes the inputs, runs the reference, compares and
writes the record. It never imports student code; it asks the worker (harness/sandbox.py)
to run the entry points of taskN/entry.py.

Public cases are listed in each task's test.py. The grader adds `--hidden FILE` (its
grader/hidden.py, instructor-only): then that file's cases are added to each named part, and its
secret seed is mixed into every public seed, so memorising outputs does not help.
"""

from __future__ import annotations

import argparse
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from common.impl import REPO, add_solution_flag

# PyTorch warns when it cannot start CUDA (no driver, or the GPU's memory taken by another process) the first time
# it is asked whether a GPU is there; the tests answer that themselves ("needs a CUDA GPU", or the grader's
# machine verdict: grader/machine.py), so the warning would only read like a fault of the student's code.
warnings.filterwarnings("ignore", message="CUDA initialization", category=UserWarning)


def parser(task: int, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m task{task}.test", description=description)
    add_solution_flag(p, task, "test the reference solution instead of your code",
                      f"python -m task{task}.test tests your own files")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (the grader reads these)")
    p.add_argument("--student-dir", type=Path, default=REPO, metavar="DIR",
                   help="take the student's files from this checkout (default: this one)")
    p.add_argument("--scratch", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # the grader's scratch folder
    p.add_argument("--hidden", type=load_hidden, metavar="FILE", help=argparse.SUPPRESS)  # the grader's extra cases
    # the grader's run: it leaves out the slowest comparisons that are not scored (GRADING_LEAVES_OUT)
    p.add_argument("--grading", action="store_true", help=argparse.SUPPRESS)
    from common.tasks import TASKS

    if TASKS[task].cuda:
        p.add_argument("--sanitize", action="store_true",
                       help="only the compute-sanitizer pass: out-of-bounds accesses and races on small cases")
    return p


GRADING_LEAVES_OUT = ("the grader leaves out the slowest timings that are not scored ({what}): "
                      "python -m task{task}.test shows them")


def grading_leaves_out(report, args, task: int, what: str) -> bool:
    """Whether this run is a grading, which leaves a timing no point depends on to the student's own run (every
    grading of a class pays for each timed part with the GPU to itself); if so, a note says what was left out."""
    if args.grading:
        report.note(GRADING_LEAVES_OUT.format(task=task, what=what))
    return args.grading


@dataclass(frozen=True)
class Hidden:
    """The grader's hidden cases: a secret seed and, per task and part, shapes beyond the public ones."""

    secret_seed: int
    cases: dict


def load_hidden(path: str) -> Hidden:
    """The hidden cases in the file the grader names (grader/hidden.py): read here, so nothing in the
    tests imports the grader."""
    import importlib.util

    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{path}: no such file (the hidden cases, grader/hidden.py, are "
                                         "instructor-only)")
    spec = importlib.util.spec_from_file_location("hidden_cases", path)
    if spec is None or not path.endswith(".py"):
        raise argparse.ArgumentTypeError(f"{path}: not a Python file (the hidden cases are grader/hidden.py)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Hidden(module.SECRET_SEED, module.CASES)


def seed(public: int, hidden: Hidden | None) -> int:
    if not hidden:
        return public
    return (public * 1_000_003 + hidden.secret_seed) % (2**62)


def extra_cases(task: int, part: str, hidden: Hidden | None) -> list:
    return list(hidden.cases.get(task, {}).get(part, [])) if hidden else []


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@dataclass(frozen=True)
class Case:
    """One check's inputs: printed as its name in every report line, and its seed is explicit."""

    part: str
    shape: tuple
    causal: bool
    seed: int
    device: str = "cuda"
    label: str = ""  # the shape in words, e.g. "cpu batch 2 heads 3 seq 127x127 head_dim 32"

    @property
    def name(self) -> str:
        return f"{self.label}{' causal' if self.causal else ''}"


def cases(task: int, part: str, public: list, hidden: Hidden | None, shape_text, *, devices=("cuda",),
          causal=(False, True), causal_ok=lambda shape: True):
    """Every case of a part: shape x causal x device, the hidden shapes after the public ones.

    Seeds depend on the shape's position and the mask, and are mixed with the secret seed
    when graded, so a case's inputs are the same each run but unknown before grading.
    """
    shapes = list(public) + extra_cases(task, part, hidden)
    for device in devices:
        for i, shape in enumerate(shapes):
            for mask in causal:
                if mask and not causal_ok(shape):
                    continue
                label = shape_text(shape) if devices == ("cuda",) else f"{device} {shape_text(shape)}"
                yield Case(part, tuple(shape), mask, seed(100 * i + 10 * mask, hidden), device, label)


@contextmanager
def worker(report, task: int, args, **options):
    """The task's worker, started, or None once the report says why it could not start.

    A student file that does not import (a syntax error, an exception at import) is one
    failed check named "import"; no GPU for a CUDA task is a skip.
    """
    from harness import gpu_share
    from harness.records import NeedsCuda
    from harness.sandbox import Worker, WorkerDied, WorkerError
    from harness.view import sandbox_status
    from common.tasks import TASKS

    def skip(reason):
        def raise_it():
            raise NeedsCuda(reason)
        report.run("build", raise_it)

    report.sandbox = sandbox_status()
    gpu_share.join()  # the grader's other tasks run beside this one: their timed parts wait for its workers
    if TASKS[task].cuda and not torch.cuda.is_available():
        skip("no CUDA GPU is visible (torch.cuda.is_available() is False)")
        yield None
        return
    w = Worker(task, args.student_dir, solution=args.solution, scratch=args.scratch, **options)
    for note in w.file_notes:
        report.note(note)
    try:
        try:
            w.start()
        except WorkerError as err:
            if err.kind == "BuildError":
                report.add("build", False, err.message)
            elif err.kind == "KernelRuleError":
                report.add("own kernels: only the CUDA runtime and printf", False, err.message, kind="rule")
            elif err.kind == "NeedsCuda":
                skip(err.message)
            else:
                report.add("import", False, f"could not import your code: {err.kind}: {err.message}\n{err.trace}")
            yield None
            return
        except WorkerDied as err:
            report.add("import", False, f"could not start your code: {err}", cause=err.cause)
            yield None
            return
        yield w
    finally:
        w.__exit__(None, None, None)
        report.worker_notes = list(w.notes)
        report.attention_ops = set(w.attention_ops)
