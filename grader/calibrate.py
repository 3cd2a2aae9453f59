"""python -m grader.calibrate   (instructors: once per GPU model, before exporting the handout)

Runs the reference solution's test of task 4 on this GPU and records, for each timed case that
the grade scores, the reference's time over a baseline the student's own test also times (SDPA).
Task 5 needs none: its bar is the copy bandwidth measured in the student's own run.
The ratios go to grader/calibration.json under this GPU's name, next to those of other models;
the handout carries the file, and a student's `python -m taskN.test` and `python -m grader`
estimate their performance points from it (harness/calibration.py). The grade itself never
uses it: the instructor's grader times the reference in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch

from harness import calibration
from common.impl import REPO, has_solution
from harness.outcome import Kind
from harness.records import environment
from harness.view import scratch_dir
from grader.rubric import RUBRIC
from grader.runner import run_task

TASKS = (4,)  # task 5 is held to the copy bandwidth of its own run (harness/points.py)


def ratios_of(task: int, record: dict) -> dict[str, float]:
    """{case: reference time / baseline time} for every passed benchmark that timed both."""
    found = {}
    for case in record.get("cases", []):
        metrics = case.get("metrics", {})
        baseline, reference = metrics.get(calibration.BASELINE[task]), metrics.get("reference_ms")
        if case.get("kind") == Kind.BENCHMARK and case.get("passed") and baseline and reference:
            found[case["name"]] = reference / baseline
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.calibrate",
                                     description="Record, for this GPU model, how the reference solution of task 4 "
                                                 "compares with the baseline a student's test times (SDPA).")
    parser.add_argument("--tasks", default=",".join(map(str, TASKS)), help="only task 4 has a calibration")
    args = parser.parse_args(argv)
    tasks = [int(t) if t.strip().isdigit() else 0 for t in args.tasks.split(",") if t.strip()]
    if not tasks or any(t not in TASKS for t in tasks):
        print(f"--tasks: only tasks {', '.join(map(str, TASKS))} have performance points to calibrate")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA GPU is visible: calibrate on the GPU model the students will use")
        return 1
    missing = [t for t in tasks if not has_solution(t)]
    if missing:
        print(f"task {missing[0]}: the reference solution is not in this checkout (calibrate from the instructor's copy)")
        return 1
    gpu, env = torch.cuda.get_device_name(), environment()
    about = {"measured": datetime.date.today().isoformat(), "torch": env["torch"], "cuda": env["cuda"],
             "commit": env["commit"]}
    scratch = scratch_dir()
    for task in tasks:
        print(f"task {task}: timing the reference solution against its baseline on {gpu} ...")
        run = run_task(task, REPO, scratch, solution=True, hidden=False,
                       timeout_s=RUBRIC[task].timeout_s, echo=None)
        if run.record is None:
            print(f"task {task}: {run.reason} (log: {scratch / f'task{task}.log'})")
            return 1
        found = ratios_of(task, run.record)
        if not found:
            print(f"task {task}: no timed case recorded both the reference and the baseline "
                  f"(log: {scratch / f'task{task}.log'})")
            return 1
        calibration.record(task, gpu, found, about)
        for name, value in found.items():
            print(f"  {name}: reference {value:.3f}x the {calibration.BASELINE[task].removesuffix('_ms')} time")
    print(f"wrote {calibration.PATH.relative_to(REPO)} ({gpu})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
