"""A submission's tasks graded at once (grader/schedule.py), the GPU shared between them (harness/gpu_share.py).

The real run is the full grader on the GPU machine (each closing note); here the rules that keep
its grades right: a timed part has the GPU alone, a test waiting for it does not lose time from its
limit, a worker running student Python is not alive while another test times, the output reads as
one task after another, and a task that loads another's code still waits for it.
"""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from harness import gpu_share
from grader import runner, schedule
from tests.conftest import REPO


def test_each_tasks_lines_are_shown_in_task_order():
    shown = []
    echo = schedule.InOrder([1, 3, 4], write=shown.append)
    echo.say(3, "3a")
    echo.say(1, "1a")  # the first task's lines as they come
    assert shown == ["1a"]
    echo.say(4, "4a")
    echo.finish(3)
    echo.say(1, "1b")
    assert shown == ["1a", "1b"]
    echo.finish(1)  # then task 3's (done), and task 4's so far, and task 4's next ones as they come
    assert shown == ["1a", "1b", "3a", "4a"]
    echo.say(4, "4b")
    assert shown[-1] == "4b"


def test_the_tasks_run_at_once_and_those_whose_workers_load_kernels_after_the_builds(tmp_path):
    order, together = [], threading.Barrier(5, timeout=5)  # passed only if all five run at once
    lock = threading.Lock()

    def grade(task, say):
        with lock:
            order.append(("start", task))
        together.wait()
        say(f"task {task}\n")
        return {"task": task}

    def build():
        with lock:
            order.append(("build",))
        time.sleep(0.3)
        with lock:
            order.append(("built",))
        return "built"

    shown = []
    entries = schedule.grade_at_once([1, 2, 3, 4, 5], grade, build=build, share=tmp_path / "lock",
                                     building=tmp_path / "builds" / "building.lock",
                                     echo=schedule.InOrder([1, 2, 3, 4, 5], write=shown.append))
    assert sorted(entries) == [1, 2, 3, 4, 5]
    built_at = order.index(("built",))
    assert all(order.index(("start", task)) > built_at for task in (2, 4, 5))  # their workers load built kernels
    assert all(order.index(("start", task)) < built_at for task in (1, 3))  # theirs do not: they start at once
    assert shown == [f"task {t}\n" for t in (1, 2, 3, 4, 5)] + ["\nbuilt\n"]  # the builds' line at the end


def test_a_fault_of_the_grader_in_one_task_is_raised_not_lost(tmp_path):
    def grade(task, say):
        if task == 3:
            raise KeyError("a bug")
        return {"task": task}

    with pytest.raises(KeyError):
        schedule.grade_at_once([1, 3], grade, share=tmp_path / "lock", echo=schedule.InOrder([1, 3], write=print))


def test_the_time_spent_waiting_for_the_gpu_is_not_counted(tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(1.5)"]
    proc = subprocess.Popen(sleeper)
    assert runner.wait_counting(proc, 0.6, lambda: False, tick_s=0.1) == (False, 0.0)
    proc.kill()
    proc.wait()
    proc = subprocess.Popen(sleeper)
    started = time.monotonic()
    # 3 s not waiting: the sleeper's own start may take seconds on a loaded machine (it ended in 0.3 s idle)
    ended, waited = runner.wait_counting(proc, 3.0, lambda: time.monotonic() - started < 1.2, tick_s=0.1)
    assert ended and 1.0 < waited < 1.5


PROGRAM = textwrap.dedent("""
    import sys, time
    from harness import gpu_share

    class Worker:
        def __init__(self, python):
            self.runs_student_python, self.stopped = python, False
        def stop_until_next_call(self):
            self.stopped = True

    gpu_share.join()
    print("joined", time.monotonic(), flush=True)
    if sys.argv[1] == "hold":
        time.sleep(float(sys.argv[2]))
    else:
        python, kernels = Worker(True), Worker(False)
        with gpu_share.alone(python, kernels):
            print("alone", time.monotonic(), python.stopped, kernels.stopped, flush=True)
            python.stopped = False
        print("after", python.stopped, flush=True)  # stopped again before going back to a shared hold
    print("done", time.monotonic(), flush=True)
""")


def test_a_timed_part_waits_until_no_other_test_holds_the_gpu(tmp_path):
    lock = tmp_path / "gpu-share" / "lock"
    lock.parent.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), **{gpu_share.ENV: str(lock)})
    run = lambda *args: subprocess.Popen([sys.executable, "-c", PROGRAM, *args], env=env,  # noqa: E731
                                         stdout=subprocess.PIPE, text=True)
    holder = run("hold", "2.0")
    assert holder.stdout.readline().startswith("joined")
    timed = run("time")
    assert timed.stdout.readline().startswith("joined")  # a shared hold beside another's
    waiting = gpu_share.waiting_file(lock, timed.pid)
    deadline = time.monotonic() + 5
    while not waiting.exists():  # it says it waits, so the grader does not count the time
        assert time.monotonic() < deadline and timed.poll() is None
        time.sleep(0.02)
    held_until = float(holder.stdout.read().split()[-1])
    word, at, python_stopped, kernels_stopped = timed.stdout.readline().split()
    assert word == "alone" and float(at) >= held_until
    assert (python_stopped, kernels_stopped) == ("True", "False")  # student Python is not alive while waiting
    assert timed.stdout.readline().split() == ["after", "True"]
    assert timed.wait(timeout=10) == 0 and holder.wait(timeout=10) == 0
    assert not waiting.exists()


def test_without_a_grader_sharing_the_gpu_nothing_waits_or_stops(monkeypatch):
    monkeypatch.delenv(gpu_share.ENV, raising=False)

    class Worker:
        runs_student_python = True

        def stop_until_next_call(self):
            raise AssertionError("a student's own run stops nothing")

    with gpu_share.alone(Worker()):
        pass


def test_the_grader_being_stopped_starts_no_other_task(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "STOPPING", threading.Event())
    monkeypatch.setattr(schedule, "STOPPING", runner.STOPPING)
    graded = []

    def grade(task, say):
        graded.append(task)
        runner.stop_running()  # SIGTERM while task 1 runs: task 2, waiting for the builds, must not start
        return {"task": task}

    entries = schedule.grade_at_once([1, 2], grade, build=lambda: time.sleep(0.5), share=tmp_path / "lock",
                                     building=tmp_path / "building.lock", echo=schedule.InOrder([1, 2], write=print))
    assert graded == [1] and sorted(entries) == [1]
    with pytest.raises(RuntimeError, match="stopped"):
        runner.run_task(1, REPO, tmp_path, solution=True, hidden=False, timeout_s=5)


def test_tests_side_by_side_share_the_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))  # the cores this job may use
    assert schedule.cpu_threads([1]) is None  # alone: PyTorch's default, a thread per core
    assert schedule.cpu_threads([1, 3]) == 8
    assert schedule.cpu_threads(range(1, 8)) == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert schedule.cpu_threads(range(1, 8)) == 1
