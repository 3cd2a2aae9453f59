"""The bar a task's performance points are measured against (tasks 4 and 5).

The grader (grader/rubric.py) and the tests' own estimates use it, so a student sees the rule that
grades them. Every bar is a ratio measured in one run, so a grade does not depend on the GPU:

- task 5's decode is bound by memory: it can read K and V no faster than the GPU copies memory,
  measured in the same run. Its bar is that share: full points at 90% of the copy bandwidth,
  none at 60% or below, linear between. The untuned skeleton constants fall short of it;
  README, Task 5, step 4's tuning reaches it. The batch 1 long-cache case counts only when the
  optional split-KV (step 3) runs it (one block per head cannot fill the GPU there), and then
  only where it raises the share: the optional part can add points, never cost them.
- task 4's kernel is bound by arithmetic, whose ceiling depends on the instructions a kernel
  uses; its bar is the reference solution timed in the same run (in the handout, an estimate of
  it from grader/calibration.json): full points at 0.9x its speed, none at 0.5x or below. The
  untuned skeleton constants run at about 0.75x; Task 4, step 7's tuning reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.bench import VS_REFERENCE
from harness.calibration import ESTIMATE

NOT_SCORED = "not_scored"  # benchmark metric: why this case's speed is reported but does not count
# benchmark metric: this case is run by an optional part (task 5's split-KV); it counts only where it raises
# the share earned, so doing the optional part never costs points
OPTIONAL_PART = "optional_part"


@dataclass(frozen=True)
class Bar:
    metric: str  # the benchmark metric it reads
    none: float  # at or below: no performance points
    full: float  # at or above: all of them; linear between
    unit: str  # how a value reads: "{value} {unit}"
    estimate: str | None = None  # the metric that stands in for `metric` where it cannot be measured

    def fraction(self, value: float) -> float:
        return min(1.0, max(0.0, (value - self.none) / (self.full - self.none)))

    def short(self, value: float) -> str:
        return f"{value:.0%}" if self.metric != VS_REFERENCE else f"{value:.2f}x"

    def show(self, value: float) -> str:
        return f"{self.short(value)} {self.unit}"

    def mean_fraction(self, values: list[float]) -> float:
        return sum(self.fraction(v) for v in values) / len(values)

    def rule(self) -> str:
        return f"full points at {self.short(self.full)}, none at {self.short(self.none)} or below"


BARS = {
    4: Bar(VS_REFERENCE, none=0.5, full=0.9, unit="the reference's speed", estimate=ESTIMATE),
    5: Bar("of_copy", none=0.6, full=0.9, unit="of the copy bandwidth"),
}


def scored(task: int, cases: list[dict], optional: bool = True) -> tuple[list[float], bool]:
    """The values of the passed benchmarks that count for `task`'s bar, and whether they are estimates.
    optional=False: without the cases an optional part runs (OPTIONAL_PART)."""
    bar = BARS[task]
    timed = [c["metrics"] for c in cases if c["kind"] == "benchmark" and c["passed"] and not c["metrics"].get(NOT_SCORED)
             and (optional or not c["metrics"].get(OPTIONAL_PART))]
    measured = [m[bar.metric] for m in timed if m.get(bar.metric) is not None]
    if measured or not bar.estimate:
        return measured, False
    estimated = [m[bar.estimate] for m in timed if m.get(bar.estimate) is not None]
    return estimated, bool(estimated)


def performance(task: int, cases: list[dict]) -> tuple[float, str, bool] | None:
    """(share of the performance points earned, in words, whether from an estimate), or None when no
    benchmark measured what the bar reads."""
    values, estimated = scored(task, cases)
    if not values:
        return None
    bar = BARS[task]
    fraction = bar.mean_fraction(values)
    without, _ = scored(task, cases, optional=False)
    if without and bar.mean_fraction(without) > fraction:
        values, fraction = without, bar.mean_fraction(without)
    mean = sum(values) / len(values)
    what = "speed" if bar.metric == VS_REFERENCE else "K and V read at"
    words = (f"{what} {bar.show(mean)} on average{', an ESTIMATE from grader/calibration.json' if estimated else ''} "
             f"({fraction:.0%} of the performance points{', estimated' if estimated else ''}; {bar.rule()})")
    return fraction, words, estimated


def missing(task: int, cases: list[dict]) -> str:
    """Why no benchmark gave the bar a value, in words."""
    if not any(c["kind"] == "benchmark" for c in cases):
        return "the benchmarks did not run: the notes say why"
    if BARS[task].estimate:
        return "no reference timing in this run, and no estimate: the benchmark lines say why"
    return f"no benchmark measured its share {BARS[task].unit}: the benchmark lines say why"


def estimate_note(task: int, cases: list) -> str | None:
    """What a student's own test says of its performance points once its benchmarks ran (cases: the
    report's, as records or dicts); None when there is nothing to say."""
    records = [c if isinstance(c, dict) else vars(c) for c in cases]
    if not any(c["kind"] == "benchmark" for c in records):
        return None
    failed = [c for c in records if c["kind"] == "benchmark" and not c["passed"]]
    if failed:
        return f"performance points: none while a benchmark fails ({failed[0]['name']})"
    found = performance(task, records)
    if found is None:
        return f"performance points: not estimated here ({missing(task, records)})"
    return f"performance points, an estimate from this run (the grader measures its own): {found[1]}"
