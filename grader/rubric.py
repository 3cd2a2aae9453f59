"""The rubric: points per task, and how a task's test record becomes a score.

Correctness gates points: a task earns its correctness points in proportion to
the checks that pass, and its performance points (tasks 4 and 5) only when every
check and every benchmark passes (a benchmark fails when the output of one of its
timed runs is wrong, its speed is physically impossible, or a causal run
is not clearly faster than the full one). Breaking a rule (a
"rule" case, such as calling PyTorch's own attention) scores 0 for the task. An
optional part ("optional" cases, task 5's split-KV) is reported, never scored.
Performance is scored against a bar measured in the same run (harness/points.py), so the
grade does not depend on which GPU ran it: task 4 against the reference solution's speed
(in the handout, which has no reference, estimated from grader/calibration.json and
labelled as an estimate), task 5 against the GPU's copy bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import points
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
    7: TaskRubric("the kernels inside GPT-2 and Llama", 1, needs_cuda=True, timeout_s=1200),
}
TOTAL_POINTS = sum(r.points for r in RUBRIC.values())


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
            found = points.performance(task, cases)
            if found is None:
                why += f"; performance not scored ({points.missing(task, cases)})"
            else:
                fraction, words, is_estimate = found
                earned += rubric.performance_points * fraction
                why += f"; {words}" + ("; the instructor's grader times the reference itself" if is_estimate else "")
    return round(earned, 3), why, is_estimate


def estimated(task: int, record: dict) -> bool:
    """Whether score() gave this record's performance points from an estimate (grader/calibration.json)."""
    return _assess(task, record)[2]
