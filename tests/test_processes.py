"""harness/processes.py's launcher: what the kit starts dies with the thread that started it, with no Python run
between fork and exec (a preexec_fn there deadlocked a grading's test while other threads ran)."""

import os
import subprocess
import sys
import threading
import time

from harness.processes import with_parent


def test_the_command_keeps_the_launchers_pid_and_takes_its_niceness():
    cmd = [sys.executable, "-c", "import os; print(os.getpid(), os.nice(0))"]
    proc = subprocess.Popen(with_parent(cmd, nice=3), stdout=subprocess.PIPE, text=True)
    pid, nice = map(int, proc.communicate(timeout=60)[0].split())
    assert pid == proc.pid  # the grader's waiting files and kills name this pid
    assert nice == os.nice(0) + 3


def test_the_command_dies_with_the_thread_that_started_it():
    started = {}

    def spawn():
        started["proc"] = subprocess.Popen(with_parent(["sleep", "60"]))
        time.sleep(0.5)  # the launcher has exec'd sleep by now

    thread = threading.Thread(target=spawn)
    thread.start()
    thread.join()
    proc = started["proc"]
    try:
        assert proc.wait(timeout=10) == -9  # SIGKILL, sent when the thread ended
    finally:
        proc.kill()


def test_an_orphan_launch_does_not_run_its_command(tmp_path):
    # The parent named is not the real one (as when the parent ended before the launcher ran): nothing runs.
    marker = tmp_path / "ran"
    cmd = with_parent(["touch", str(marker)])
    cmd[cmd.index(str(os.getpid()))] = "1"
    assert subprocess.run(cmd).returncode == 1
    assert not marker.exists()


def test_cpu_seconds_count_the_work_of_a_child_that_has_ended():
    """The skip checks read the worker's CPU time: work done in a forked child that has exited (and been waited
    for) goes to its parent's cutime, which counts too, so it cannot hide the tiles a loop computes."""
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from harness.sandbox import Worker

    code = ("import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    end = time.process_time() + 0.5\n"
            "    while time.process_time() < end:\n"
            "        pass\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "print('done', flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "done"
        time.sleep(0.05)
        assert Worker.cpu_seconds(SimpleNamespace(proc=proc)) >= 0.4
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
