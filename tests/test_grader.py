"""The grader's verdicts on known-bad submissions, one per failure mode, and its output formats."""

import json
import subprocess
import sys

import pytest

from grader import __main__ as grader
from grader.rubric import RUBRIC, TOTAL_POINTS, score
from tests.conftest import REPO, bad_variant, needs_solution

# task 1 student files built from the reference with one change each
SUBMISSIONS = {
    "correct": None,
    "wrong_scale": ("/ math.sqrt(q.shape[-1])", "/ q.shape[-1]"),
    "segfault": ("    scores = attention_scores(q, k)\n",
                 "    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)\n    scores = attention_scores(q, k)\n"),
    "hang": ("    scores = attention_scores(q, k)\n", "    import time\n    time.sleep(600)\n    scores = attention_scores(q, k)\n"),
    "pytorch_attention": ("    return torch.softmax(scores, dim=-1) @ v\n",
                          "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"),
    "raises": ("    return torch.softmax(scores, dim=-1) @ v\n", "    return torch.softmax(scores, dim=-1) @ v.T\n"),
    "imports_solution": ("from common.validate import check_hidden, check_qkv\n",
                         "from common.validate import check_hidden, check_qkv\n"
                         "from task1.solution.attention import *  # noqa\n"),
    "syntax_error": ("def merge_heads(", "def merge_heads(:"),
}


def grade(tmp_path, name, timeout=120):
    sub = tmp_path / name
    if name != "missing":
        variant = SUBMISSIONS[name]
        text = bad_variant(1, "attention.py", *variant) if variant else (REPO / "task1/solution/attention.py").read_text()
        (sub / "task1").mkdir(parents=True)
        (sub / "task1" / "attention.py").write_text(text)
    else:
        sub.mkdir()
    proc = subprocess.run([sys.executable, "-m", "grader", "--submission", str(sub), "--tasks", "1",
                           "--timeout", str(timeout)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((sub / "results.json").read_text())
    return results, (sub / "Results.md").read_text()


@needs_solution(1)
@pytest.mark.parametrize("name, status, points, words", [
    ("correct", "passed", 2, "checks passed"),
    ("wrong_scale", "failed", None, "checks passed"),
    ("segfault", "crashed", 0, "segmentation fault"),
    ("pytorch_attention", "failed", 0, "PyTorch's own attention"),
    ("raises", "failed", None, "checks passed"),
    ("imports_solution", "failed", 0, "import"),
    ("syntax_error", "failed", 0, "could not import task1/attention.py: SyntaxError"),
    ("missing", "not implemented yet", 0, "see README, Task 1, step 1"),
])
def test_verdicts_on_known_submissions(tmp_path, name, status, points, words):
    results, md = grade(tmp_path, name)
    (test,) = results["tests"]
    assert test["name"].startswith("Task 1") and test["max_score"] == 2 and test["visibility"] == "visible"
    assert test["output"].startswith(status), test["output"]
    assert words in test["output"]
    if points is not None:
        assert test["score"] == points
    else:
        assert test["score"] < 2
    assert results["score"] == test["score"]
    assert f"| 1. {RUBRIC[1].title} | {status} |" in md


@needs_solution(3)
def test_a_broken_task1_does_not_cost_task3(tmp_path):
    sub = tmp_path / "sub"
    for task in (1, 3):
        (sub / f"task{task}").mkdir(parents=True)
    (sub / "task3" / "attention.py").write_text((REPO / "task3/solution/attention.py").read_text())
    (sub / "task1" / "attention.py").write_text(bad_variant(1, "attention.py", "    scores = attention_scores(q, k)\n",
                                                            "    raise RuntimeError('task 1 is broken')\n"))
    proc = subprocess.run([sys.executable, "-m", "grader", "--submission", str(sub), "--tasks", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (test,) = json.loads((sub / "results.json").read_text())["tests"]
    assert test["score"] == 3 and "timing against task 1 skipped" in test["output"]


def test_crash_reasons():
    from grader.runner import crash_reason

    oom_baseline = "attention alone: naive out of memory\n" + "ok\n" * 40
    assert crash_reason(-11, oom_baseline) == "crashed with SIGSEGV (segmentation fault)"
    assert "illegal memory access" in crash_reason(1, "RuntimeError: CUDA error: an illegal memory access")
    assert "exited with code 3" in crash_reason(3, "something\nelse")


@needs_solution(1)
def test_a_hang_costs_only_its_task(tmp_path):
    results, _ = grade(tmp_path, "hang", timeout=15)
    (test,) = results["tests"]
    assert test["score"] == 0 and "timed out after 15 s" in test["output"]


def test_cuda_tasks_without_a_gpu_are_not_failed(tmp_path):
    (tmp_path / "task2").mkdir()
    (tmp_path / "task2" / "test.py").write_text("raise SystemExit('must not run')\n")
    entry = grader.grade_task(2, tmp_path, solution=False, hidden=False, timeout=10, has_cuda=False)
    assert entry["status"] == "needs_cuda" and entry["points"] == 0
    md, js = grader.write_results([entry], tmp_path, "test", {"device": "CPU", "python": "3", "torch": "t",
                                                              "cuda": None, "commit": None})
    assert "needs a CUDA GPU" in md.read_text() and "– / 3" in md.read_text()


def test_tasks_not_yet_built_are_marked_unavailable(tmp_path):
    entry = grader.grade_task(7, tmp_path, solution=False, hidden=False, timeout=10, has_cuda=True)
    assert entry["status"] == "unavailable"


def test_grader_failure_is_a_visible_entry(tmp_path):
    grader.write_grader_failure(tmp_path, "Traceback: boom")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["tests"][0]["name"] == "grader failed" and "boom" in results["tests"][0]["output"]


def test_rubric_totals_twenty_points():
    assert TOTAL_POINTS == 20
    assert {t: r.points for t, r in RUBRIC.items()} == {1: 2, 2: 3, 3: 3, 4: 4, 5: 4, 6: 3, 7: 1}


def _record(checks, speeds=()):
    cases = [{"kind": "check", "passed": p, "metrics": {}} for p in checks]
    cases += [{"kind": "benchmark", "passed": True, "metrics": {"vs_reference": s}} for s in speeds]
    return {"status": "passed" if all(checks) else "failed", "cases": cases}


def test_a_failed_benchmark_forfeits_the_performance_points():
    record = _record([True, True], [3.0])
    record["cases"].append({"kind": "benchmark", "passed": False, "name": "attention", "metrics": {},
                            "message": "faster than the GPU's float32 peak"})
    points, why = score(4, record)
    assert points == 3 and "faster than the GPU" in why


def test_a_broken_rule_scores_zero():
    record = _record([True, True])
    record["cases"].append({"kind": "rule", "passed": False, "name": "own work", "metrics": {},
                            "message": "calls PyTorch's own attention"})
    assert score(1, record) == (0.0, "0 points: calls PyTorch's own attention")


def test_performance_points_need_every_check_and_follow_the_reference_ratio():
    assert score(4, _record([True, True], [0.8, 1.3]))[0] == 4
    assert score(4, _record([True, True], [0.4, 0.4]))[0] == 3.5
    points, why = score(4, _record([True, False], [2.0]))
    assert points == 1.5 and "until every check passes" in why
    assert score(4, _record([True], []))[0] == 3  # no reference timing: correctness only


def test_bad_task_list_is_refused():
    proc = subprocess.run([sys.executable, "-m", "grader", "--tasks", "9"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0 and "no task 9" in proc.stderr
