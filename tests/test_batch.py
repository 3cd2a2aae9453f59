"""grader.batch: a class graded one submission after another, resumed and regraded, a gradebook (CPU).
Archives and where the checkout lies in them: tests/test_archives.py; the jobs on Slurm: tests/test_class_jobs.py."""

import csv
import io
import json
import os
import tempfile
import time

import pytest

from harness.outcome import Cause, Status
from harness.sanitize import PASS_NAME
from grader import batch, class_state, gather, gradebook, grading, submissions
from grader.rubric import TOTAL_POINTS
from tests.conftest import REPO, needs_solution, zipped


@needs_solution(1)
def test_a_class_is_graded_resumed_and_booked(tmp_path, capsys, monkeypatch):
    temp = tmp_path / "tmp"  # where the gradings' scratch copies go: nothing may be left in it
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    subs = tmp_path / "subs"
    subs.mkdir()
    solution = (REPO / "task1/solution/attention.py").read_text()
    zipped(subs / "good.zip", {"checkout/task1/attention.py": solution})
    (subs / "todo" / "task1").mkdir(parents=True)
    (subs / "todo" / "task1" / "attention.py").write_text((REPO / "task1/attention.py").read_text())
    (subs / "broken.zip").write_bytes(b"PK\x03\x04 not really")
    out = tmp_path / "out"
    assert batch.main([str(subs), "--out", str(out), "--tasks", "1", "--no-sandbox"]) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}
    assert rows["good"]["task1"] == "2" and rows["good"]["total"] == "2" and rows["good"]["task3"] == ""
    assert rows["todo"]["task1"] == "0" and rows["todo"]["problem"] == ""
    assert rows["broken"]["total"] == "0" and rows["broken"]["problem"].startswith("archive: not a readable archive")
    assert (out / "students/good/Results.md").exists() and (out / "students/good/grade.log").exists()
    about = json.loads((out / "students/good/grading.json").read_text())
    assert len(about["hidden"]) == 16 and about["tampering"] == [] and about["seconds"] > 0
    assert [a["outcome"] for a in class_state.attempts(out, "good")] == ["graded"]
    report = (out / "report.md").read_text()
    assert f"Hidden cases (grader/hidden.py, sha256): {about['hidden']}" in report and "Students: 3; with a total: 3" in report
    # out of the 2 points of the task graded, not the course's 20
    assert "## Totals (out of 2)" in report and "| [0, 0.5) | ██ 2 |" in report and "| [1.5, 2] | █ 1 |" in report
    assert "| 1. " in report and "| 3. " not in report
    capsys.readouterr()
    batch.main([str(subs), "--out", str(out), "--tasks", "1", "--no-sandbox"])  # resumes: only the failed one again
    assert "3 submissions, 1 to grade (2 graded already, for tasks 1)" in capsys.readouterr().out
    assert len(class_state.attempts(out, "broken")) == 2 and len(class_state.attempts(out, "good")) == 1
    batch.main([str(subs), "--out", str(out), "--tasks", "1", "--no-sandbox", "--only", "good"])
    assert "3 submissions, 1 to grade" in capsys.readouterr().out and len(class_state.attempts(out, "good")) == 2
    with pytest.raises(SystemExit):
        batch.main([str(subs), "--out", str(out), "--only", "nobody"])
    assert "--only: no submission for nobody" in capsys.readouterr().err
    assert not list(temp.iterdir())


def test_the_report_draws_the_class_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is optional (pip install matplotlib)")
    klass = {"students": [{"id": "ann"}, {"id": "bob"}], "round": "r1", "tasks": "1,4"}
    _record_folder(tmp_path / "students/ann", score=2, entries=[
        (4, {"status": "passed", "record": {"cases": [{**_case("b", True, "benchmark"),
                                                       "metrics": {"vs_reference": 0.9}}]}})])
    _record_folder(tmp_path / "students/bob", score=0)
    report = gradebook.report(tmp_path, klass).read_text()
    for name in ("totals", "tasks", "task4_speedup"):
        assert f"![{name}](plots/{name}.png)" in report
        assert (tmp_path / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_counts_totals_out_of_the_tasks_graded(tmp_path):
    students = {"ann": 0, "bob": 0.5, "cy": 1, "dee": 3}  # dee's grade is an earlier one, on other tasks
    for sid, total in students.items():
        _record_folder(tmp_path / "students" / sid, score=total)
    klass = {"students": [{"id": sid} for sid in students], "round": "r1", "tasks": "7"}
    report = gradebook.report(tmp_path, klass).read_text()
    assert "## Totals (out of 1)" in report
    assert "| [0, 0.5) | █ 1 |" in report and "| [0.5, 1] | ██ 2 |" in report
    assert "| more: graded on other tasks | █ 1 |" in report
    del klass["tasks"]  # a class.json that does not say: the whole course
    assert f"## Totals (out of {TOTAL_POINTS:g})" in gradebook.report(tmp_path, klass).read_text()


def _record_folder(folder, score=None, error=None, entries=()):
    folder.mkdir(parents=True)
    if score is not None:
        (folder / "results.json").write_text(json.dumps({"score": score, "tests": [
            {"name": "Task 1: naive", "score": score, "max_score": 2}]}))
    if error is not None:
        (folder / "error.json").write_text(json.dumps({"score": 0, "error": error, "tests": []}))
    for task, entry in entries:
        (folder / "graded").mkdir(exist_ok=True)
        (folder / "graded" / f"task{task}.json").write_text(json.dumps({"key": {}, "when": "", "entry": entry}))
    return folder


def test_a_failed_regrade_never_replaces_an_earlier_grade(tmp_path):
    _record_folder(tmp_path / "students" / "ann", score=2)
    crashed = _record_folder(tmp_path / "work" / "ann", score=0)  # the grader's own failure record ...
    grading._failed(crashed, "the grader exited with code 1 (see grade.log)")  # ... set aside as it fails
    assert (crashed / "grader-failure.json").exists() and not (crashed / "results.json").exists()
    assert grading.commit(tmp_path, "ann", crashed)
    assert json.loads((tmp_path / "students/ann/results.json").read_text())["score"] == 2
    kept = grading.commit(tmp_path, "ann", _record_folder(tmp_path / "work" / "ann", error="timed out: ..."))
    assert kept and json.loads((tmp_path / "students/ann/results.json").read_text())["score"] == 2
    assert json.loads((tmp_path / "students/ann/regrade-failed.json").read_text())["error"] == "timed out: ..."
    assert not (tmp_path / "work" / "ann").exists()
    # a regrade that finished replaces it, lower or not, and the note of the failure goes with the old folder
    assert not grading.commit(tmp_path, "ann", _record_folder(tmp_path / "work" / "ann", score=1))
    assert json.loads((tmp_path / "students/ann/results.json").read_text())["score"] == 1
    assert not (tmp_path / "students/ann/regrade-failed.json").exists()
    # a commit killed between its two renames: the grade it had set aside is put back first
    (tmp_path / "students/ann").rename(tmp_path / "work/.ann.old")
    assert grading.commit(tmp_path, "ann", _record_folder(tmp_path / "work" / "ann", error="killed"))
    assert json.loads((tmp_path / "students/ann/results.json").read_text())["score"] == 1


def _case(name, passed, kind="check", message=""):
    return {"name": name, "kind": kind, "passed": passed, "message": message, "metrics": {}}


def test_the_gradebook_flags_what_each_task_record_shows(tmp_path):
    """Records as a kit before harness/outcome.py wrote them (no causes): a class graded then keeps its flags."""
    klass = {"students": [{"id": s} for s in ("ann", "bob", "cy", "dee")], "round": "r1", "tasks": "1,2,4"}
    _record_folder(tmp_path / "students/ann", score=2, entries=[
        (2, {"status": "failed", "record": {"cases": [_case("build", False)]}}),
        (4, {"status": "failed", "record": {"cases": [_case(PASS_NAME, False, "rule"), _case("x", True),
                                                      {**_case("b", True, "benchmark"), "metrics": {"vs_reference": 0.5}},
                                                      {**_case("c", True, "benchmark"), "metrics": {"vs_reference": 1.0}}]}}),
        (1, {"status": "crashed", "summary": "timed out after 600 s (a hang or an endless loop?)", "record": None})])
    _record_folder(tmp_path / "students/bob", score=0, entries=[
        (1, {"status": "failed", "record": {"cases": [_case("PyTorch's own attention", False, "rule"),
                                                      _case("y", False, message="your code did not answer within 300 s")]}}),
        (2, {"status": "crashed", "summary": "its record is malformed (no list of cases), so it could not be scored"})])
    (tmp_path / "students/bob/grading.json").write_text(json.dumps({"tampering": ["task1/attention.py is a link"]}))
    _record_folder(tmp_path / "students/cy", error="timed out: the grading took longer than 60 s")
    rows = {r["student"]: r for r in gradebook.rows(tmp_path, klass)}
    ann, bob, cy, dee = rows["ann"], rows["bob"], rows["cy"], rows["dee"]
    assert (ann["not_built"], ann["sanitizer"], ann["timed_out"], ann["own_work"]) == ("2", "4", "1", "")
    assert ann["task4_speedup"] == "0.750" and ann["total"] == "2" and ann["problem"] == ""
    assert (bob["own_work"], bob["timed_out"], bob["tampering"]) == ("1", "1", "all")
    assert (cy["total"], cy["timed_out"], cy["problem"]) == ("0", "all", "timed out: the grading took longer than 60 s")
    assert (dee["total"], dee["problem"]) == ("", "not graded yet")


def test_the_gradebook_flags_follow_the_recorded_causes_not_the_words(tmp_path):
    klass = {"students": [{"id": "ann"}, {"id": "bob"}], "round": "r1", "tasks": "1,2,3"}
    _record_folder(tmp_path / "students/ann", score=0, entries=[
        (1, {"status": "failed", "record": {"cases": [  # a hang while importing: timed_out, not not_built
            {**_case("import", False, message="no answer"), "cause": Cause.TIMED_OUT}]}}),
        (2, {"status": "failed", "record": {"cases": [{**_case("x", False, message="odd"), "cause": Cause.MALFORMED},
                                                      {**_case("y", False, message="did not answer within"),
                                                       "cause": None}]}}),
        (3, {"status": Status.CRASHED, "summary": "ran out of its minutes", "cause": Cause.TIMED_OUT})])
    _record_folder(tmp_path / "students/bob", score=0, entries=[
        (1, {"status": Status.CRASHED, "summary": "timed out, a malformed record", "cause": None})])
    rows = {r["student"]: r for r in gradebook.rows(tmp_path, klass)}
    assert (rows["ann"]["timed_out"], rows["ann"]["tampering"], rows["ann"]["not_built"]) == ("1 3", "2", "")
    assert (rows["bob"]["timed_out"], rows["bob"]["tampering"]) == ("", "")


def test_a_grading_stopped_from_outside_is_tried_once_more_then_recorded(tmp_path):
    klass = {"students": [{"id": "ann"}], "round": "r1", "todo": [0]}
    stop = {"round": "r1", "job": "local", "started": "t", "ended": "t", "outcome": "stopped by SIGTERM (...)"}
    class_state.save_attempts(tmp_path, "ann", [{**stop, "round": "r0"}, stop])
    assert class_state.tries_left(tmp_path, "ann", klass) == 1  # an earlier round's attempt does not count
    row = gradebook.student_row(tmp_path, "ann")
    assert row["total"] == "" and row["problem"].startswith("stopped by SIGTERM (...); not graded yet")
    class_state.save_attempts(tmp_path, "ann", [stop, {**stop, "state": "TIMEOUT"}])
    row = gradebook.student_row(tmp_path, "ann")
    assert (row["total"], row["timed_out"]) == ("0", "all") and row["problem"].endswith("2 times; not graded")
    _record_folder(tmp_path / "students/ann", score=2)  # an earlier grade: a stopped regrade leaves it standing
    row = gradebook.student_row(tmp_path, "ann")
    assert row["total"] == "2" and row["problem"].startswith("a regrade was stopped by SIGTERM")


def test_a_row_tells_the_students_last_round(tmp_path):
    stop = {"job": "1_0", "started": "t", "ended": "t", "outcome": "stopped by Slurm: TIMEOUT", "state": "TIMEOUT"}
    class_state.save_attempts(tmp_path, "ann", [{**stop, "round": "r1"}, {**stop, "round": "r1"}])
    # the class was sent again since (round r2) with --only others: ann's row stays what r1 made it
    row = gradebook.student_row(tmp_path, "ann")
    assert (row["total"], row["timed_out"]) == ("0", "all") and row["problem"].endswith("2 times; not graded")
    class_state.save_attempts(tmp_path, "ann", class_state.attempts(tmp_path, "ann") + [{**stop, "round": "r3"}])
    row = gradebook.student_row(tmp_path, "ann")  # ann is in round r3, stopped once: sent once more
    assert row["total"] == "" and row["problem"].endswith("not graded yet (the gather job sends it once more)")


def test_what_a_grade_remembers_decides_a_rerun_also_for_grades_of_an_older_kit(tmp_path):
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    source, folder = tmp_path / "subs" / "ann", tmp_path / "out" / "students" / "ann"
    _record_folder(folder, score=2)
    klass = {"tasks": "1", "regrade": None, "no_sandbox": False}
    about = {"tasks": "1", "source_sha256": submissions.source_fingerprint(source)}
    (folder / "grading.json").write_text(json.dumps(about))  # an older kit's: no "no_sandbox"
    assert class_state.grade_state(tmp_path / "out", "ann", source, klass) == "graded"
    (folder / "command.txt").write_text("python -m grader --submission X --no-sandbox\n")
    assert class_state.grade_state(tmp_path / "out", "ann", source, klass) == "sandbox"
    (folder / "command.txt").unlink()
    # a regrade failed on files that are no longer there: try again, so its note does not stay forever
    failed = {"error": "submission: 2 submissions with this id", "tasks": "1", "regrade": None,
              "source_sha256": "something else"}
    (folder / "regrade-failed.json").write_text(json.dumps(failed))
    assert class_state.grade_state(tmp_path / "out", "ann", source, klass) == "changed"
    failed["source_sha256"] = about["source_sha256"]  # the same files (an older kit's note): not tried again
    (folder / "regrade-failed.json").write_text(json.dumps(failed))
    assert class_state.grade_state(tmp_path / "out", "ann", source, klass) == "graded"


def test_an_unfinished_attempt_is_settled_as_stopped(tmp_path):
    class_state.save_attempts(tmp_path, "ann", [{"round": "r1", "job": "local", "started": "t"}])
    assert gather.settle(tmp_path, "ann")
    (last,) = class_state.attempts(tmp_path, "ann")
    assert last["outcome"] == "stopped before it finished" and "ended" in last


@needs_solution(1)
def test_a_rerun_regrades_what_changed_resumes_a_regrade_and_keeps_the_class_tasks(tmp_path, capsys, monkeypatch):
    subs, out = tmp_path / "subs", tmp_path / "out"
    solution = (REPO / "task1/solution/attention.py").read_text()
    for sid, text in (("alice", solution), ("bob", (REPO / "task1/attention.py").read_text())):
        (subs / sid / "task1").mkdir(parents=True)
        (subs / sid / "task1" / "attention.py").write_text(text)
    (subs / "bob" / "notes.txt").write_text("not graded: changing it changes nothing")
    run = lambda *extra: batch.main([str(subs), "--out", str(out), "--no-sandbox", *extra])  # noqa: E731
    assert run("--tasks", "1") == 0
    totals = lambda: {r["student"]: r["total"] for r in csv.DictReader(open(out / "gradebook.csv"))}  # noqa: E731
    assert totals() == {"alice": "2", "bob": "0"}
    capsys.readouterr()

    (subs / "bob" / "notes.txt").write_text("edited")
    run()  # no --tasks: the class's
    assert "2 submissions, 0 to grade (2 graded already, for tasks 1)" in capsys.readouterr().out
    (subs / "bob" / "task1" / "attention.py").write_text(solution)  # bob resubmits
    run()
    said = capsys.readouterr().out
    assert "2 submissions, 1 to grade" in said and "files changed since their grade: bob" in said
    assert totals() == {"alice": "2", "bob": "2"}

    with pytest.raises(SystemExit):  # the default (all tasks) or any other set would regrade everyone
        run("--tasks", "1,3")
    assert "is graded on tasks 1, not 1,3: leave --tasks out" in capsys.readouterr().err

    real, graded_now = grading.grade_one, []

    def stopped_after_one(*args):
        if graded_now:
            raise KeyboardInterrupt  # the instructor's ^C in the middle of the regrade
        graded_now.append(args[2])
        return real(*args)

    monkeypatch.setattr(grading, "grade_one", stopped_after_one)
    assert run("--regrade") == 130  # a clean stop, not a traceback
    said = capsys.readouterr().err
    assert "stopped (Ctrl-C)" in said and "run the same command again" in said and "Traceback" not in said
    monkeypatch.setattr(grading, "grade_one", real)
    run()  # goes on with the regrade: bob, whom it had not reached
    said = capsys.readouterr().out
    assert graded_now == ["alice"] and "1 to grade" in said and "not yet graded again by the --regrade: bob" in said
    run()
    assert "0 to grade" in capsys.readouterr().out


def test_a_grading_stopped_by_ctrl_c_is_written_down_as_stopped(tmp_path, monkeypatch):
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    klass = class_state.write_class(tmp_path, [("ann", tmp_path / "subs" / "ann")], "1", 60, True)

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(grading, "_grade", interrupted)
    with pytest.raises(KeyboardInterrupt):
        grading.grade_one(tmp_path, klass, "ann", tmp_path / "subs" / "ann")
    (attempt,) = class_state.attempts(tmp_path, "ann")
    assert attempt["outcome"].startswith("stopped by Ctrl-C") and "ended" in attempt
    assert class_state.grade_state(tmp_path, "ann", tmp_path / "subs" / "ann", klass) == "missing"  # graded next run


def test_a_gradings_log_keeps_its_first_and_last_part_and_says_the_cut(tmp_path):
    text = b"".join(f"line {i}\n".encode() for i in range(200_000))  # about 2 MB
    grading.keep_capped(io.BytesIO(text), tmp_path / "small.log", limit=len(text) + 1)
    assert (tmp_path / "small.log").read_bytes() == text  # within the limit: all of it, as it came
    grading.keep_capped(io.BytesIO(text), tmp_path / "big.log", limit=100_000)
    kept = (tmp_path / "big.log").read_bytes()
    assert len(kept) < 100_000 + (1 << 16) + 200  # the tail is kept in the pipe's reads: up to one more
    assert kept.startswith(text[:50_000]) and kept.endswith(text[-49_000:])
    head, said = kept[:50_000], kept[50_000:].split(b"...]\n", 1)
    cut = int(said[0].split(b"[... ")[1].split(b" bytes")[0])
    assert len(head) + cut + len(said[1]) == len(text)  # every byte is kept or counted as cut
    stream = io.BytesIO(text)
    grading.keep_capped(stream, tmp_path / "no-such-folder" / "grade.log")  # the log cannot be written
    assert stream.read() == b""  # the pipe was read to its end all the same


def test_only_takes_an_id_that_holds_a_comma(tmp_path, capsys, monkeypatch):
    subs = tmp_path / "subs"
    for sid in ("Doe, Jane", "Roe", "Poe"):
        (subs / sid).mkdir(parents=True)
    chosen = []
    monkeypatch.setattr(grading, "grade_locally", lambda out, klass, todo: chosen.extend(todo))
    monkeypatch.setattr(grading, "prebuild", lambda out: 0)
    batch.main([str(subs), "--out", str(tmp_path / "out"), "--tasks", "1", "--only", "Doe, Jane", "--only", "Roe,Poe"])
    assert sorted(class_state.load_class(tmp_path / "out")["students"][n]["id"] for n in chosen) == ["Doe, Jane", "Poe", "Roe"]


def test_the_report_flags_a_class_graded_on_mixed_task_sets(tmp_path):
    out = tmp_path / "out"
    klass = class_state.write_class(out, [("a", tmp_path / "a"), ("b", tmp_path / "b")], "1", 60, False)
    for sid, tasks in (("a", "1"), ("b", "1,3")):
        (out / "students" / sid).mkdir(parents=True)
        (out / "students" / sid / "grading.json").write_text(json.dumps({"tasks": tasks}))
    report = gradebook.report(out, klass).read_text()
    assert "Graded on mixed task sets**: tasks 1 (1 students), tasks 1,3 (1 students)" in report


def test_namesakes_follow_the_folder_as_it_changes(tmp_path):
    from grader.submissions import namesakes

    (tmp_path / "alice").mkdir()
    (tmp_path / "alice.zip").write_bytes(b"")
    (tmp_path / "bob").mkdir()
    assert namesakes(tmp_path / "alice.zip") == [tmp_path / "alice"]
    assert namesakes(tmp_path / "bob") == []
    time.sleep(1.1)  # past the coarsest clock a file system keeps a folder's time with
    os.rmdir(tmp_path / "alice")  # the folder's time changes: it is read again
    assert namesakes(tmp_path / "alice.zip") == []


def test_the_kit_fingerprint_covers_every_folder_of_the_kits_code(tmp_path, monkeypatch):
    """`--keep` and a class's gradebook trust it to change with any of the kit's code, the trusted side included."""
    from common.tasks import KIT_FOLDERS
    from grader import fingerprints

    monkeypatch.setattr(fingerprints, "REPO", tmp_path)
    monkeypatch.setattr(fingerprints, "all_student_files", lambda: ["task1/attention.py"])
    for folder in KIT_FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "code.py").write_text("x = 1\n")
    (tmp_path / "task1" / "attention.py").write_text("student = 1\n")
    before = fingerprints.kit_fingerprint()
    (tmp_path / "task1" / "attention.py").write_text("student = 2\n")  # the student's file: not the kit
    assert fingerprints.kit_fingerprint() == before
    assert "harness" in KIT_FOLDERS
    for folder in KIT_FOLDERS:
        (tmp_path / folder / "code.py").write_text("x = 2\n")
        assert fingerprints.kit_fingerprint() != before, folder
        (tmp_path / folder / "code.py").write_text("x = 1\n")
    assert fingerprints.kit_fingerprint() == before
