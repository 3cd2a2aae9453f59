"""The performance points a student sees before submitting: estimated from grader/calibration.json (no GPU)."""

import json

from harness import calibration
from harness.bench import VS_REFERENCE
from grader.__main__ import score_text
from grader.calibrate import ratios_of
from grader.rubric import estimated, score

CASE = "attention batch 8 heads 32 seq 4096 head_dim 128"


def test_the_reference_time_is_estimated_from_the_baseline_measured_now(tmp_path):
    path = tmp_path / "calibration.json"
    calibration.record(4, "GPU A", {CASE: 1.2}, {"measured": "2026-11-24"}, path)
    value, words = calibration.estimate(4, CASE, {"sdpa_ms": 40.0, "kernel_ms": 60.0}, "GPU A", path)
    assert value == 1.2 * 40.0 / 60.0 and "an estimate" in words and "GPU A" in words
    none, why = calibration.estimate(4, CASE, {"sdpa_ms": 40.0, "kernel_ms": 60.0}, "GPU B", path)
    assert none is None and "no calibration for GPU B" in why
    none, why = calibration.estimate(4, "another case", {"sdpa_ms": 40.0, "kernel_ms": 60.0}, "GPU A", path)
    assert none is None and "not calibrated" in why


def test_recording_one_gpu_keeps_the_others(tmp_path):
    path = tmp_path / "calibration.json"
    calibration.record(4, "GPU A", {CASE: 1.2}, {}, path)
    calibration.record(5, "GPU A", {"decode": 1.05}, {}, path)
    calibration.record(4, "GPU B", {CASE: 1.1}, {}, path)
    assert calibration.ratios(4, "GPU A", path) == {CASE: 1.2} and calibration.ratios(5, "GPU A", path) == {"decode": 1.05}
    assert calibration.ratios(4, "GPU B", path) == {CASE: 1.1}
    for text in ("not json", '{"gpus": []}', '{"gpus": {"GPU A": {"tasks": {"4": [1]}}}}'):
        path.write_text(text)
        assert calibration.ratios(4, "GPU A", path) == {}


def test_the_shipped_file_is_well_formed():
    data = json.loads(calibration.PATH.read_text())
    for gpu, entry in data["gpus"].items():
        for task in ("4",):  # task 5's bar is the copy bandwidth of the same run: nothing to calibrate
            assert entry["tasks"][task] and all(0.2 < v < 5 for v in entry["tasks"][task].values()), (gpu, task)


def _record(metrics):
    checks = [{"name": "c", "kind": "check", "passed": True, "message": "", "metrics": {}}]
    return {"status": "passed", "cases": checks + [{"name": CASE, "kind": "benchmark", "passed": True, "message": "",
                                                    "metrics": metrics}]}


def test_an_estimate_scores_points_labelled_as_an_estimate_and_a_real_ratio_wins():
    points, why = score(4, _record({calibration.ESTIMATE: 0.8}))  # full at 0.9x, none at 0.5x (harness/points.py)
    assert points == 3 + 0.75 and "an ESTIMATE" in why and "75% of the performance points, estimated" in why
    points, why = score(4, _record({calibration.ESTIMATE: 0.6, VS_REFERENCE: 1.0}))
    assert points == 4 and "ESTIMATE" not in why
    points, why = score(4, _record({calibration.ESTIMATE: None}))
    assert points == 3 and "performance not scored" in why and "no estimate" in why
    assert estimated(4, _record({calibration.ESTIMATE: 0.6})) and not estimated(4, _record({VS_REFERENCE: 0.6}))
    entry = {"task": 4, "points": 3.75, "max_points": 4, "status": "passed", "summary": "", "estimated": True}
    assert "task 4 has its performance points estimated" in score_text([entry])
    assert "estimated" not in score_text([entry | {"estimated": False, "summary": "an ESTIMATE in a message"}])


def test_calibrate_takes_the_reference_over_the_baseline_of_passed_benchmarks():
    record = {"cases": [
        {"name": "a", "kind": "benchmark", "passed": True, "metrics": {"reference_ms": 55.0, "sdpa_ms": 46.0}},
        {"name": "b", "kind": "benchmark", "passed": False, "metrics": {"reference_ms": 55.0, "sdpa_ms": 46.0}},
        {"name": "c", "kind": "benchmark", "passed": True, "metrics": {"sdpa_ms": 46.0}},
        {"name": "d", "kind": "check", "passed": True, "metrics": {"reference_ms": 1.0, "sdpa_ms": 1.0}}]}
    assert ratios_of(4, record) == {"a": 55.0 / 46.0}


def _task5(*cases):
    checks = [{"name": "c", "kind": "check", "passed": True, "message": "", "metrics": {}}]
    return {"status": "passed", "cases": checks + [{"name": f"decode {i}", "kind": "benchmark", "passed": True,
                                                   "message": "", "metrics": m} for i, m in enumerate(cases)]}


def test_task5s_bar_is_the_copy_bandwidth_and_the_optional_part_never_costs_points():
    from harness.points import NOT_SCORED, OPTIONAL_PART

    points, why = score(5, _task5({"of_copy": 0.75}))  # halfway between none (60%) and full (90%)
    assert points == 3.5 and "K and V read at 75% of the copy bandwidth" in why and "ESTIMATE" not in why
    assert score(5, _task5({"of_copy": 0.95}, {"of_copy": 0.3, NOT_SCORED: "one block per head"}))[0] == 4
    # split-KV's case counts where it raises the share, never where it lowers it
    assert score(5, _task5({"of_copy": 0.95}, {"of_copy": 0.65, OPTIONAL_PART: "split-KV"}))[0] == 4
    assert score(5, _task5({"of_copy": 0.75}, {"of_copy": 0.95, OPTIONAL_PART: "split-KV"}))[0] == 3.75
    assert score(5, _task5({"of_copy": 0.55}))[0] == 3  # below the bar: none
    points, why = score(5, {"status": "passed", "cases": _task5()["cases"]})
    assert points == 3 and "the benchmarks did not run" in why
