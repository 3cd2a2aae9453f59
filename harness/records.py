"""Result records: what a task's test found, as JSON the grader reads.

A `Report` collects one entry per check or benchmark case. It prints one line per
case as it goes (with which implementation ran), turns a skeleton's
NotImplementedError into 'not implemented yet: see README, Task N, step K', and at
the end writes the JSON record (`--json PATH`) and returns the exit code.
"""

from __future__ import annotations

import atexit
import json
import math
import platform
import re
import signal
import subprocess
import threading
import time
import weakref
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from harness.checks import CheckResult, index_ranges
from common.impl import REPO, label, remaining_todos
from harness.outcome import Cause, Kind, Status
from harness.sandbox import WorkerDied, WorkerError
from common.wire import short_traceback
from common.tasks import student_files

# the lines that are not checks, counted apart so the summary adds up to the lines shown
TODO_HINT = "; delete a step's TODO line once you have written it"  # said once, when the run ends
SHOW_NAMES = 3  # how many more cases a line of failures (or of passes) names
KIND_WORDS = {Kind.RULE: ("rule", "rules"), Kind.BENCHMARK: ("benchmark", "benchmarks"),
              Kind.GIVEN: ("check of given code", "checks of given code"),
              Kind.OPTIONAL: ("optional check", "optional checks")}


class NeedsCuda(Exception):
    """Raised when a check cannot run on this machine because it has no CUDA GPU."""


@dataclass
class Case:
    name: str
    kind: str  # harness.outcome.Kind: check, optional, benchmark, rule or given
    passed: bool
    message: str
    metrics: dict = field(default_factory=dict)
    cause: str | None = None  # harness.outcome.Cause, where a failure is more than a wrong answer
    seconds: float | None = None  # since the case before it was recorded (its builds and workers included)


def environment() -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.machine()})",
        "commit": _commit(),
    }
    return env


def _commit() -> str | None:
    """The checkout's commit, marked when the files differ from it: a copy of a working tree can
    carry the git metadata of an older commit, and the record must not claim that commit's code."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)

    try:
        commit = git("rev-parse", "--short", "HEAD").stdout.strip()
        # Results.md is the grader's own output: rewriting it does not change what was graded
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!Results.md").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit} with changes not committed" if commit and changed else commit or None


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def step_number(step: str) -> int:
    """2 for 'step 2: split the heads', as common/impl.py's remaining_todos gives the steps."""
    return int(step.split(":")[0].removeprefix("step "))


class Report:
    def __init__(self, task: int, solution: bool, title: str, student_dir: Path = REPO):
        self.task = task
        self.solution = solution
        self.student_dir = Path(student_dir)
        self.sandbox: str | None = None  # how the worker was isolated (harness/view.py)
        self.worker_notes: list[str] = []
        self.attention_ops: set[str] = set()
        self.cases: list[Case] = []
        self.not_implemented: str | None = None
        self.needs_cuda: str | None = None
        self.notes: list[str] = []
        self.part_steps: tuple[int, ...] | None = None  # README steps of the part under test, if any
        self.part_kind = Kind.CHECK  # what the cases of the part under test count as
        self.parts = self.missing_parts = self.part_start = 0
        self.missing_message: str | None = None  # the first part's missing step
        self.missing_step: int | None = None  # the step of not_implemented
        self.missing_steps: dict[int, str] = {}  # steps that ended parts found missing, and what they said
        self.carried = False  # the part under test waits for a step an earlier part found missing
        self.passed_steps: set[int] = set()  # steps of parts that passed: a TODO line left on them is not the cause
        self.asked_steps: set[int] | None = None  # the steps of the parts a run asked for (--half), if not all
        self.hint_said = False  # TODO_HINT, said with the first step found missing
        self.said = 0  # cases before this one have been printed (_say_checks)
        self.last_added = time.perf_counter()  # when the last case was recorded (Case.seconds)
        print(f"Task {task}: {title} — {label(solution)}")
        # Checks are printed when their part ends: a run stopped before that (Ctrl-C, the grader's time
        # limit, which sends SIGTERM first) still prints the ones it finished
        atexit.register(lambda said=weakref.WeakMethod(self._say_checks): said() and said()())
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _stop_on_sigterm)

    # -- recording -------------------------------------------------------------
    def add(self, name: str, passed: bool, message: str, metrics: dict | None = None, kind: str = Kind.CHECK,
            cause: str | None = None):
        assert kind in Kind.ALL and cause in (None, *Cause.ALL), (kind, cause)
        now = time.perf_counter()  # where a grading's time goes, for the instructor (Case.seconds)
        self.cases.append(Case(name, kind, passed, message, metrics or {}, cause, round(now - self.last_added, 2)))
        self.last_added = now
        if kind in (Kind.CHECK, Kind.OPTIONAL):
            return  # said with the others of its part, once they are done (_say_checks)
        self._say_checks()
        mark = ("INFO" if passed else "FAIL") if kind == Kind.BENCHMARK else "PASS" if passed else "FAIL"
        print(f"  [{mark}] {name}: {message}")

    def _say_checks(self) -> None:
        """Print the checks recorded since the last call. All passed: a line each. Otherwise the failures
        lead, one line per kind of failure (the same diagnosis, or the same words with other numbers)
        with how many failed so, then the first such case in full and the names of a few more, and
        last the passed ones in one line: what is wrong is in the first lines, however many cases fail."""
        checks = [c for c in self.cases[self.said:] if c.kind in (Kind.CHECK, Kind.OPTIONAL)]
        self.said = len(self.cases)
        failed = [c for c in checks if not c.passed]
        if not failed:
            for c in checks:
                print(f"  [PASS] {c.name}: {c.message}")
            return
        optional = "optional " if all(c.kind == Kind.OPTIONAL for c in checks) else ""
        for group in failure_groups([c.message for c in failed]):
            same = [failed[i] for i in group]
            first, lead = same[0], lead_of(same[0].message)
            if len(same) == 1 and not lead:
                print(f"  [FAIL] {first.name}: {first.message}")
                continue
            count = f"{len(same)} of {len(checks)} {optional}checks"
            if lead:
                print(f"  [FAIL] {count}: {lead}")
                print(f"      the first, {first.name}: {first.message[len(lead):].strip()}")
            else:
                print(f"  [FAIL] {count} fail the same way; the first, {first.name}: {first.message}")
            if len(same) > 1:
                names = [c.name for c in same[1:1 + SHOW_NAMES]]
                more = len(same) - 1 - len(names)
                print(f"      also: {'; '.join(names)}{f'; and {more} more' if more else ''}")
        passed = [c for c in checks if c.passed]
        if passed:
            names = [c.name for c in passed[:SHOW_NAMES]]
            more = len(passed) - len(names)
            print(f"  [PASS] {len(passed)} of {len(checks)} {optional}checks: {'; '.join(names)}"
                  f"{f'; and {more} more' if more else ''}")

    def note(self, message: str) -> None:
        self._say_checks()
        self.notes.append(message)
        print(f"  note: {message}")

    def process_died_since(self, before: int, what: str) -> bool:
        """Whether a case after the first `before` ended the process running the student's code (a crash or a
        hang); if so, a note says the rest of `what` was not run: its cases would wait as long."""
        died = [c for c in self.cases[before:] if c.cause is not None]
        if died:
            self.note(f"the rest of {what} was not run: {died[0].name} ended the process running your code")
        return bool(died)

    @property
    def stopped(self) -> bool:
        """True once a skeleton step was found missing: later cases would fail the same way."""
        return self.not_implemented is not None

    def run(self, name: str, fn, kind: str | None = None):
        """Run one case. `fn` returns a CheckResult, or (passed, message, metrics[, cause]).

        An exception fails this case only. A step that is not written yet (a
        NotImplementedError, or an output the kernel never touched) stops the run
        while the student's files still mark steps TODO and nothing has passed,
        since every later case would fail the same way; see `_missing`.
        """
        if self.stopped:
            return None
        kind = kind or self.part_kind
        try:
            result = fn()
        except WorkerError as err:  # the student's code raised
            if err.kind == "NotImplementedError":
                return self._missing(name, kind, f"raised NotImplementedError: {err.message}")
            trace = "    " + err.trace.strip().replace("\n", "\n    ") if err.trace.strip() else ""
            self.add(name, False, f"raised {err.kind}: {err.message}\n{trace}".rstrip(), kind=kind)
            return None
        except WorkerDied as err:
            self.add(name, False, str(err), kind=kind, cause=err.cause)
            return None
        except NeedsCuda as err:
            self.needs_cuda = str(err)
            self._say_checks()
            print(f"  [SKIP] {name}: {err}")
            return None
        except Exception as err:  # the checks' own code failed on what the worker returned: this case only
            self.add(name, False, f"raised {type(err).__name__}: {err}\n{_short_traceback(err)}", kind=kind)
            return None
        if isinstance(result, CheckResult):
            if result.untouched:
                return self._missing(name, kind, result.message)
            self.add(name, result.passed, result.message, result.metrics(), kind)
        else:  # (passed, message, metrics), or with a Cause after them
            passed, message, metrics, *cause = result
            self.add(name, passed, message, metrics, kind, cause=cause[0] if cause else None)
        return result

    def begin_part(self, name: str, steps: tuple[int, ...], optional: bool = False) -> None:
        """Start an independently graded part (README steps `steps`), e.g. Task 2's softmax.

        An optional part's cases are reported but not scored, and do not decide the status.
        """
        self.part_steps = steps
        self._say_checks()
        self.part_start = len(self.cases)
        # A step an earlier part found missing is missing here too: its cases return at once
        # rather than build kernels to find the same TODO (tasks 6 and 7 run their GPU part on
        # the steps of their CPU part; task 5's layer runs steps 1 and 2).
        carried = next(((step, said) for step, said in self.missing_steps.items() if step in steps), None)
        if carried:
            self.missing_step, self.not_implemented = carried
        self.carried = carried is not None
        self.part_kind = Kind.OPTIONAL if optional else Kind.CHECK
        self.parts += not optional
        print(f" {name}{' (optional)' if optional else ''}:")

    def heading(self, name: str) -> None:
        """A heading for what follows that is no part: the timings, which run last (each test's timed parts
        come after all its checks, so a grading's tests do their untimed work side by side, harness/gpu_share.py)."""
        self._say_checks()
        print(f" {name}:")

    def end_part(self, name: str) -> bool:
        """A part with a step still missing becomes one failed check, and the next part still runs.
        Returns whether every case of the part passed."""
        if self.not_implemented:
            self.missing_steps.setdefault(self.missing_step, self.not_implemented)
            said = (f"not run: it needs step {self.missing_step}, not implemented yet" if self.carried
                    else f"not implemented yet: {self.not_implemented}{'' if self.hint_said else TODO_HINT}")
            self.hint_said = True
            self.add(name, False, said, kind=self.part_kind)
            if self.part_kind == Kind.CHECK:
                self.missing_parts += 1
                self.missing_message = self.missing_message or self.not_implemented
            self.not_implemented = None
        self._say_checks()
        passed = all(c.passed for c in self.cases[self.part_start:])
        if passed and self.part_steps:
            self.passed_steps.update(self.part_steps)
        self.part_steps = None
        self.part_kind = Kind.CHECK
        return passed

    def _missing(self, name: str, kind: str, message: str):
        """'Not implemented yet' while it is plausible: steps still TODO and no check of this part passed.

        Otherwise (a finished file, or one where earlier cases passed) it is an
        ordinary failure of this case, so a half-done step still earns what passes.
        """
        todos = [] if self.solution else sorted(  # by step, then in the file's order
            dict.fromkeys(step for rel in student_files(self.task) for step in remaining_todos(self.student_dir / rel)
                          if (self.part_steps is None or step_number(step) in self.part_steps)
                          and step_number(step) not in self.passed_steps),  # a TODO line left on a step that works
            key=step_number,
        )
        passed_before = any(c.passed and c.kind in (Kind.CHECK, Kind.OPTIONAL) for c in self.cases[self.part_start:])
        if not todos or passed_before:
            self.add(name, False, message, kind=kind)
            return None
        more = f" ({len(todos) - 1} more TODO line(s) of this part's steps)" if len(todos) > 1 else ""
        self.missing_step = step_number(todos[0])
        self.not_implemented = f"see README, Task {self.task}, {todos[0]}{more}"
        return None  # said once: by end_part in a part, else by finish

    def _left_to_do(self) -> list[str]:
        """Without a GPU: the steps the student's files still mark TODO, and what can run here."""
        if self.solution:
            return []
        # by step: a file may hold a later step first, and one file's optional step (task 4's step 12, in the
        # float32 kernel's file) may come after another file's
        todos = [f"{rel}: {step}" for rel, step in sorted(
            ((rel, step) for rel in student_files(self.task) for step in remaining_todos(self.student_dir / rel)
             if self.asked_steps is None or step_number(step) in self.asked_steps),
            key=lambda todo: step_number(todo[1]))]
        asked = "" if self.asked_steps is None else \
            f"step{'s' * (len(self.asked_steps) > 1)} {index_ranges(sorted(self.asked_steps))}"
        lines = ([f"still marked TODO in your files (README, Task {self.task}{asked and ', ' + asked}):"]
                 + [f"  {t}" for t in todos] if todos
                 else [f"no step{asked and ' of ' + asked} is marked TODO in your files"])
        from common.nvcc import find_nvcc

        can = "compiles" if find_nvcc() else "would compile, once the CUDA toolkit (nvcc) is installed,"
        return lines + [f"here, without a GPU: python -m task{self.task}.compile {can} your kernels alone"]

    # -- summary ---------------------------------------------------------------
    def status(self) -> str:
        if self.parts and self.missing_parts == self.parts:  # every part is still a skeleton
            self.not_implemented = self.missing_message
        if self.not_implemented:
            return Status.NOT_IMPLEMENTED
        if not self.cases and self.needs_cuda:
            return Status.NEEDS_CUDA
        required = [c for c in self.cases if c.kind != Kind.OPTIONAL]
        return Status.PASSED if required and all(c.passed for c in required) else Status.FAILED

    def finish(self, json_path: str | None) -> int:
        self._say_checks()
        status = self.status()
        checks = [c for c in self.cases if c.kind == Kind.CHECK]
        passed = sum(c.passed for c in checks)
        missing = self.not_implemented + TODO_HINT if status == Status.NOT_IMPLEMENTED else None
        if missing:
            print(f"Task {self.task}: not implemented yet: {self.not_implemented if self.hint_said else missing}")
        elif status == Status.NEEDS_CUDA:
            print(f"Task {self.task}: needs a CUDA GPU ({self.needs_cuda})")
            for line in self._left_to_do():
                print(f"  {line}")
        else:
            others = Counter(c.kind for c in self.cases if c.kind != Kind.CHECK)
            failed = Counter(c.kind for c in self.cases if c.kind != Kind.CHECK and not c.passed)
            also = "".join(f", {n} {KIND_WORDS[kind][n > 1]}" + (f" ({failed[kind]} failed)" if failed[kind] else "")
                           for kind, n in sorted(others.items()))
            print(f"Task {self.task}: {passed}/{len(checks)} checks passed{also} — {status.upper()} "
                  f"({label(self.solution)})")
            if self.needs_cuda:
                print(f"  not run here: {self.needs_cuda}")
        if json_path:
            record = {
                "task": self.task,
                "implementation": label(self.solution),
                "status": status,
                "not_implemented": missing,
                "needs_cuda": self.needs_cuda,
                "notes": self.notes + self.worker_notes,
                "sandbox": self.sandbox,
                "environment": environment(),
                "cases": [asdict(c) for c in self.cases],
            }
            Path(json_path).write_text(json.dumps(_json_safe(record), indent=2))
        return 0 if status in (Status.PASSED, Status.NEEDS_CUDA) else 1


_LEAD = re.compile(r"(looks like .*?: see README, Task \d+, step \d+\.|[^\n]*?fix that first\.)(?= |$)")


def _stop_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds: the worker is stopped, then atexit prints the checks done


def failure_groups(messages: list[str], kinds: list[str] | None = None) -> list[list[int]]:
    """The failures' indices by kind: the same diagnosis, or the same words with other numbers (and, given
    `kinds`, the same kind of case: a scored check and an optional one are never grouped); diagnosed kinds first,
    then the most common. The console and Results.md say each kind once, with its count."""
    groups: dict[tuple, list[int]] = {}
    for i, message in enumerate(messages):
        groups.setdefault((kinds[i] if kinds else "", lead_of(message) or _signature(message)), []).append(i)
    return sorted(groups.values(), key=lambda group: (not lead_of(messages[group[0]]), -len(group)))


def lead_of(message: str) -> str:
    """What a failure says before its numbers, when it is a diagnosis ("looks like ...: see README,
    Task 1, step 2.") or a pointer to an earlier failure ("... fix that first.")."""
    found = _LEAD.match(message)
    return found.group(1) if found else ""


def _signature(message: str) -> str:
    """A failure's first line with its numbers blanked: two cases that fail the same way share it."""
    return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", message.splitlines()[0] if message else "")


def _short_traceback(err: BaseException) -> str:
    """The checks' own error, its last three frames indented under the case's line."""
    body = short_traceback(err, 3)
    return "    " + body.strip().replace("\n", "\n    ") if body else ""
