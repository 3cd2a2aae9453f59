"""The grader builds the kernels a grading shares at once, before the tasks (grader/runner.py).

A stand-in Worker records what was started and stopped: the real builds run on the GPU machine
(the full grader run in each closing note). What is checked here is which kernels are built and
where, that each build is stopped, that a failing or stuck build is left for its task to report,
and that no worker running a student's Python can write where another task loads kernels from.
"""

import os
import subprocess
import sys
import threading

import pytest

from common import build
from harness import view
from harness.sandbox import Worker
from grader import runner
from tests.conftest import REPO


def test_the_kernels_built_ahead_are_those_of_the_tasks_and_the_tasks_they_use():
    assert runner.shared_kernel_tasks([1, 3]) == []
    assert runner.shared_kernel_tasks([2]) == [2]
    assert runner.shared_kernel_tasks([5]) == [4, 5]
    assert runner.shared_kernel_tasks([6, 7]) == [4, 5]  # in a copy of their own (below)
    assert runner.shared_kernel_tasks(range(1, 8)) == [2, 4, 5]


@pytest.mark.parametrize("sandbox", ["bubblewrap", "plain process"])
def test_a_worker_running_student_python_never_writes_in_the_shared_build_folder(tmp_path, monkeypatch, sandbox):
    """Tasks 6 and 7 load task 4's and 5's kernels: in bubblewrap from a copy mounted where the shared folder is
    (ninja's commands name that path, so nothing is built again); without it, from a folder of their own."""
    monkeypatch.setattr(view, "sandbox_status", lambda: sandbox)
    shared = tmp_path / "worker-builds"
    for task in range(1, 8):
        worker = Worker(task, REPO, scratch=tmp_path / f"task{task}-work", builds=shared)
        written = worker.private_builds or worker.builds
        if task in (2, 4, 5):
            assert worker.builds == shared / "student" and worker.private_builds is None, task
        else:
            assert not written.is_relative_to(shared), (task, written)
            assert worker.builds == (shared / "student" if sandbox == "bubblewrap" else written), task


def test_the_private_copy_keeps_the_times_ninja_compares_and_follows_no_link(tmp_path):
    """Tasks 2, 4 and 5's workers write in the shared folder: a link left there (to the reference's build, say) is
    not followed into the copy a student's Python reads. The copy is taken from the grader's own copy."""
    shared, private = tmp_path / "worker-builds" / "student", tmp_path / "task6-work" / "own"
    trusted = tmp_path / "reference-build"
    trusted.mkdir()
    (trusted / "task5_solution.so").write_text("the reference")
    ahead = view.built_ahead(shared.parent) / "student"
    for name in ("task4-student", "task5-student"):
        (ahead / name).mkdir(parents=True)
        (ahead / name / "binding.o").write_text(name)
        os.utime(ahead / name / "binding.o", ns=(10**18, 10**18))
    (ahead / "task5-student" / "linked.so").symlink_to(trusted / "task5_solution.so")
    (ahead / "task5-student" / "folder").symlink_to(trusted)
    (ahead / "task7-student").symlink_to(trusted)
    view.copy_builds(shared, private, ["task4-student", "task5-student", "task7-student", "task9-student"])
    assert sorted(p.name for p in private.iterdir()) == ["task4-student", "task5-student"]
    assert sorted(p.name for p in (private / "task5-student").iterdir()) == ["binding.o"]
    assert (private / "task5-student" / "binding.o").read_text() == "task5-student"
    assert (private / "task5-student" / "binding.o").stat().st_mtime_ns == 10**18


def test_the_copy_waits_for_the_graders_builds_ahead(tmp_path):
    import fcntl

    shared = tmp_path / "worker-builds" / "student"
    shared.mkdir(parents=True)
    ahead = open(view.building_lock(shared.parent), "a+")
    fcntl.flock(ahead, fcntl.LOCK_EX)
    copied = threading.Event()
    copying = threading.Thread(target=lambda: (view.copy_builds(shared, tmp_path / "own", ["task4-student"]),
                                               copied.set()))
    copying.start()
    assert not copied.wait(0.5)  # still building: nothing is copied yet
    built = view.built_ahead(shared.parent) / "student" / "task4-student"
    built.mkdir(parents=True)
    (built / "kernels.o").write_text("built")
    fcntl.flock(ahead, fcntl.LOCK_UN)
    assert copied.wait(5)
    assert (tmp_path / "own" / "task4-student" / "kernels.o").read_text() == "built"


def test_the_bwrap_command_mounts_the_copy_where_the_shared_folder_is(tmp_path, monkeypatch):
    private, shared = tmp_path / "own", tmp_path / "shared" / "student"
    monkeypatch.setattr(view, "_hidden_roots", lambda extra: [])
    monkeypatch.setattr(view, "_python_paths", lambda: [])
    cmd = view.bwrap_command(tmp_path / "view", [(private, shared)], [])
    assert "--bind" in cmd and cmd[cmd.index("--bind") + 1:cmd.index("--bind") + 3] == [str(private), str(shared)]


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
    monkeypatch.setattr(runner, "reference_extensions", lambda tasks: [])
    StandIn.spawned, StandIn.handshakes, StandIn.stopped, StandIn.fail, StandIn.hang = [], [], [], set(), set()
    assert runner.build_kernels_ahead([1, 3], tmp_path, tmp_path, solution=False) is None
    assert StandIn.spawned == []
    StandIn.together = threading.Barrier(3, timeout=0.4)  # one after another, no build would get past it
    built = runner.worker_builds(tmp_path) / "student" / "task4-student"
    built.mkdir(parents=True)
    (built / "kernels.o").write_text("built")
    line = runner.build_kernels_ahead([1, 2, 5], tmp_path, tmp_path, solution=False)
    StandIn.together = None
    assert line.startswith("built the kernels of tasks 2, 4, 5 at once (")
    assert sorted(StandIn.handshakes) == [2, 4, 5] and sorted(StandIn.stopped) == [2, 4, 5]
    copied = view.built_ahead(runner.worker_builds(tmp_path)) / "student" / "task4-student" / "kernels.o"
    assert copied.read_text() == "built"  # the grader's own copy, made once every build has stopped

    StandIn.stopped, StandIn.fail, StandIn.hang = [], {2}, {5}
    line = runner.build_kernels_ahead([2, 5], tmp_path, tmp_path, solution=False)
    assert "built the kernels of tasks 4 at once" in line and "tasks 2, 5 will say why not" in line, line
    assert sorted(StandIn.stopped) == [2, 4, 5]  # the stuck one too


def test_the_references_are_built_beside_them_and_a_stuck_one_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "Worker", StandIn)
    monkeypatch.setattr(runner, "PREBUILD_S", 2.0)
    StandIn.spawned, StandIn.handshakes, StandIn.stopped, StandIn.fail, StandIn.hang = [], [], [], set(), set()
    outcome = {(2, None): "time.sleep(60)", (4, None): "pass", (5, None): "sys.exit(1)"}
    started = []

    def compiler(task, kernels):
        started.append((task, kernels))
        return subprocess.Popen([sys.executable, "-c", f"import sys, time; {outcome[(task, kernels)]}"],
                                start_new_session=True)

    monkeypatch.setattr(runner, "_reference_build", compiler)
    monkeypatch.setattr(runner, "reference_extensions", lambda tasks: list(outcome))
    line = runner.build_kernels_ahead([5], tmp_path, tmp_path, solution=True)
    assert started == list(outcome)
    assert line.startswith("built the kernels of tasks 4, 5 and the reference's of task 4 at once ("), line
    assert line.endswith("the tests build the other references themselves"), line


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
