"""Task 4's performance points, estimated before submitting.

Task 4's bar is the reference solution timed in the same run (harness/points.py). The handout
has no reference solution, so a student's own test cannot time it. Instead the instructor
records, once per GPU model, how the reference compares with a baseline the student's test does
time in the same run (`python -m grader.calibrate`, into grader/calibration.json, which the
handout carries): the reference's time over SDPA's (scaled_dot_product_attention), per timed case.

The student's test then estimates the reference's time as that ratio times the baseline it
just measured, and the points from it, labelled as an estimate. Shipping ratios rather than
reference binaries keeps the reference out of the handout altogether. A GPU the file has no
entry for gets no estimate, and the report says so (the ratio to SDPA is shown anyway).
The instructor's grader never reads this file: it times the reference itself. (Task 5 needs
none of this: its bar is the copy bandwidth, which the student's run measures.)
"""

from __future__ import annotations

import json
from pathlib import Path

from common.impl import REPO

PATH = REPO / "grader" / "calibration.json"  # the file each function reads unless given another
BASELINE = {4: "sdpa_ms"}  # the metric each task's reference is calibrated against
ESTIMATE = "vs_reference_estimate"  # metric: estimated reference time / student time


def load(path: Path | None = None) -> dict:
    try:
        data = json.loads((path or PATH).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def ratios(task: int, gpu: str, path: Path | None = None) -> dict[str, float]:
    """{case name: reference time / baseline time} recorded for this GPU model; {} when there is none."""
    def part(d, key):  # a hand-edited file: anything but the expected shape is no calibration
        value = d.get(key) if isinstance(d, dict) else None
        return value if isinstance(value, dict) else {}

    cases = part(part(part(load(path), "gpus"), gpu), "tasks").get(str(task), {})
    if not isinstance(cases, dict):
        return {}
    return {str(k): float(v) for k, v in cases.items() if isinstance(v, (int, float)) and v > 0}


def estimate(task: int, case: str, metrics: dict, gpu: str, path: Path | None = None) -> tuple[float | None, str]:
    """(estimated reference time / student time, or None, and the words that go with it in the report)."""
    recorded = ratios(task, gpu, path)
    if not recorded:
        return None, f"no calibration for {gpu} in grader/calibration.json, so no estimate of the performance points"
    baseline, student = metrics.get(BASELINE[task]), metrics.get("kernel_ms")
    if case not in recorded or not baseline or not student:
        return None, f"no estimate for this case ({'not calibrated' if case not in recorded else 'no baseline time'})"
    value = recorded[case] * baseline / student
    return value, (f"about {value:.2f}x the reference's speed (an estimate: the reference's time on {gpu} is "
                   f"recorded as {recorded[case]:.2f}x the {BASELINE[task].removesuffix('_ms')} time; the "
                   "instructor's grader times the reference itself)")


def record(task: int, gpu: str, cases: dict[str, float], about: dict, path: Path | None = None) -> None:
    """Store this GPU's ratios for `task`, keeping every other GPU's and task's."""
    data = load(path)
    data.setdefault("about", "reference time / baseline time per timed case, by GPU model: harness/calibration.py")
    entry = data.setdefault("gpus", {}).setdefault(gpu, {})
    entry.update(about)
    entry.setdefault("tasks", {})[str(task)] = {name: round(value, 4) for name, value in sorted(cases.items())}
    (path or PATH).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
