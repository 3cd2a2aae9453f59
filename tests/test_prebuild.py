"""The grader builds the kernels a grading shares at once, before the tasks (grader/runner.py).

A stand-in Worker records what was started and stopped: the real builds run on the GPU machine
(the full grader run in each closing note). What is checked here is which kernels are built and
where, that each build is stopped, that a failing or stuck build is left for its task to report,
and that no worker running a student's Python can write where another task loads kernels from.
"""

import os
import threading

from common import build
from common.sandbox import Worker
from grader import runner
from tests.conftest import REPO


def test_only_tasks_without_student_python_share_the_kernels_built_ahead():
    assert runner.shared_kernel_tasks([1, 3]) == []
    assert runner.shared_kernel_tasks([2]) == [2]
    assert runner.shared_kernel_tasks([5]) == [4, 5]
    assert runner.shared_kernel_tasks([6, 7]) == []  # their workers run the student's Python: their own folders
    assert runner.shared_kernel_tasks(range(1, 8)) == [2, 4, 5]


def test_a_worker_running_student_python_never_gets_the_shared_build_folder(tmp_path):
    shared = tmp_path / "worker-builds"
    for task in range(1, 8):
        worker = Worker(task, REPO, scratch=tmp_path / f"task{task}-work", builds=shared)
        if task in (2, 4, 5):
            assert worker.builds == shared / "student", task
        else:
            assert not worker.builds.is_relative_to(shared), (task, worker.builds)


class StandIn:
    spawned, handshakes, stopped = [], [], []
    fail, hang = set(), set()
    together = None  # a Barrier every build must reach: it is only passed when they run at once

    def __init__(self, task, student_dir, *, solution, scratch, purpose, builds):
        assert purpose == "build" and scratch.name == f"task{task}-work"
        assert builds == runner.worker_builds(scratch.parent)  # where run_task tells the tasks' workers to look
        self.task = task

    def spawn(self):
        assert threading.current_thread() is threading.main_thread()  # the worker lives as long as its spawner
        StandIn.spawned.append(self.task)

    def handshake(self):
        StandIn.handshakes.append(self.task)
        if StandIn.together:
            StandIn.together.wait()
        if self.task in StandIn.fail:
            raise RuntimeError("a compiler error")
        if self.task in StandIn.hang:
            threading.Event().wait(5)

    def stop(self):
        StandIn.stopped.append(self.task)


def test_the_builds_run_together_and_are_all_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "Worker", StandIn)
    monkeypatch.setattr(runner, "PREBUILD_S", 0.5)
    StandIn.spawned, StandIn.handshakes, StandIn.stopped, StandIn.fail, StandIn.hang = [], [], [], set(), set()
    assert runner.build_kernels_ahead([1, 3, 6], tmp_path, tmp_path, solution=False) is None
    assert StandIn.spawned == []
    StandIn.together = threading.Barrier(3, timeout=0.4)  # one after another, no build would get past it
    line = runner.build_kernels_ahead([1, 2, 5], tmp_path, tmp_path, solution=False)
    StandIn.together = None
    assert line.startswith("built the kernels of tasks 2, 4, 5 at once (")
    assert sorted(StandIn.handshakes) == [2, 4, 5] and sorted(StandIn.stopped) == [2, 4, 5]

    StandIn.stopped, StandIn.fail, StandIn.hang = [], {2}, {5}
    line = runner.build_kernels_ahead([2, 5], tmp_path, tmp_path, solution=False)
    assert "built the kernels of tasks 4 at once" in line and "tasks 2, 5 will say why not" in line, line
    assert sorted(StandIn.stopped) == [2, 4, 5]  # the stuck one too


def test_the_binding_is_copied_only_when_it_changed(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "task4").mkdir(parents=True)
    (repo / "common" / "csrc" / "sub").mkdir(parents=True)  # a folder there is not a header
    (repo / "task4" / "binding.cpp").write_text('#include "../common/csrc/checks.h"\n')
    (repo / "common" / "csrc" / "checks.h").write_text("// checks\n")
    monkeypatch.setattr(build, "REPO", repo)
    folder = tmp_path / "build"
    copy = build.binding_copy(4, folder)
    assert copy == folder / "src" / "task4" / "binding.cpp" and copy.read_text() == (repo / "task4/binding.cpp").read_text()
    header = folder / "src" / "common" / "csrc" / "checks.h"
    os.utime(copy, ns=(1, 1))
    os.utime(header, ns=(1, 1))
    build.binding_copy(4, folder)
    assert copy.stat().st_mtime_ns == 1 and header.stat().st_mtime_ns == 1  # unchanged: ninja sees nothing new
    (repo / "common" / "csrc" / "checks.h").write_text("// checks, changed\n")
    build.binding_copy(4, folder)
    assert header.read_text() == "// checks, changed\n" and header.stat().st_mtime_ns > 1  # newer than its objects
    assert copy.stat().st_mtime_ns == 1
