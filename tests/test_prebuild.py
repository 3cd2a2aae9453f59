"""The grader builds every kernel a grading needs at once, before the tasks (grader/runner.py's prebuild).

A stand-in Worker records what was started and stopped: the real builds run on the GPU machine
(the full grader run in each closing note). What is checked here is which kernels are built, that
each build is stopped, and that a failing or stuck build is left for its task to report.
"""

import threading

from grader import runner


def test_each_task_builds_its_own_kernels_and_those_of_the_tasks_it_uses():
    assert runner.kernel_tasks([1, 3]) == []
    assert runner.kernel_tasks([2]) == [2]
    assert runner.kernel_tasks([5]) == [4, 5]
    assert runner.kernel_tasks([6, 7]) == [4, 5]
    assert runner.kernel_tasks(range(1, 8)) == [2, 4, 5]


class StandIn:
    started, stopped = [], []
    fail, hang = set(), set()

    def __init__(self, task, student_dir, *, solution, scratch, purpose, builds):
        assert purpose == "build" and scratch.name == f"task{task}-work"
        assert builds == runner.worker_builds(scratch.parent)  # where run_task tells the tasks' workers to look
        self.task = task

    def start(self):
        StandIn.started.append(self.task)
        if self.task in StandIn.fail:
            raise RuntimeError("a compiler error")
        if self.task in StandIn.hang:
            threading.Event().wait(5)

    def stop(self):
        StandIn.stopped.append(self.task)


def test_the_builds_run_together_and_are_all_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "Worker", StandIn)
    monkeypatch.setattr(runner, "PREBUILD_S", 0.5)
    StandIn.started, StandIn.stopped, StandIn.fail, StandIn.hang = [], [], {2}, {5}
    assert runner.prebuild([1, 3], tmp_path, tmp_path, solution=False) is None and StandIn.started == []
    line = runner.prebuild([1, 2, 6], tmp_path, tmp_path, solution=False)
    assert line.startswith("built the kernels of tasks 2, 4, 5 at once (")
    assert sorted(StandIn.started) == [2, 4, 5] and sorted(StandIn.stopped) == [2, 4, 5]
