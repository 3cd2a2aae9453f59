"""Submissions as learning-management systems and archivers really export them (grader/submissions.py)."""

import csv
import zipfile

import pytest

from grader import batch, submissions
from tests.conftest import REPO, needs_solution

CODE = "x = 1\n"


def _zip(path, files):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name), data)  # the name as given: "\\" kept, as Windows zip tools write it
    return path


def test_windows_separators_are_folders_and_never_a_way_out(tmp_path):
    archive = _zip(tmp_path / "s.zip", {"repo\\task1\\attention.py": CODE, "repo\\task3\\attention.py": CODE})
    root = submissions.locate(archive, tmp_path / "out")
    assert root == tmp_path / "out" / "outer" / "repo" and (root / "task1/attention.py").read_text() == CODE
    for name in ("..\\..\\evil.py", "\\evil.py", "repo\\..\\..\\evil.py"):
        with pytest.raises(submissions.BadArchive, match="outside its folder") as err:
            submissions.unpack(_zip(tmp_path / "bad.zip", {name: CODE}), tmp_path / f"x{len(name)}")
        assert err.value.tampering
    assert not list(tmp_path.rglob("evil.py"))


def _nested(tmp_path, depth: int):
    """level1.zip holding level2.zip ... holding the checkout, `depth` archives in all."""
    inner = _zip(tmp_path / f"level{depth}.zip", {"task1/attention.py": CODE})
    for level in range(depth - 1, 0, -1):
        inner = _zip(tmp_path / f"level{level}.zip", {f"level{level + 1}.zip": inner.read_bytes()})
    return inner


def test_archives_nested_three_deep_are_opened(tmp_path):
    root = submissions.locate(_nested(tmp_path, 3), tmp_path / "out")
    assert (root / "task1/attention.py").read_text() == CODE


def test_archives_nested_past_the_limit_name_each_level(tmp_path, monkeypatch):
    monkeypatch.setattr(submissions, "MAX_NESTING", 2)
    with pytest.raises(submissions.NotGradable) as err:
        submissions.locate(_nested(tmp_path, 4), tmp_path / "out")
    assert "(in level1.zip > level2.zip > level3.zip)" in str(err.value)
    assert "nested deeper than the 2 archives the kit opens" in str(err.value)


def test_the_limits_hold_for_nested_archives_together(tmp_path, monkeypatch):
    """What each archive gives below the byte limit, both together above it: refused."""
    data = "#" * 120
    inner = _zip(tmp_path / "inner.zip", {"task1/attention.py": data, "task3/attention.py": data})
    outer = _zip(tmp_path / "outer.zip", {"inner.zip": inner.read_bytes()})  # gives inner.zip's bytes
    limit = inner.stat().st_size + 100  # above each: inner.zip itself, then its two files (240 bytes)
    monkeypatch.setattr(submissions, "MAX_BYTES", limit)
    assert submissions.locate(inner, tmp_path / "alone")  # within the limit alone
    with pytest.raises(submissions.BadArchive, match="MiB unpacked"):
        submissions.locate(outer, tmp_path / "out")


def _entries(folder, names):
    folder.mkdir()
    for name in names:
        if name.endswith("/"):
            (folder / name / "task1").mkdir(parents=True)
            (folder / name / "task1/attention.py").write_text(CODE)
        elif name.endswith(".zip"):
            _zip(folder / name, {"task1/attention.py": CODE})
        elif name.endswith("_"):  # a Moodle folder of online text
            (folder / name).mkdir()
            (folder / name / "onlinetext.html").write_text("<p>text</p>\n")
        else:
            (folder / name).write_text("receipt\n")
    return folder


def test_canvas_resubmissions_are_one_student_the_latest_graded(tmp_path):
    folder = _entries(tmp_path / "canvas", ["smith_john_12345_67890_submission.zip",
                                            "smith_john_LATE_12345_67891_submission-1.zip",
                                            "doe_jane_23456_67000_hw.zip"])
    found = submissions.discover(folder)
    assert [sid for sid, _ in found] == ["doe_jane_23456", "smith_john_12345"]
    assert dict(found)["smith_john_12345"].name == "smith_john_LATE_12345_67891_submission-1.zip"
    assert submissions.superseded(folder) == {"smith_john_12345": ["smith_john_12345_67890_submission.zip"]}
    latest = dict(found)["smith_john_12345"]
    assert submissions.namesakes(latest) == []  # the export orders them: no question to ask
    assert submissions.locate(latest, tmp_path / "out")


def test_moodle_folders_and_blackboard_attempts(tmp_path):
    moodle = _entries(tmp_path / "moodle", ["Jane Doe_123456_assignsubmission_file_/",
                                            "Jane Doe_123456_assignsubmission_onlinetext_/",
                                            "John Roe_123457_assignsubmission_file_/"])
    assert [sid for sid, _ in submissions.discover(moodle)] == ["Jane Doe_123456", "John Roe_123457"]
    board = _entries(tmp_path / "board", ["HW1_jdoe_attempt_2026-11-30-10-15-02_upload.zip",
                                          "HW1_jdoe_attempt_2026-11-30-10-15-02.txt",
                                          "HW1_jdoe_attempt_2026-12-01-09-00-00_upload.zip",
                                          "HW1_jdoe_attempt_2026-12-01-09-00-00.txt"])
    assert [(sid, p.name) for sid, p in submissions.discover(board)] == [
        ("HW1_jdoe", "HW1_jdoe_attempt_2026-12-01-09-00-00_upload.zip")]
    assert submissions.superseded(board) == {"HW1_jdoe": ["HW1_jdoe_attempt_2026-11-30-10-15-02_upload.zip"]}
    # user names with "_" stay apart; a student who sent text alone keeps a row (its grading says why it is 0)
    names = _entries(tmp_path / "names", ["HW_1_john_smith_attempt_2026-11-30-10-15-02_a.zip",
                                          "HW_1_jane_smith_attempt_2026-11-30-11-00-00_a.zip",
                                          "HW_1_kim_attempt_2026-11-30-12-00-00.txt",
                                          "Lee Park_123458_assignsubmission_onlinetext_"])
    assert [sid for sid, _ in submissions.discover(names)] == ["HW_1_jane_smith", "HW_1_john_smith", "HW_1_kim",
                                                               "Lee Park_123458"]


def test_an_archive_goes_before_a_write_up_sent_with_it(tmp_path):
    folder = _entries(tmp_path / "canvas", ["ann_lee_12345_67890_code.zip", "ann_lee_12345_67891_report.pdf"])
    assert [(sid, p.name) for sid, p in submissions.discover(folder)] == [("ann_lee_12345",
                                                                          "ann_lee_12345_67890_code.zip")]


def test_gradescopes_metadata_names_the_students_and_is_no_student(tmp_path):
    folder = _entries(tmp_path / "gradescope", ["submission_111/", "submission_222/"])
    (folder / "submission_metadata.yml").write_text(
        "submission_111:\n"
        "  :submitters:\n"
        "  - :name: Ann Lee\n"
        "    :sid: '900123'\n"
        "    :email: ann@uni.edu\n"
        "  :created_at: 2026-11-30 10:00:00.000000000 -08:00\n"
        "submission_222:\n"
        "  :submitters:\n"
        "  - :name: Bo Park\n"
        "    :email: bo@uni.edu\n"
        "  - :name: Cy Diaz\n"
        "    :sid: '900456'\n"
        "  :created_at: 2026-11-30 11:00:00.000000000 -08:00\n")
    found = submissions.discover(folder)
    assert [(sid, p.name) for sid, p in found] == [("900123", "submission_111"),
                                                  ("bo@uni.edu+900456", "submission_222")]
    # an id that would name a folder above the class's, or a hidden one: not taken
    (folder / "submission_metadata.yml").write_text("submission_111:\n  :submitters:\n  - :sid: '..'\n")
    assert [sid for sid, _ in submissions.discover(folder)] == ["submission_111", "submission_222"]


def test_an_unknown_layout_keeps_one_row_per_entry(tmp_path):
    folder = _entries(tmp_path / "plain", ["alice/", "bob.zip", "alice_2024_final.zip", "lab_3_1_final.zip"])
    assert [sid for sid, _ in submissions.discover(folder)] == ["alice", "alice_2024_final", "bob", "lab_3_1_final"]


@needs_solution(1)
def test_a_class_of_such_exports_grades_correct_work_full_one_row_each(tmp_path):
    """Through grader.batch: a Windows zip, a zip nested three deep, a Canvas resubmission and Gradescope's
    metadata in one folder; each student's correct task 1 gets full points, one row each, the metadata none."""
    good = (REPO / "task1/solution/attention.py").read_text()
    subs = tmp_path / "subs"
    subs.mkdir()
    _zip(subs / "win_ann_111_201_hw.zip", {"hw\\task1\\attention.py": good})
    nested = _nested_holding(tmp_path, good)
    (subs / "deep_bo_112_202_hw.zip").write_bytes(nested.read_bytes())
    _zip(subs / "late_cy_113_203_hw.zip", {"task1/attention.py": "broken("})
    _zip(subs / "late_cy_LATE_113_204_hw-1.zip", {"task1/attention.py": good})
    (subs / "submission_metadata.yml").write_text("{}\n")
    out = tmp_path / "out"
    assert batch.main([str(subs), "--out", str(out), "--tasks", "1", "--no-sandbox"]) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}
    assert {sid: r["total"] for sid, r in rows.items()} == {"deep_bo_112": "2", "late_cy_113": "2", "win_ann_111": "2"}
    assert rows["late_cy_113"]["superseded"] == "late_cy_113_203_hw.zip"


def _nested_holding(tmp_path, code):
    inner = _zip(tmp_path / "level3.zip", {"task1/attention.py": code})
    middle = _zip(tmp_path / "level2.zip", {"level3.zip": inner.read_bytes()})
    return _zip(tmp_path / "level1.zip", {"level2.zip": middle.read_bytes()})
