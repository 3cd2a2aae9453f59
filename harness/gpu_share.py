"""One GPU shared by the tests of a grading's tasks, which run at once: a timed part has it to itself.

The grader (grader/schedule.py) runs its tasks' tests side by side and names a lock file in
KIT_GPU_SHARE. Each test holds the lock shared from its first worker on (`join`); a timed part
(`alone`) holds it exclusively, so it starts once every other test is done, or waiting between
its parts, and nothing else starts until it ends. Builds, checks and sanitizer passes overlap;
timings never do (another process's GPU work would slow the reference's timing, or the student's).

While a test waits, its workers that run only kernels may live: they do nothing unless called
(common/kernel_rules.py leaves a kernel file no threads), and each call waits for its GPU work.
A worker that runs a student's Python is stopped before the wait and at the end of the timed
part (`alone(worker)`), since that code could keep the GPU busy from a thread of its own; its
next call starts it again.

The time a test waits is marked by a file beside the lock (`waiting_file`), so the grader does
not count it against the task's time limit. Without KIT_GPU_SHARE (a student's own run), all
of this is a no-op.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ENV = "KIT_GPU_SHARE"
_held: dict = {}  # the open lock file of this process, once joined


def waiting_file(lock: Path, pid: int) -> Path:
    """Present while process `pid` waits for the GPU."""
    return lock.with_name(f"{pid}.waiting")


def alone_file(lock: Path, pid: int) -> Path:
    """The seconds process `pid` held the GPU to itself and when it began (epoch seconds), one line per timed part
    (the grader's cost table and timeline)."""
    return lock.with_name(f"{pid}.alone")


@contextmanager
def waiting():
    """Mark the block as time this test waits for the grading (not counted against its time limit)."""
    if not os.environ.get(ENV):
        yield
        return
    mark = waiting_file(Path(os.environ[ENV]), os.getpid())
    mark.touch()
    try:
        yield
    finally:
        mark.unlink(missing_ok=True)


def _take(mode: int) -> None:
    with waiting():
        fcntl.flock(_held["fd"], mode)


def join() -> None:
    """Share the grading's GPU from now on (once per process; nothing without KIT_GPU_SHARE)."""
    if "fd" in _held or not os.environ.get(ENV):
        return
    _held["fd"] = os.open(os.environ[ENV], os.O_RDWR | os.O_CREAT, 0o600)
    _take(fcntl.LOCK_SH)


def _settle() -> None:
    """Wait for this process's GPU work and give back its cached memory, before another test times."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _let_go(workers) -> list:
    """Stop this test's workers that run student Python, wait for its GPU work, and give up its shared hold
    (never wait for the exclusive lock while holding the shared one); returns the workers stopped."""
    python = [w for w in workers if w is not None and w.runs_student_python]
    for worker in python:
        worker.stop_until_next_call()
    _settle()
    fcntl.flock(_held["fd"], fcntl.LOCK_UN)
    return python


@contextmanager
def alone(*workers):
    """Run the block with the GPU to this test alone. `workers`: this test's workers that are still alive;
    those that run a student's Python are stopped first (their next call starts them again)."""
    join()
    if "fd" not in _held:
        yield
        return
    python = _let_go(workers)
    _take(fcntl.LOCK_EX)
    started, began = time.perf_counter(), time.time()
    try:
        yield
    finally:
        try:
            _settle()
        finally:
            with alone_file(Path(os.environ[ENV]), os.getpid()).open("a") as log:
                log.write(f"{time.perf_counter() - started:.2f} {began:.2f}\n")
            for worker in python:  # stopped again: going back to shared need not keep others out meanwhile
                worker.stop_until_next_call()
            fcntl.flock(_held["fd"], fcntl.LOCK_SH)


@contextmanager
def alone_in_a_fresh_process(worker):
    """`alone(worker)`, the worker's process started anew first, before the GPU is ours alone (so its start is not
    timed, and an optional part's crash before it costs nothing here)."""
    worker.stop_until_next_call()
    worker.ready()
    with alone(worker):
        yield
