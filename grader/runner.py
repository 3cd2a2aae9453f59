"""Run one task's test in its own process, so a crash or hang costs that task only.

The child is the task's test (trusted code from this checkout), which runs the student's
code in a worker of its own and writes the JSON record to a folder the worker cannot see.
The parent keeps its output in a log, enforces the time limit (killing the whole process
group), validates the record, and turns a segfault, a hang, a CUDA error or an
out-of-memory error into a written-down reason.
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

from common.impl import REPO
from harness.outcome import Cause, Kind, Status
from harness.gpu_share import ENV as GPU_SHARE_ENV, alone_file, waiting_file
from harness.processes import with_parent
from harness.sandbox import Worker, signal_words
from harness.view import built_ahead, copy_tree
from common.tasks import TASKS

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
    cause: str | None = None  # harness.outcome.Cause of having no record, where known
    waited_s: float = 0.0  # of `seconds`, those it waited for other tasks (their builds, timed parts, outcome)
    alone_s: float = 0.0  # of `seconds`, those its timed parts held the GPU to themselves
    started_at: float = 0.0  # when it started (epoch seconds): with timed_parts, the grading's timeline
    timed_parts: tuple = ()  # (when it began, seconds) of each timed part


def crash_reason(returncode: int, output: str) -> str:
    """Why a test process ended without results: a hint from its last lines, else its signal or exit code."""
    tail = [ln for ln in output.strip().splitlines() if ln.strip()][-30:]  # not the whole log: it reports OOM baselines
    hint = next((reason for needle, reason in CRASH_HINTS if needle in "\n".join(tail).lower()), None)
    if returncode < 0:
        return f"crashed with {signal_words(-returncode)}" + (f": {hint}" if hint else "")
    if hint:
        return hint
    return f"exited with code {returncode} without writing results: " + " | ".join(tail[-3:])


def held_alone(gpu_share: Path, pid: int) -> list[tuple[float, float]]:
    """(when it began, epoch seconds; seconds) of each part in which test `pid` held the GPU to itself
    (harness/gpu_share.py's alone_file); none if it never did."""
    try:
        return [(float(began), float(seconds)) for seconds, began in
                (line.split() for line in alone_file(gpu_share, pid).read_text().splitlines())]
    except (OSError, ValueError):
        return []


def worker_builds(scratch: Path) -> Path:
    """The build folder a grading's workers share (harness/sandbox.py's Worker says how)."""
    return scratch / "worker-builds"


def echo_lines(line: str) -> None:
    print(f"  | {line}", end="", flush=True)


def run_task(task: int, student_dir: Path, scratch: Path, *, solution: bool, hidden: bool, timeout_s: int,
             echo=echo_lines, gpu_share: Path | None = None,
             nice: int = 0, threads: int | None = None) -> TaskRun:
    """Run taskN.test on the files in `student_dir`; everything it writes stays under `scratch`.

    echo: called with each line the test prints (None: kept in the log only).
    gpu_share: the lock file of the tasks graded at once (harness/gpu_share.py); the time the test waits
    for the GPU is not counted against `timeout_s`. nice: a lower CPU priority for the test and its
    workers, for while other tasks run beside it (a timed part has the machine to itself, where it makes
    no difference). threads: PyTorch's CPU threads in the test and its workers (None: one per core).
    """
    results = scratch / f"task{task}.json"
    results.unlink(missing_ok=True)
    work = scratch / f"task{task}-work"
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", f"task{task}.test", "--json", str(results), "--student-dir", str(student_dir),
           "--scratch", str(work)]
    cmd += ["--solution"] if solution else []
    cmd += ["--hidden", str(REPO / "grader" / "hidden.py")] if hidden else []
    cmd += ["--grading"]  # the slowest unscored comparisons are left to the student's own run
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", TMPDIR=str(work),
               KIT_WORKER_BUILDS=str(worker_builds(scratch)))  # task 5's worker finds task 4's kernels built
    if gpu_share:
        env[GPU_SHARE_ENV] = str(gpu_share)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if threads else ():
        env.setdefault(name, str(threads))  # the user's own setting wins
    started, started_at = time.perf_counter(), time.time()
    with _LOCK:
        if STOPPING.is_set():  # the grader is being stopped: no new test
            raise RuntimeError("the grading was stopped")
        proc = subprocess.Popen(with_parent(cmd, nice), cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        RUNNING.add(proc)
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if echo:
                echo(line)

    reader = threading.Thread(target=pump, daemon=True)
    try:
        reader.start()
        waiting = waiting_file(gpu_share, proc.pid) if gpu_share else None
        ended, waited_s = wait_counting(proc, timeout_s, lambda: waiting is not None and waiting.exists())
    finally:  # also when the grader itself is stopped: nothing may still write in `scratch` as it is removed
        _kill(proc)
        with _LOCK:
            RUNNING.discard(proc)
    reader.join(timeout=10)
    seconds = time.perf_counter() - started
    parts = held_alone(gpu_share, proc.pid) if gpu_share else []
    timing = {"waited_s": waited_s, "alone_s": sum(s for _, s in parts), "started_at": started_at,
              "timed_parts": tuple(parts)}
    log = "".join(lines)
    (scratch / f"task{task}.log").write_text(log)

    if not ended:
        return TaskRun(task, None, f"timed out after {timeout_s} s (a hang or an endless loop?)", seconds, log,
                       Cause.TIMED_OUT, **timing)
    if not results.exists():
        return TaskRun(task, None, crash_reason(proc.returncode, log), seconds, log, None, **timing)
    try:
        record = valid_record(json.loads(results.read_text()), task)
    except (ValueError, TypeError, KeyError) as err:
        return TaskRun(task, None, f"its record is malformed ({err}), so it could not be scored", seconds, log,
                       Cause.MALFORMED, **timing)
    return TaskRun(task, record, None, seconds, log, **timing)


RUNNING: set[subprocess.Popen] = set()  # the tests running now, in any thread
STOPPING = threading.Event()  # set when the grader is stopped: no test starts after it
_LOCK = threading.Lock()


TERM_GRACE_S = 3  # a test still running is asked to stop first: it prints the checks it finished (harness/records.py)


def _kill(proc: subprocess.Popen) -> None:
    """The test and anything it left behind (ninja, nvcc, a student's stray process)."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=TERM_GRACE_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def stop_running() -> None:
    """End every test still running and start no other (the grader is stopped): nothing may still write in its
    scratch folder."""
    with _LOCK:
        STOPPING.set()
        running = list(RUNNING)
    for proc in running:
        _kill(proc)


def wait_counting(proc: subprocess.Popen, limit_s: float, waiting, tick_s: float = 0.5) -> tuple[bool, float]:
    """Wait for `proc` to end, at most `limit_s` seconds not counting those while `waiting()` is true.
    (whether it ended in time, the seconds not counted)."""
    used, waited, last = 0.0, 0.0, time.monotonic()
    while True:
        try:
            proc.wait(timeout=min(tick_s, max(limit_s - used, 0.01)))
            return True, waited
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if waiting():
            waited += now - last
        else:
            used += now - last
        last = now
        if used >= limit_s:
            return False, waited


PREBUILD_S = 240  # more than a cold build of the largest kernel file takes; a stuck build is its task's to report


def shared_kernel_tasks(tasks) -> list[int]:
    """The tasks whose kernels the given tasks' workers find in the grading's shared build folder (theirs and
    those of the tasks they use): a worker that runs student Python gets a copy (harness/sandbox.py's Worker)."""
    wanted = {n for t in tasks for n in (t, *TASKS[t].uses)}
    return sorted(n for n in wanted if f"task{n}/binding.cpp" in TASKS[n].given_files)


def reference_extensions(tasks) -> list[tuple[int, str | None]]:
    """(task, kernels folder) of each reference extension the given tasks' tests load in a grading: the reference
    kernels of every CUDA task among them and the tasks they use (its other kernels folders, taskN/solution/<name>/,
    are timed in the reference's own test runs, never in a grading: checks/task4/test.py)."""
    from common.impl import has_solution

    wanted = sorted({n for t in tasks for n in (t, *TASKS[t].uses) if TASKS[n].cuda and has_solution(n)})
    return [(n, None) for n in wanted]


def _reference_build(task: int, kernels: str | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", f"task{task}.compile", "--solution", "--extension",
           *(["--kernels", kernels] if kernels else [])]
    return subprocess.Popen(with_parent(cmd), cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def build_kernels_ahead(tasks, student_dir: Path, scratch: Path, *, solution: bool) -> str | None:
    """Build the kernels of the shared build folder and the references the tests load, all at once, before the
    tasks that need them run.

    Each build is mostly one thread (the binding's compile, about 20 s on an H200), so five at once
    take the time of one; the tasks' workers and tests then find them built. Only workers that run no
    student Python build in the shared folder, so no code but kernels held to common/kernel_rules.py
    ever writes in it. Nothing is judged here: a build that fails or hangs fails again in its task,
    which says why, and building ahead that cannot even start is skipped. Returns a line for the log, or None.
    """
    needed, references = shared_kernel_tasks(tasks), reference_extensions(tasks)
    if not needed and not references:
        return None
    started, workers, compilers, built = time.perf_counter(), [], [], []
    try:
        for n in needed:
            workers.append(Worker(n, student_dir, solution=solution, scratch=scratch / f"task{n}-work",
                                  purpose="build", builds=worker_builds(scratch)))
            workers[-1].spawn()  # here: the worker lives as long as the thread that spawned it (Worker.spawn)
        compilers = [(n, kernels, _reference_build(n, kernels)) for n, kernels in references]
    except Exception as err:  # noqa: BLE001  only a speed-up: the tasks build for themselves
        for w in workers:
            w.stop()
        for *_, proc in compilers:
            _kill(proc)
        return f"could not build the kernels ahead ({type(err).__name__}: {err}); each task builds its own"

    def build(worker):
        try:
            worker.handshake()
            built.append(worker.task)
        except Exception:  # noqa: BLE001  the task's own worker meets the same error and reports it
            pass

    threads = [threading.Thread(target=build, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + PREBUILD_S
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    references_built = []
    for n, kernels, proc in compilers:
        try:
            if proc.wait(timeout=max(0.1, deadline - time.monotonic())) == 0:
                references_built.append(f"{n}" + (f" ({kernels.replace('_', ' ')})" if kernels else ""))
        except subprocess.TimeoutExpired:
            pass
        _kill(proc)  # and its nvcc and ninja: the test that loads it builds it again, under the build's lock
    for w in workers:
        w.stop()  # also one still building: its task builds it again
    for kind in ("solution", "student"):  # copied while no worker runs, for the tasks that run student Python
        if (worker_builds(scratch) / kind).is_dir():  # (harness/view.py's copy_builds)
            copy_tree(worker_builds(scratch) / kind, built_ahead(worker_builds(scratch)) / kind)
    seconds = time.perf_counter() - started
    said = f"built the kernels of tasks {', '.join(map(str, sorted(built))) or 'none'}"
    if references:
        said += (f" and the reference's of task{'s' if len(references_built) > 1 else ''} "
                 f"{', '.join(references_built) or 'none'}")
    said += f" at once ({seconds:.0f} s)"
    left = [n for n in needed if n not in built]
    if left:
        said += f"; task{'s' if len(left) > 1 else ''} {', '.join(map(str, left))} will say why not"
    if len(references_built) < len(references):
        said += "; the tests build the other references themselves"
    return said


def valid_record(record, task: int) -> dict:
    """The record as scoring expects it, or ValueError: a malformed record costs its task only."""
    if not isinstance(record, dict) or record.get("task") != task or record.get("status") not in Status.RECORDED:
        raise ValueError("not a record of this task")
    cases = record.get("cases")
    if not isinstance(cases, list):
        raise ValueError("no list of cases")
    for case in cases:
        if (not isinstance(case, dict) or case.get("kind") not in Kind.ALL or not isinstance(case.get("passed"), bool)
                or not isinstance(case.get("name"), str) or not isinstance(case.get("message"), str)
                or not isinstance(case.get("metrics", {}), dict) or case.get("cause") not in (None, *Cause.ALL)):
            raise ValueError(f"a case is malformed: {str(case)[:200]}")
        case.setdefault("metrics", {})
    if not all(isinstance(n, str) for n in record.setdefault("notes", [])):
        raise ValueError("notes must be text")
    return record
