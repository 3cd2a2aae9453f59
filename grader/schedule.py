"""A submission's tasks graded side by side on one GPU.

Each task's test runs in its own process (grader/runner.py), all of them at once, and they share
the GPU through harness/gpu_share.py: builds, checks and sanitizer passes overlap, and each timed
part waits until it has the GPU to itself. Before them, the kernels and references the tasks
load are built at once (runner.build_kernels_ahead); a task whose workers load built kernels
waits for that. No graded test loads another graded task's Python (task 3's time against task 1
is left to the student's own run). What the tests print is shown in task order: the first
unfinished task's lines as they come, the others' once it is done.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from common.tasks import TASKS, runs_student_python
from grader.runner import STOPPING, stop_running


class InOrder:
    """Lines of several tasks, shown in task order as soon as every task before theirs is done."""

    def __init__(self, tasks, write=lambda text: print(text, end="", flush=True)):
        self.order, self.write = list(tasks), write
        self.lines = {t: [] for t in self.order}
        self.shown = dict.fromkeys(self.order, 0)
        self.done: set[int] = set()
        self.lock = threading.Lock()

    def say(self, task: int, text: str) -> None:
        with self.lock:
            self.lines[task].append(text)
            self._show()

    def finish(self, task: int) -> None:
        with self.lock:
            self.done.add(task)
            self._show()

    def _show(self) -> None:
        for task in self.order:
            lines = self.lines[task]
            while self.shown[task] < len(lines):
                self.write(lines[self.shown[task]])
                self.shown[task] += 1
            if task not in self.done:
                return


NICE = 5  # a lower CPU priority: the CUDA tasks' builds, checks and sanitizer passes come first


def cpu_priority(task: int, tasks, has_cuda: bool) -> int:
    """The niceness of a task's test when graded beside kernel tasks: the tasks that run a student's Python
    (PyTorch on the CPU, mostly) yield the CPU to the kernels' builds and checks, which every timed part
    waits for. A timed part has the machine to itself, so no timing depends on it."""
    beside_kernels = has_cuda and any(not runs_student_python(t) and TASKS[t].cuda for t in tasks)
    return NICE if beside_kernels and runs_student_python(task) else 0


def cpu_threads(tasks) -> int | None:
    """PyTorch's CPU threads for each test when several run at once: a share of the cores. Each PyTorch process
    takes a thread per core by default, and several such processes on the same cores wait on each other's
    threads at every parallel step (on a 16-core H200 machine, one grading's task 1 took 267 s beside the
    others, where it takes 34-44 s). None (one per core) for a single task."""
    tasks = list(tasks)
    cores = len(os.sched_getaffinity(0))  # those this job may use (a Slurm job's share of its node)
    return max(1, cores // min(len(tasks), 4)) if len(tasks) > 1 else None


def loads_built_kernels(task: int) -> bool:
    return any(TASKS[n].cuda for n in (task, *TASKS[task].uses))


def grade_at_once(tasks, grade, *, build=None, building: Path | None = None, share: Path,
                  echo: InOrder | None = None) -> dict[int, dict]:
    """Run `grade(task, say)` for every task, each in a thread, and return {task: its entry}.

    build(): the builds ahead (None: none), run here while the grading holds the GPU shared, so
    no timed part starts before they end; the line it returns is shown. The tasks whose workers
    load built kernels wait for it; those that run student Python start at once, and their tests
    wait for `building` (held exclusively meanwhile: harness/view.py's copy_builds) only when
    they take the kernels. say(text): the task's output, shown in order.
    """
    echo = echo or InOrder(tasks)
    entries: dict[int, dict] = {}
    failures: list[BaseException] = []  # a fault of the grader in a task's thread: raised here, as before
    built = threading.Event()
    if build is None:
        built.set()
    elif building is None:
        raise ValueError("building: the lock the tests wait on while `build` runs")

    def one(task):
        try:
            if loads_built_kernels(task) and not runs_student_python(task):
                built.wait()
            if STOPPING.is_set():
                return
            entries[task] = grade(task, lambda text: echo.say(task, text))
        except BaseException as err:  # noqa: BLE001
            failures.append(err)
        finally:
            echo.finish(task)

    threads = [threading.Thread(target=one, args=(t,), daemon=True, name=f"task{t}") for t in tasks]
    said = None
    try:
        if build is not None:
            building.parent.mkdir(parents=True, exist_ok=True)
            with open(share, "a+") as gpu, open(building, "a+") as ahead:
                fcntl.flock(gpu, fcntl.LOCK_SH)
                fcntl.flock(ahead, fcntl.LOCK_EX)  # before any test can look for it
                for t in threads:
                    t.start()
                try:
                    said = build()
                finally:
                    built.set()
                    fcntl.flock(ahead, fcntl.LOCK_UN)
                    fcntl.flock(gpu, fcntl.LOCK_UN)
        else:
            for t in threads:
                t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=1.0)  # the grader stays stoppable (SIGTERM is handled in this thread)
        if build is not None and said:
            echo.write(f"\n{said}\n")
    except BaseException:  # stopped (SIGTERM): end the tests still running before their scratch folder goes
        stop_running()
        raise
    finally:
        built.set()
    if failures:
        raise failures[0]
    return entries


def share_file(scratch: Path) -> Path:
    folder = scratch / "gpu-share"
    os.makedirs(folder, exist_ok=True)
    return folder / "lock"
