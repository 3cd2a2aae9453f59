"""A grade the machine took: a task that ran out of GPU memory is graded again, alone, before it counts.

GPU memory is shared with whatever else runs on the GPU (another grading, a notebook, a job on a shared node),
and a grading that runs out of it cannot tell from the error whose memory it was. So the grader decides after
the fact, in two steps:
1. A task whose grading ran out of GPU memory (its test crashed so, or a case failed so), or whose test could
   not start CUDA on the GPU the grader sees (PyTorch then runs it as on a machine without one), is graded once more
   when every other task of this grading has ended, so nothing of this grading holds GPU memory beside it.
   If that passes the error's place, the second grade counts (and says it was graded again).
2. If it runs out of memory again, the memory other processes held just before that second grading (when no
   process of this grading is alive) decides: OTHERS_SHARE of the GPU's memory or more, and the machine took the
   grade. The task is "not graded" (Status.NOT_GRADED, Cause.INFRASTRUCTURE): it scores no points either way,
   the gradebook flags it, and the next grader.batch runs grade it again (class_state.TRIES gradings in a row at
   most; then the gradebook says to grade it on a free GPU). Less than that, and the memory was the submission's.
   A test that again could not start CUDA is always the machine's: no student code runs before CUDA starts.
"""

from __future__ import annotations

import subprocess
import sys

from harness.outcome import Cause, Status

OTHERS_SHARE = 0.10  # of the GPU's memory held by other processes: then an out-of-memory error is the machine's
# what the probe's own CUDA context takes, not another process's: an allowance (a CUDA context is a few hundred MiB;
# not measured here), small beside OTHERS_SHARE of any GPU the course runs on
PROBE_CONTEXT_GIB = 0.6
# CUDA's and PyTorch's words for it; never the kit's own ("naive out of memory" for a baseline that does not fit,
# "killed, perhaps out of memory" for a worker the kernel's OOM killer or the student's code ended)
OOM_WORDS = ("cuda out of memory", "cuda error: out of memory", "outofmemoryerror")


def says_out_of_memory(text: str) -> bool:
    return any(w in text.lower() for w in OOM_WORDS)


def ran_out_of_gpu_memory(entry: dict) -> bool:
    """Whether a task's grading ended in, or had a case fail with, an out-of-memory error (in a case's message, or
    in the test's output where a worker died of it: the grader's `out_of_memory`)."""
    if entry.get("status") == Status.PASSED:  # an optional part's failure never costs a passed task its grade
        return False
    if entry.get("out_of_memory"):
        return True
    if entry.get("status") == Status.CRASHED:  # the test itself died: the runner's hint, from its last lines
        return "out of memory" in str(entry.get("summary", "")).lower()
    cases = (entry.get("record") or {}).get("cases", [])
    return any(not c.get("passed") and says_out_of_memory(str(c.get("message", ""))) for c in cases)


def lost_the_gpu(entry: dict, has_cuda: bool) -> bool:
    """Whether a task's test ran without the GPU the grader saw: PyTorch could not start CUDA in it (its memory
    taken by another process, say), so its GPU cases were never run."""
    device = str(((entry.get("record") or {}).get("environment") or {}).get("device", ""))
    return has_cuda and device.startswith("CPU")


def to_look_at(entry: dict, has_cuda: bool) -> bool:
    """Whether the machine may have taken this task's grade: graded again alone before it counts."""
    return ran_out_of_gpu_memory(entry) or lost_the_gpu(entry, has_cuda)


def gpu_memory_in_use() -> tuple[float, float] | None:
    """(GiB in use on the GPU by every process, GiB in all), from a process of its own so the grader never
    holds a CUDA context; None without a GPU or when it cannot be read."""
    probe = ("import torch\nif torch.cuda.is_available():\n    free, total = torch.cuda.mem_get_info()\n"
             "    print(free, total)")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120).stdout.split()
        free, total = (int(x) for x in out[-2:])
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return max(0.0, (total - free) / 2**30 - PROBE_CONTEXT_GIB), total / 2**30


def verdict(first: dict, again: dict, held: tuple[float, float] | None, has_cuda: bool = True) -> tuple[dict, str]:
    """The entry that counts after `again`, the second grading of a task whose `first` ran out of GPU memory or
    ran without the GPU, with what other processes held just before it (`held`: gpu_memory_in_use, read while no
    process of this grading was alive); and a note."""
    task = first["task"]
    used, total = held or (0.0, 0.0)
    if lost_the_gpu(again, has_cuda):
        return not_graded(again, "could not grade: its test could not start CUDA on the GPU, also when graded again "
                                 f"alone ({used:.0f} of the GPU's {total:.0f} GiB held by other processes); regrade")
    if not ran_out_of_gpu_memory(again):
        return again, (f"task {task} ran out of GPU memory or ran without the GPU beside other work, and was graded "
                       "again alone; that grade counts")
    if total and used >= OTHERS_SHARE * total:
        return not_graded(again, f"could not grade: the GPU ran out of memory while other processes held {used:.0f} "
                                 f"of its {total:.0f} GiB, also when graded again alone; regrade on a free GPU")
    where = f" ({used:.0f} of its {total:.0f} GiB in use by other processes)" if total else ""
    return again, (f"task {task} ran out of GPU memory again when graded alone on the GPU{where}: the memory "
                   "was your code's")


def not_graded(again: dict, why: str) -> tuple[dict, str]:
    entry = {k: again[k] for k in ("task", "title", "max_points") if k in again}
    return entry | {"status": Status.NOT_GRADED, "cause": Cause.INFRASTRUCTURE, "points": 0.0, "summary": why,
                    "record": None}, f"task {again['task']}: {why}"
