"""A class exported the way learning-management systems export it, graded on tasks 1 and 3 (CPU).

One class holds every layout and every kind of entry an instructor meets: the checkout two folders
deep in a zip beside its .venv, the upload inside the student's folder as a plain .tar, an id that
holds a comma, an archive the kit cannot read, a lone file, an empty zip, a checkout left inside a
folder that is never graded, one student who uploaded twice, a link to a classmate's folder, and a
submission missing a graded file. Every entry must be a row that says
what went wrong, and reruns must regrade exactly the students whose files changed.

Elsewhere: hostile archives and each layout alone (tests/test_archives.py), an interrupted --regrade and
the mixed-task-set flag (tests/test_batch.py), a hang at import with tasks 1 and 3
(tests/test_grader.py), Slurm (tests/test_class_jobs.py with a fake sinfo/sbatch, tests/test_slurm.py).
"""

import csv
import io
import json
import shutil
import tarfile
import tempfile
import zipfile

import pytest

from grader import batch, class_state
from tests.conftest import REPO, needs_solution

SOLUTIONS = {rel: (REPO / rel.replace("/", "/solution/", 1)).read_text()
             for rel in ("task1/attention.py", "task3/attention.py")} if (REPO / "task1/solution").is_dir() else {}
SKELETONS = {rel: (REPO / rel).read_text() for rel in ("task1/attention.py", "task3/attention.py")}
# task 1 done, task 3 not started: graded whole, and quickly (a full grading of task 3 takes a minute on CI's CPU,
# so only "deep" has one)
PARTLY = {**SOLUTIONS, "task3/attention.py": SKELETONS["task3/attention.py"]} if SOLUTIONS else {}
VENV = {f".venv/lib/python3.12/site-packages/pkg{i // 100}/m{i}.py": "" for i in range(2500)}


def _zip(path, files):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


def _tar_bytes(files):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tf:  # a plain, uncompressed tar
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data.encode())
            tf.addfile(info, io.BytesIO(data.encode()))
    return buffer.getvalue()


def _write(folder, files):
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(data)


def _in(prefix, files):
    return {prefix + name: data for name, data in files.items()}


def make_class(subs):
    subs.mkdir()
    # the repository zipped with the .venv the README has students make, two folders deep
    _zip(subs / "deep.zip", _in("x-submission/attention-course-main/", SOLUTIONS | VENV))
    # the LMS keeps the student's upload (a plain .tar) in a folder of its own
    (subs / "lms").mkdir()
    (subs / "lms" / "upload.tar").write_bytes(_tar_bytes(_in("attention-course/", PARTLY)))
    (subs / "lms" / "comment.txt").write_text("see my upload")
    _write(subs / "Doe, Jane", SKELETONS)  # an id with a comma; she resubmits later
    (subs / "dave.rar").write_bytes(b"Rar!\x1a\x07\x00")
    (subs / "erin.py").write_text(SOLUTIONS["task1/attention.py"])
    _zip(subs / "empty.zip", {})
    _zip(subs / "fay.zip", _in("repo/build/", SOLUTIONS))  # only inside a folder that is never graded
    _zip(subs / "gus.zip", PARTLY)  # uploaded twice: a zip and a folder
    _write(subs / "gus", SKELETONS)
    (subs / "hal").symlink_to(subs / "lms")  # a link to a classmate's work
    _write(subs / "ida", {"task3/attention.py": "x = 1\n"})  # task 1's file missing


def rows(out):
    return {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}


@needs_solution(1)
@needs_solution(3)
def test_a_class_as_an_lms_exports_it_is_graded_whole_and_rerun_right(tmp_path, capsys, monkeypatch):
    temp = tmp_path / "tmp"  # where the gradings' scratch copies go: nothing may be left in it
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    subs, out = tmp_path / "subs", tmp_path / "out"
    make_class(subs)
    sandbox = [] if shutil.which("bwrap") else ["--no-sandbox"]
    run = lambda *extra: batch.main([str(subs), "--out", str(out), *sandbox, *extra])  # noqa: E731

    assert run("--tasks", "1,3") == 0
    book = rows(out)
    assert sorted(book) == ["Doe, Jane", "dave", "deep", "empty", "erin", "fay", "gus", "hal", "ida", "lms"]
    # found two folders deep beside a .venv, and inside the upload
    assert (book["deep"]["task1"], book["deep"]["task3"], book["deep"]["total"], book["deep"]["problem"]) == ("2", "3", "5", "")
    assert (book["lms"]["task1"], book["lms"]["task3"], book["lms"]["total"], book["lms"]["problem"]) == ("2", "0", "2", "")
    assert (book["Doe, Jane"]["total"], book["Doe, Jane"]["problem"]) == ("0", "")  # the skeleton: graded, 0
    problems = {sid: book[sid]["problem"] for sid in ("dave", "erin", "empty", "fay", "gus", "hal", "ida")}
    assert all(book[sid]["total"] == "0" for sid in problems)
    assert problems["dave"].startswith("submission: dave.rar: a file the kit cannot read as a submission")
    assert problems["erin"].startswith("submission: erin.py: a file the kit cannot read as a submission")
    assert "none of the files students write" in problems["empty"]
    assert ("only inside folders that are never graded (repo/build/task1/attention.py, repo/build/task3/attention.py; "
            "build/ is never graded)") in problems["fay"]
    assert "2 submissions with this id (gus/, gus.zip): which one counts?" in problems["gus"]
    assert problems["hal"].startswith("submission: a link, not a folder or archive")
    assert book["hal"]["tampering"] == "all"
    assert problems["ida"] == "missing from the submission: task1/attention.py"  # graded all the same: 0
    results = (out / "students/deep/Results.md").read_text()
    assert "- Graded: submission deep\n" in results  # its id, not its top folder attention-course-main
    report = (out / "report.md").read_text()
    assert "Students: 10; with a total: 10" in report
    # per task: the mean over all 10, a submission that could not be graded counting 0
    assert "| 1. naive multi-head attention (PyTorch) | 2 | 0.40 | 2 | 8 |" in report
    assert "| 3. FlashAttention-2 (PyTorch) | 3 | 0.30 | 1 | 9 |" in report
    assert "| [2, 3) | █ 1 |" in report and "| [4, 5] | █ 1 |" in report  # full marks in the last bin, within the axis
    assert not list(temp.iterdir())
    capsys.readouterr()

    _write(subs / "Doe, Jane", PARTLY)  # she resubmits
    shutil.rmtree(subs / "gus")  # the instructor keeps gus's zip
    (subs / "lms" / "comment.txt").write_text("edited: not a graded file, so not a change")
    assert run() == 0  # no --tasks: the class's
    said = capsys.readouterr().out
    # those without a grade (gus, and the ungradable ones: quick) and those whose graded files changed
    assert "10 submissions, 7 to grade (3 graded already" in said and "changed since their grade: Doe, Jane\n" in said
    book = rows(out)
    assert (book["Doe, Jane"]["total"], book["gus"]["total"], book["gus"]["problem"]) == ("2", "2", "")
    assert len(class_state.attempts(out, "lms")) == len(class_state.attempts(out, "deep")) == 1

    with pytest.raises(SystemExit):  # a forgotten --tasks (all seven) would grade everyone again
        run("--tasks", "1,2,3,4,5,6,7")
    assert "is graded on tasks 1,3, not 1,2,3,4,5,6,7: leave --tasks out" in capsys.readouterr().err
    assert run("--only", "Doe, Jane") == 0  # an id with a comma, named whole
    assert "10 submissions, 1 to grade" in capsys.readouterr().out
    assert len(class_state.attempts(out, "Doe, Jane")) == 3

    # a grade made without the sandbox is graded again once the class is graded in it
    in_sandbox = class_state.load_class(out) | {"no_sandbox": False}
    about = json.loads((out / "students/deep/grading.json").read_text())
    assert about["no_sandbox"] == bool(sandbox)
    (out / "students/deep/grading.json").write_text(json.dumps(about | {"no_sandbox": True}))
    assert class_state.grade_state(out, "deep", subs / "deep.zip", in_sandbox) == "sandbox"
    assert class_state.grade_state(out, "deep", subs / "deep.zip", in_sandbox | {"no_sandbox": True}) == "graded"
