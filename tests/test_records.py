"""harness.records: how a test run's cases become a status, an exit code and a JSON record."""

import json

import pytest

from harness.checks import CheckResult
from harness.records import NeedsCuda
from harness.records import Report as _Report
from harness.sandbox import WorkerDied, WorkerError
from grader import __main__ as grader_main
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def skeleton_dir(tmp_path, monkeypatch):
    """Task 1 as a skeleton, whatever state the real task1/ is in (students fill it in)."""
    todo = tmp_path / "task1" / "attention.py"
    todo.parent.mkdir()
    todo.write_text("# TODO (README, Task 1, step 1: do it)\n# TODO (README, Task 1, step 2: then this)\n")
    global STUDENT_DIR
    STUDENT_DIR = tmp_path
    return tmp_path


def Report(task, solution, title):  # noqa: N802  the report of a student checkout that is a skeleton
    return _Report(task, solution, title, STUDENT_DIR)


STUDENT_DIR = None


def missing():  # what the worker reports when a skeleton's step raises
    raise WorkerError("NotImplementedError", "see README, Task 1, step 1: do it", "")


def test_a_missing_step_stops_the_run(tmp_path):
    report = Report(1, solution=False, title="t")
    report.run("a", missing)
    report.run("b", lambda: CheckResult(True, "never runs"))
    assert report.status() == "not_implemented" and report.cases == []
    assert report.finish(str(tmp_path / "r.json")) == 1
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "not_implemented" and "README, Task 1, step 1" in record["not_implemented"]


def test_not_implemented_after_a_passing_check_is_an_ordinary_failure():
    report = Report(1, solution=False, title="t")
    report.run("a", lambda: CheckResult(True, "fine"))
    report.run("b", missing)
    report.run("c", lambda: CheckResult(True, "still runs"))
    assert report.status() == "failed" and [c.passed for c in report.cases] == [True, False, True]
    assert "NotImplementedError" in report.cases[1].message


def test_not_implemented_without_todo_lines_is_an_ordinary_failure():
    report = Report(9, solution=False, title="t")  # no task 9 files, so no TODO lines
    report.run("a", missing)
    assert report.status() == "failed" and not report.cases[0].passed


def test_an_untouched_output_is_not_implemented_only_while_steps_are_todo():
    untouched = CheckResult(False, "output is entirely NaN", untouched=True)
    skeleton = Report(1, solution=False, title="t")
    skeleton.run("a", lambda: untouched)
    assert skeleton.status() == "not_implemented"
    reference = Report(1, solution=True, title="t")
    reference.run("a", lambda: untouched)
    assert reference.status() == "failed" and "entirely NaN" in reference.cases[0].message


def test_a_student_exception_fails_only_its_case():
    def raises():
        raise WorkerError("ZeroDivisionError", "division by zero", "  File task1/attention.py, line 3\n")

    def dies():
        raise WorkerDied("the process running your code crashed with SIGSEGV (segmentation fault)")

    report = Report(9, solution=False, title="t")
    report.run("a", raises)
    report.run("b", dies)
    report.run("c", lambda: CheckResult(True, "fine"))
    assert [c.passed for c in report.cases] == [False, False, True]
    assert "ZeroDivisionError" in report.cases[0].message and "task1/attention.py" in report.cases[0].message
    assert "SIGSEGV" in report.cases[1].message and report.status() == "failed"


def run_part(report, name, steps, *checks, optional=False):
    report.begin_part(name, steps, optional=optional)
    for i, check in enumerate(checks):
        report.run(f"{name} {i}", check)
    report.end_part(name)


def test_parts_are_graded_independently():
    report = Report(1, solution=False, title="t")
    run_part(report, "one", (1,), missing)
    run_part(report, "two", (2,), lambda: CheckResult(True, "fine"))
    assert report.status() == "failed"
    assert [(c.name, c.passed) for c in report.cases] == [("one", False), ("two 0", True)]
    assert report.cases[0].message.startswith("not implemented yet")


def test_every_part_missing_is_not_implemented():
    report = Report(1, solution=False, title="t")
    for part in ("one", "two"):
        run_part(report, part, (1,), missing)
    report.run("bad input", lambda: (True, "ok", {}))
    assert report.status() == "not_implemented"


def test_a_part_on_a_step_found_missing_before_is_missing_without_running():
    report = Report(1, solution=False, title="t")
    ran = []
    run_part(report, "cpu", (1,), missing)
    run_part(report, "gpu", (1, 2), lambda: ran.append(1) or CheckResult(True, "never runs"))
    assert ran == [] and report.status() == "not_implemented"
    assert [c.name for c in report.cases] == ["cpu", "gpu"] and "step 1" in report.cases[1].message


def test_a_part_after_a_written_part_or_on_other_steps_runs():
    report = Report(1, solution=False, title="t")
    run_part(report, "cpu", (1,), lambda: CheckResult(False, "wrong"))
    run_part(report, "optional", (2,), missing, optional=True)  # step 2 found missing
    run_part(report, "gpu", (1,), lambda: CheckResult(True, "fine"))  # needs step 1 only
    assert [c.passed for c in report.cases] == [False, False, True]
    assert "step 2" in report.cases[1].message


def test_a_part_waiting_for_a_missing_step_says_so_and_the_hint_is_said_once(tmp_path, capsys):
    report = Report(1, solution=False, title="t")
    run_part(report, "one", (1,), missing)
    run_part(report, "both", (1, 2), missing)
    assert report.cases[1].message == "not run: it needs step 1, not implemented yet"
    report.finish(str(tmp_path / "r.json"))
    assert capsys.readouterr().out.count("delete a step's TODO line") == 1
    assert "delete a step's TODO line" in json.loads((tmp_path / "r.json").read_text())["not_implemented"]


def test_the_same_failure_on_many_cases_is_said_once(capsys):
    def raises(i):
        def fail():
            raise WorkerError("ValueError", f"bad row {i}", "  File task1/attention.py, line 3\n    x = y\n")
        return fail

    report = Report(9, solution=False, title="t")
    run_part(report, "part", (1,), *(raises(i) for i in range(4)), lambda: CheckResult(False, "other"))
    out = capsys.readouterr().out
    assert out.count("File task1/attention.py") == 1  # the traceback once; the record keeps all four
    assert sum("File task1/attention.py" in c.message for c in report.cases) == 4
    assert "[FAIL] 4 of 5 checks fail the same way; the first, part 0: raised ValueError: bad row 0" in out
    assert "also: part 1; part 2; part 3\n" in out and "[FAIL] part 4: other" in out
    assert len(report.cases) == 5 and not any(c.passed for c in report.cases)
    assert out.index("4 of 5 checks") < out.index("part 4: other")  # the most common kind first


def test_a_repeated_diagnosis_is_said_in_full_once_and_summed_up_before_the_rules(capsys):
    said = "looks like no scale: see README, Task 1, step 2. out: {} of 9 elements differ"
    report = Report(9, solution=False, title="t")
    for i in range(3):
        report.run(f"case {i}", lambda i=i: CheckResult(False, said.format(i + 1)))
    report.run("rule", lambda: (True, "kept", {}), kind="rule")
    out = capsys.readouterr().out
    assert out.count("elements differ") == 1 and out.count("looks like no scale") == 1
    assert "[FAIL] 3 of 3 checks: looks like no scale: see README, Task 1, step 2.\n" in out
    assert "the first, case 0: out: 1 of 9 elements differ\n      also: case 1; case 2\n" in out
    assert out.index("looks like no scale") < out.index("[PASS] rule")


def test_the_failures_lead_the_passes_and_a_run_that_passes_prints_a_line_a_check(capsys):
    said = "looks like no mask: see README, Task 4, step 3. out: {} of 9 elements differ"
    report = Report(9, solution=False, title="t")
    for i in range(12):
        report.run(f"pass {i}", lambda: (True, "exact", {}))
    for i in range(8):
        report.run(f"fail {i}", lambda i=i: CheckResult(False, said.format(i + 1)))
    report.run("raises", lambda: (False, "raised ValueError: no", {}))
    report.finish(None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "  [FAIL] 8 of 21 checks: looks like no mask: see README, Task 4, step 3."
    assert lines[2] == "      the first, fail 0: out: 1 of 9 elements differ"
    assert lines[3] == "      also: fail 1; fail 2; fail 3; and 4 more"
    assert lines[4] == "  [FAIL] raises: raised ValueError: no"
    assert lines[5] == "  [PASS] 12 of 21 checks: pass 0; pass 1; pass 2; and 9 more"
    assert lines[6].startswith("Task 9: 12/21 checks passed") and len(lines) == 7

    report = Report(9, solution=False, title="t")
    for i in range(3):
        report.run(f"pass {i}", lambda: (True, "exact", {}))
    report.finish(None)
    assert capsys.readouterr().out.splitlines()[1:4] == [f"  [PASS] pass {i}: exact" for i in range(3)]


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


def test_the_commit_is_marked_when_the_files_differ_from_it(tmp_path, monkeypatch):
    import subprocess

    import harness.records as records

    monkeypatch.setattr(records, "REPO", tmp_path)
    assert records._commit() is None  # not a git checkout
    git = lambda *args: subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / "kernel.cu").write_text("one")
    git("add", "kernel.cu")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert records._commit() == head
    (tmp_path / "kernel.cu").write_text("two")  # the files graded are not that commit's
    assert records._commit() == f"{head} with changes not committed"


def test_a_todo_line_left_on_a_step_that_passed_is_not_the_missing_step():
    report = Report(1, solution=False, title="t")  # both TODO lines still in the file
    run_part(report, "step 1", (1,), lambda: CheckResult(True, "fine"))  # written, its TODO line left
    run_part(report, "steps 1-2", (1, 2), missing)
    assert "step 2" in report.cases[-1].message and "step 1" not in report.cases[-1].message
    assert "delete a step's TODO line" in report.cases[-1].message  # the hint, with the first step found missing


def test_a_failure_carries_its_cause_into_the_record_the_grader_accepts(tmp_path):
    """The gradebook's timed_out and tampering flags follow these fields, whatever the messages say."""
    from harness.outcome import Cause
    from grader.runner import valid_record

    report = Report(1, solution=False, title="t")

    def hangs():
        raise WorkerDied("no answer", Cause.TIMED_OUT)

    report.run("hang", hangs)
    report.run("sanitizer", lambda: (False, "a call hung", {}, Cause.TIMED_OUT), kind="rule")
    report.run("fine", lambda: (True, "ok", {}))
    report.finish(str(tmp_path / "r.json"))
    record = valid_record(json.loads((tmp_path / "r.json").read_text()), 1)
    assert [(c["name"], c["cause"]) for c in record["cases"]] == [
        ("hang", Cause.TIMED_OUT), ("sanitizer", Cause.TIMED_OUT), ("fine", None)]
    record["cases"][2]["cause"] = "bogus"
    with pytest.raises(ValueError, match="a case is malformed"):
        valid_record(record, 1)
    with pytest.raises(AssertionError):  # a kind or cause outside the vocabulary is a bug of the test
        report.add("x", False, "", kind="checks")


def test_checks_finished_before_a_sigterm_are_still_printed():
    """The grader's time limit sends SIGTERM before it kills: the log then says which checks finished."""
    import subprocess
    import sys

    script = ("import os, signal\n"
              "from harness.checks import CheckResult\n"
              "from harness.records import Report\n"
              "r = Report(9, solution=False, title='t')\n"
              "r.run('first case', lambda: (True, 'fine', {}))\n"
              "r.run('second case', lambda: CheckResult(False, 'wrong'))\n"
              "os.kill(os.getpid(), signal.SIGTERM)\n"
              "print('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143 and "not reached" not in proc.stdout, proc.stdout + proc.stderr
    assert "[FAIL] second case: wrong" in proc.stdout and "[PASS] 1 of 2 checks: first case" in proc.stdout


# -- Results.md and results.json: the grader says each task's failures from its record --------------------------

def test_a_failure_shows_the_lines_after_its_first():
    message = "compiling task4/kernels/attention.cu failed:\n" + "\n".join(f"attention.cu({i}): error {i}" for i in range(9))
    record = {"status": "failed", "cases": [{"kind": "check", "passed": False, "name": "build", "message": message}]}
    details = grader_main._details({"task": 4, "record": record})
    assert details[:3] == ["- FAIL build: compiling task4/kernels/attention.cu failed:", "  attention.cu(0): error 0",
                           "  attention.cu(1): error 1"]
    assert details[-1] == "  ... and 3 more lines (python -m task4.test shows all)"


def test_failures_of_one_kind_are_said_once_with_their_count():
    """Results.md and results.json group failures as the console does: 32 backward cases failing the same way
    are one line with a count, not 32 lines (a scored check and an optional one are never one kind)."""
    diagnosed = ("looks like the backward pass without D = rowsum(dO * O): see README, Task 4, step 15. "
                 "dk: {n} of 100 elements differ")
    cases = [{"kind": "optional", "passed": False, "name": f"backward case {i}", "message": diagnosed.format(n=i + 5)}
             for i in range(32)]
    cases += [{"kind": "optional", "passed": False, "name": f"half case {i}", "message": f"out: {i} elements differ"}
              for i in range(3)]
    cases += [{"kind": "check", "passed": False, "name": "float32 case", "message": "out: 7 elements differ"},
              {"kind": "check", "passed": True, "name": "fine", "message": "ok"}]
    details = grader_main._details({"task": 4, "record": {"status": "failed", "cases": cases}})
    assert details[0] == ("- FAIL (optional) 32 checks: looks like the backward pass without D = rowsum(dO * O): "
                          "see README, Task 4, step 15.")
    assert details[1] == "  the first, backward case 0: dk: 5 of 100 elements differ"
    assert details[2] == "  also: backward case 1; backward case 2; backward case 3; and 28 more"
    assert details[3].startswith("- FAIL (optional) 3 checks fail the same way; the first, half case 0: out: 0")
    assert "- FAIL float32 case: out: 7 elements differ" in details
