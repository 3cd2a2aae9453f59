"""The rubric: points per task, and how a task's test record becomes a score.

Correctness gates points: a task earns its correctness points in proportion to
the checks that pass, and its performance points (tasks 4 and 5) only when every
check and every benchmark passes (a benchmark fails when the output of one of its
timed runs is wrong, its speed is physically impossible, or a causal run
is not clearly faster than the full one). Breaking a rule (a
"rule" case, such as calling PyTorch's own attention) scores 0 for the task. An
optional part ("optional" cases, task 5's split-KV) is reported, never scored.
Performance is scored against the reference solution timed in the same run
(`vs_reference` = reference time / student time in each benchmark case), so the
grade does not depend on which GPU ran it. In the handout, which has no reference, a
student's run estimates that ratio from grader/calibration.json (harness/calibration.py)
and the points it shows are labelled as an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.bench import VS_REFERENCE
from harness.calibration import ESTIMATE
from harness.outcome import Kind, Status


@dataclass(frozen=True)
class TaskRubric:
    title: str
    points: float
    performance_points: float = 0.0  # part of `points`
    needs_cuda: bool = False
    timeout_s: int = 600


RUBRIC = {
    1: TaskRubric("naive multi-head attention (PyTorch)", 2),
    2: TaskRubric("softmax and tiled GEMM kernels (CUDA)", 3, needs_cuda=True, timeout_s=900),
    3: TaskRubric("FlashAttention-2 (PyTorch)", 3),
    4: TaskRubric("fused FlashAttention kernel (CUDA)", 4, performance_points=1, needs_cuda=True, timeout_s=1200),
    5: TaskRubric("KV cache and decode kernels (CUDA)", 4, performance_points=1, needs_cuda=True, timeout_s=1200),
    6: TaskRubric("prefill/decode inside a small LLM", 3, needs_cuda=True, timeout_s=1200),
    7: TaskRubric("the kernels inside GPT-2", 1, needs_cuda=True, timeout_s=1200),
}
TOTAL_POINTS = sum(r.points for r in RUBRIC.values())
# Full performance points at this fraction of the reference's speed, linear below it.
FULL_SPEED_FRACTION = 0.8


def parse_tasks(text: str) -> list[int]:
    """--tasks "1,3" -> [1, 3]; ValueError with the message for the command line otherwise."""
    try:
        tasks = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise ValueError(f"--tasks takes numbers separated by commas, got {text!r}") from None
    if not tasks:
        raise ValueError(f"--tasks: no task given; tasks are {', '.join(map(str, RUBRIC))}")
    if unknown := [t for t in tasks if t not in RUBRIC]:
        raise ValueError(f"--tasks: no task {unknown[0]}; tasks are {', '.join(map(str, RUBRIC))}")
    return tasks


def score(task: int, record: dict) -> tuple[float, str]:
    """(points earned, one-line explanation) for a finished test record."""
    return _assess(task, record)[:2]


def _assess(task: int, record: dict) -> tuple[float, str, bool]:
    """score()'s points and explanation, and whether the performance points came from an estimate."""
    rubric = RUBRIC[task]
    status = record.get("status")
    if status == Status.NOT_IMPLEMENTED:  # the status itself says "not implemented yet": the summary says where
        return 0.0, str(record.get("not_implemented")), False
    if status == Status.NEEDS_CUDA:
        return 0.0, f"not graded here ({record.get('needs_cuda')})", False
    cases = record.get("cases", [])
    broken_rules = [c for c in cases if c["kind"] == Kind.RULE and not c["passed"]]
    if broken_rules:  # e.g. calling PyTorch's own attention in a task that asks you to write it
        return 0.0, "0 points: " + broken_rules[0]["message"], False
    checks = [c for c in cases if c["kind"] == Kind.CHECK]
    if not checks:
        return 0.0, "no checks ran", False
    passed = sum(c["passed"] for c in checks)
    correctness_points = rubric.points - rubric.performance_points
    earned = correctness_points * passed / len(checks)
    why = f"{passed}/{len(checks)} checks passed"
    is_estimate = False
    optional = [c for c in cases if c["kind"] == Kind.OPTIONAL]
    if optional:
        why += f" (and {sum(c['passed'] for c in optional)}/{len(optional)} of the optional part, not scored)"
    if rubric.performance_points:
        failed_benchmarks = [c for c in cases if c["kind"] == Kind.BENCHMARK and not c["passed"]]
        if passed < len(checks):
            why += "; performance not scored until every check passes"
        elif failed_benchmarks:
            why += f"; no performance points: {failed_benchmarks[0]['name']}: {failed_benchmarks[0]['message']}"
        else:
            ratios, estimate = _speed_ratios(cases)
            if not ratios:
                why += ("; performance not scored (no reference timing in this run, and no estimate: the benchmark "
                        "lines say why)")
            else:
                fraction = sum(min(1.0, r / FULL_SPEED_FRACTION) for r in ratios) / len(ratios)
                earned += rubric.performance_points * fraction
                is_estimate = estimate
                if estimate:
                    why += (f"; speed about {sum(ratios) / len(ratios):.2f}x the reference on average, an ESTIMATE "
                            f"from grader/calibration.json ({fraction:.0%} of the performance points, estimated; "
                            "the instructor's grader times the reference itself)")
                else:
                    why += (f"; speed {sum(ratios) / len(ratios):.2f}x the reference on average "
                            f"({fraction:.0%} of the performance points)")
    return round(earned, 3), why, is_estimate


def _ratios(cases: list[dict], metric: str) -> list[float]:
    return [c["metrics"][metric] for c in cases if c["kind"] == Kind.BENCHMARK and c["metrics"].get(metric) is not None]


def _speed_ratios(cases: list[dict]) -> tuple[list[float], bool]:
    """The benchmarks' speeds relative to the reference, and whether they are estimates: the handout has no
    reference to time, so its speed is estimated from grader/calibration.json."""
    measured = _ratios(cases, VS_REFERENCE)
    return (measured, False) if measured else (_ratios(cases, ESTIMATE), bool(_ratios(cases, ESTIMATE)))


def estimated(task: int, record: dict) -> bool:
    """Whether score() gave this record's performance points from an estimate (grader/calibration.json)."""
    return _assess(task, record)[2]
