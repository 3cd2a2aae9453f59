"""common.records: how a test run's cases become a status, an exit code and a JSON record."""

import json

from common.checks import CheckResult
from common.records import NeedsCuda, Report


def missing():
    raise NotImplementedError("see README, Task 9, step 1: do it")


def test_a_missing_step_stops_the_run(tmp_path):
    report = Report(9, solution=False, title="t")
    report.run("a", missing)
    report.run("b", lambda: CheckResult(True, "never runs"))
    assert report.status() == "not_implemented" and report.cases == []
    assert report.finish(str(tmp_path / "r.json")) == 1
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "not_implemented" and "step 1: do it" in record["not_implemented"]


def test_a_student_exception_fails_only_its_case():
    report = Report(9, solution=False, title="t")
    report.run("a", lambda: 1 / 0)
    report.run("b", lambda: CheckResult(True, "fine"))
    assert [c.passed for c in report.cases] == [False, True]
    assert "ZeroDivisionError" in report.cases[0].message and report.status() == "failed"


def test_parts_are_graded_independently():
    report = Report(9, solution=False, title="t")
    report.begin_part("one", (1,))
    report.run("a", missing)
    report.end_part("one")
    report.begin_part("two", (2,))
    report.run("b", lambda: CheckResult(True, "fine"))
    report.end_part("two")
    assert report.status() == "failed"
    assert [(c.name, c.passed) for c in report.cases] == [("one", False), ("b", True)]
    assert report.cases[0].message.startswith("not implemented yet")


def test_every_part_missing_is_not_implemented():
    report = Report(9, solution=False, title="t")
    for part in ("one", "two"):
        report.begin_part(part, (1,))
        report.run("x", missing)
        report.end_part(part)
    report.run("bad input", lambda: (True, "ok", {}))
    assert report.status() == "not_implemented"


def test_no_gpu_is_a_skip_not_a_failure():
    report = Report(9, solution=False, title="t")

    def no_gpu():
        raise NeedsCuda("no CUDA GPU")

    report.run("build", no_gpu)
    assert report.status() == "needs_cuda" and report.finish(None) == 0


def test_a_failed_benchmark_is_reported_as_failure():
    report = Report(9, solution=True, title="t")
    report.run("check", lambda: CheckResult(True, "ok"))
    report.run("bench", lambda: (False, "faster than the GPU's peak", {}), kind="benchmark")
    assert report.status() == "failed"
