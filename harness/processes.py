"""The worker's processes, seen from the checks: started safely beside threads, counted, ended (trusted side).

A worker that has more than MAX_PROCESSES processes or MAX_THREADS threads at once (a fork or
thread bomb) is ended by `watch`, and the case says why; without bubblewrap, a process that leaves
both the worker's process group and its tree escapes that count.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# The worker's processes at once (compilers included), and their threads together. More is a fork or
# thread bomb: the worker is ended before it fills the machine's process table (threads take pids too)
# under the other gradings on the node. PyTorch's pools have a thread per core (a CPU worker measured 3
# threads on 2 cores); 8 per core leaves room for CUDA's, the sanitizer's and the compilers'.
MAX_PROCESSES = 256
MAX_THREADS = max(1024, 8 * (os.cpu_count() or 1))
WATCH_S = 0.05
COUNT_S = 1.0


# Every process the kit starts (a task's test, a build, a worker, a student's grading) is killed when the thread
# that started it ends (PR_SET_PDEATHSIG): the worker dies with the checks (bubblewrap does this for the whole
# sandbox too), a task's test with the grader, a grading with grader.batch, so nothing is left running when Slurm
# or a time limit stops the parent. Set between fork and exec (subprocess's preexec_fn), it can deadlock the
# child while other threads run, and the grader starts its tests from several threads: on an H100 a test stuck
# there, before its first line, twice in about ten gradings, and the spawns after it waited on it. So a small
# launcher sets it in a process of its own, then becomes the command (the setting survives exec): no Python
# runs between fork and exec.
_LAUNCH = """import ctypes, os, sys
try:
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
except (OSError, AttributeError):
    pass
os.nice(int(sys.argv[2]))
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # the parent ended before the setting was made: no one is left to report to
os.execvp(sys.argv[3], sys.argv[3:])
"""


def with_parent(cmd: list[str], nice: int = 0) -> list[str]:
    """`cmd` as a command that is killed when the thread starting it ends, run at niceness `nice` (its pid is
    the command's: the launcher becomes it)."""
    return [sys.executable, "-I", "-S", "-c", _LAUNCH, str(os.getpid()), str(nice), *cmd]


def watch(proc: subprocess.Popen, stopped_for) -> None:
    """End the worker `proc` and every process under it once they are more than MAX_PROCESSES processes or
    MAX_THREADS threads (RLIMIT_NPROC does not bind root); `stopped_for(proc, why)` is told first.

    Cheap while nothing happens: the machine's count of threads and processes (/proc/loadavg) is
    read every WATCH_S, and the worker's own processes and threads are counted when that count has
    grown by MAX_PROCESSES since its lowest point, and every COUNT_S in any case.
    """
    low, counted = _machine_tasks(), time.monotonic()
    while proc.poll() is None:
        time.sleep(WATCH_S)
        now = _machine_tasks()
        low = min(low, now)  # other processes that ended give this worker no allowance
        if now - low <= MAX_PROCESSES and time.monotonic() - counted < COUNT_S:
            continue
        low, counted = now, time.monotonic()
        mine = descendants(proc.pid, include_root=True)
        processes, threads = len(mine) - 1, sum(int(fields[17]) for fields in mine.values())  # num_threads
        too_many = (f"{processes} processes at once, more than the {MAX_PROCESSES} allowed (a fork bomb?)"
                    if processes > MAX_PROCESSES else
                    f"{threads} threads at once, more than the {MAX_THREADS} allowed (a thread bomb?)"
                    if threads > MAX_THREADS else "")
        if too_many and proc.poll() is None:
            stopped_for(proc, too_many)  # first, so the case can say why
            _kill_all(proc.pid, mine)
            return


def descendants(root: int, include_root: bool = False) -> dict[int, list[str]]:
    """The processes under `root` (its children, theirs, ...), each with the fields of /proc/PID/stat after the name.

    Under bubblewrap an orphan is adopted by the sandbox's own init, so none escapes the count.
    """
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(entry.name)
            stats[pid] = fields
            children.setdefault(int(fields[1]), []).append(pid)
    found, todo, seen = {}, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:  # /proc is not read at one instant: a reused pid can make a cycle
            continue
        seen.add(pid)
        if pid in stats and (include_root or pid != root):
            found[pid] = stats[pid]
        todo += children.get(pid, [])
    return found


def _kill_all(leader: int, found: dict[int, list[str]]) -> None:
    """SIGKILL the worker's process group (no fork escapes a group's kill; under bubblewrap this ends its
    PID namespace, and every process in it), then each process counted that had left the group."""
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid, fields in found.items():
        try:  # the same process still: its start time (stat field 22) unchanged, so the pid was not reused
            if (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19] == fields[19]:
                os.kill(pid, signal.SIGKILL)
        except (OSError, IndexError):
            pass


def _machine_tasks() -> int:
    """The number of threads and processes on the machine (the fourth field of /proc/loadavg: running/total);
    0 where it cannot be read (the count every COUNT_S still watches)."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return 0
