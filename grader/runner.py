"""Run one task's test in its own process, so a crash or hang costs that task only.

The child writes its JSON record; the parent keeps its output in a log, enforces
the time limit (killing the whole process group), and turns a segfault, a hang,
a CUDA error or an out-of-memory error into a written-down reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CRASH_HINTS = [
    ("illegal memory access", "a CUDA kernel read or wrote out of bounds (illegal memory access)"),
    ("misaligned address", "a CUDA kernel made a misaligned memory access"),
    ("out of memory", "ran out of memory"),
    ("unspecified launch failure", "a CUDA kernel crashed (unspecified launch failure)"),
    ("device-side assert", "a CUDA device-side assert fired"),
]


@dataclass
class TaskRun:
    task: int
    record: dict | None  # the test's JSON record, if it got that far
    reason: str | None  # why there is no usable record
    seconds: float
    log: str


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def crash_reason(returncode: int, output: str) -> str:
    """Why a test process ended without results: a hint from its last lines, else its signal or exit code."""
    tail = [ln for ln in output.strip().splitlines() if ln.strip()][-30:]  # not the whole log: it reports OOM baselines
    hint = next((reason for needle, reason in CRASH_HINTS if needle in "\n".join(tail).lower()), None)
    if returncode < 0:
        name = _signal_name(returncode)
        meaning = {"SIGSEGV": "segmentation fault", "SIGABRT": "aborted", "SIGKILL": "killed, perhaps out of memory"}
        return f"crashed with {name} ({meaning.get(name, 'killed by a signal')})" + (f": {hint}" if hint else "")
    if hint:
        return hint
    return f"exited with code {returncode} without writing results: " + " | ".join(tail[-3:])


def run_task(task: int, workdir: Path, *, solution: bool, hidden: bool, timeout_s: int, echo: bool = True) -> TaskRun:
    results = workdir / "grader-work" / f"task{task}.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", f"task{task}.test", "--json", str(results)]
    cmd += ["--solution"] if solution else []
    cmd += ["--hidden"] if hidden else []
    env = dict(os.environ, PYTHONPATH=str(workdir), PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if echo:
                print(f"  | {line}", end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    try:  # the test and anything it left behind (ninja, nvcc, a student's stray process)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    reader.join(timeout=10)
    seconds = time.perf_counter() - started
    log = "".join(lines)
    (workdir / "grader-work" / f"task{task}.log").write_text(log)

    if timed_out:
        return TaskRun(task, None, f"timed out after {timeout_s} s (a hang or an endless loop?)", seconds, log)
    record = None
    if results.exists():
        try:
            record = json.loads(results.read_text())
        except json.JSONDecodeError:
            record = None
    if record is None:
        return TaskRun(task, None, crash_reason(proc.returncode, log), seconds, log)
    return TaskRun(task, record, None, seconds, log)
