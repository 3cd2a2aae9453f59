"""The gather job of a class graded on Slurm (`python -m grader.batch gather DIR`, grader/slurm.py).

It runs once every element of an array has ended, however it ended. It asks Slurm how each
element that did not finish its grading ended (`scontrol show job`), records that in the student's
attempts, sends once more what was stopped from outside (time limit, node failure, preemption,
a scancel of a running grading) as a new array with a gather of its own, never what never
started after a cancel, and writes the gradebook. Run by hand, it rebuilds the gradebook.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

from grader import class_state, gradebook, slurm

# Slurm job states in which the job may still run; any other state is an end (squeue(1), JOB STATE CODES)
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
          "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
ENDS = {"TIMEOUT": "its time limit", "CANCELLED": "scancel", "NODE_FAIL": "a node failure",
        "PREEMPTED": "a preemption", "OUT_OF_MEMORY": "running out of memory", "BOOT_FAIL": "a node that failed to boot",
        "DEADLINE": "its deadline", "FAILED": "a failure of the job script"}

FORGOTTEN = "FORGOTTEN"  # Slurm no longer knows the job (it keeps an ended one MinJobAge seconds, 300 by default)


def job_state(job: str) -> str | None:
    """A job's or array element's JobState, FORGOTTEN, or None when Slurm cannot be asked."""
    if shutil.which("scontrol") is None:
        return None
    try:
        proc = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    state = re.search(r"\bJobState=(\S+)", proc.stdout)
    if proc.returncode == 0 and state:
        return state[1]
    return FORGOTTEN if "Invalid job id" in proc.stderr else None


def settle(out: Path, sid: str) -> bool:
    """Add Slurm's word for how the student's last attempt ended; False while it may still run (or we cannot tell)."""
    tried = class_state.attempts(out, sid)
    last = tried[-1] if tried else None
    if last is None or last.get("outcome", "").startswith(("graded", "failed")) or "state" in last:
        return True
    state = job_state(last["job"]) if last["job"] != "local" else FORGOTTEN
    if state is None or (state in ACTIVE and "ended" not in last):
        return False
    if state in ACTIVE:
        return True  # the element caught the signal and said so; Slurm is still tidying up
    if state != FORGOTTEN:
        last["state"] = state
        last["outcome"] = f"stopped by Slurm: {state} ({ENDS.get(state, 'its end state')})"
    elif "ended" not in last:
        last["outcome"] = "stopped before it finished"
    else:
        return True
    last.setdefault("ended", class_state.timestamp())
    class_state.save_attempts(out, sid, tried)
    return True


RETRIED = {"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"}  # an element that never ran for these is sent once more


def never_started(out: Path, klass: dict, index: int) -> str | None:
    """Record why an element that never ran ended (an array cancelled while it waited, a job script that failed),
    once Slurm says it ended; Slurm's state, or None while it may still run or Slurm cannot be asked."""
    sid, array = klass["students"][index]["id"], klass.get("array_of", {}).get(str(index))
    state = job_state(f"{array}_{index}") if array else None
    if state is None or state in ACTIVE:
        return None  # still waiting to run, or Slurm cannot be asked: a later gather will see it
    why = ("Slurm no longer knows it (cancelled before it ran?)" if state == FORGOTTEN else
           f"Slurm ended it as {state} ({ENDS.get(state, 'its end state')}) before the grading began")
    if state == "FAILED":
        why += f"; the job script failed: see {out / 'slurm' / 'logs'}"
    class_state.save_attempts(out, sid, class_state.attempts(out, sid) + [
        {"round": klass["round"], "job": f"{array}_{index}", "state": state, "never_started": state not in RETRIED,
         "outcome": f"{'stopped' if state in RETRIED else 'never started'}: {why}", "ended": class_state.timestamp()}])
    return state


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.batch gather",
                                     description="The gradebook and class report from what is on disk; run it any time.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--requeue", action="store_true",
                        help="(the first gather job) grade once more what Slurm stopped, then gather again")
    args = parser.parse_args(argv)
    klass = class_state.load_class(args.out)
    again = []
    for index in klass.get("todo", []):
        sid = klass["students"][index]["id"]
        if not settle(args.out, sid):
            continue  # still running: a later gather will see it
        mine = class_state.this_round(args.out, sid, klass)
        if not mine:  # the element never ran: sent again after a node's failure, never after a cancel or a failure
            if never_started(args.out, klass, index) in RETRIED and class_state.tries_left(args.out, sid, klass) > 0:
                again.append(index)
            continue
        if mine[-1].get("outcome", "").startswith("stopped") and class_state.tries_left(args.out, sid, klass) > 0:
            again.append(index)
    if args.requeue and again:
        options = json.loads((args.out / "slurm" / "options.json").read_text())
        array, after = slurm.submit_array(args.out, again, options.get("max_running"), requeue=False)
        names = ", ".join(klass["students"][i]["id"] for i in again)
        print(f"graded once more: {names} (array job {array}; gather job {after} after it)")
    gradebook.write_books(args.out)
    return 0
