"""grader/submissions.py: archives unpacked safely, each entry of a class's folder a student, the checkout found where
students put it, and a submission that cannot be graded says why (CPU). How LMS exports look: tests/test_lms.py."""

import io
import re
import tarfile
import zipfile

import pytest

from grader import submissions
from tests.conftest import zipped

CODE = "x = 1\n"


def _tar(path, files, mode="w", links=()):
    with tarfile.open(path, mode) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data.encode())
            tf.addfile(info, io.BytesIO(data.encode()))
        for name in links:
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, "/usr/bin/python3"
            tf.addfile(link)
    return path


def _venv(prefix, files=2500):
    """What `python -m venv .venv` and a few packages leave in a repository: many files, none graded."""
    return {f"{prefix}.venv/lib/python3.11/site-packages/pkg{i // 100}/m{i}.py": "" for i in range(files)}


def test_a_good_archive_unpacks_to_its_checkout(tmp_path):
    archive = zipped(tmp_path / "s1.zip", {"repo/task1/attention.py": "x = 1\n", "__MACOSX/._x": ""})
    root = submissions.locate(archive, tmp_path / "out")
    assert root == tmp_path / "out" / "outer" / "repo" and (root / "task1/attention.py").read_text() == "x = 1\n"


@pytest.mark.parametrize("files, links, words", [
    ({"../evil.py": "x"}, (), "outside its folder"),
    ({"/abs.py": "x"}, (), "outside its folder"),
    ({"a.py": "x"}, ("task1/attention.py",), "link or device"),
    ({"a.py": "x"}, ("repo/task2/kernels",), "link or device"),  # a folder on the way to a graded file
    ({f"copy{i}/task1/attention.py": "" for i in range(12)}, (), "more than 10 files"),
])
def test_an_unsafe_archive_is_refused_with_its_reason(tmp_path, monkeypatch, files, links, words):
    monkeypatch.setattr(submissions, "MAX_FILES", 10)
    with pytest.raises(submissions.BadArchive, match=words):
        submissions.unpack(zipped(tmp_path / "s.zip", files, links), tmp_path / "out")
    assert not (tmp_path / "evil.py").exists()


def test_a_tar_with_a_link_or_too_many_bytes_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "s.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        link = tarfile.TarInfo("task1/attention.py")  # a link where a graded file goes
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    with pytest.raises(submissions.BadArchive, match="link or device"):
        submissions.unpack(path, tmp_path / "a")
    with tarfile.open(path, "w:gz") as tf:
        data = b"x" * 100
        info = tarfile.TarInfo("task1/attention.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    monkeypatch.setattr(submissions, "MAX_BYTES", 50)
    with pytest.raises(submissions.BadArchive, match="MiB unpacked"):
        submissions.unpack(path, tmp_path / "b")
    (tmp_path / "junk.tar.gz").write_bytes(b"not gzip")
    with pytest.raises(submissions.BadArchive, match="not a readable archive"):
        submissions.unpack(tmp_path / "junk.tar.gz", tmp_path / "c")


def test_each_entry_is_a_student_and_two_entries_with_one_id_are_one_student_asked_about(tmp_path):
    (tmp_path / "alice").mkdir()
    zipped(tmp_path / "bob.zip", {"task1/attention.py": CODE})
    (tmp_path / "carol.tar.gz").write_bytes(b"")
    (tmp_path / "dave.rar").write_text("an archive the kit cannot read: a student all the same")
    (tmp_path / ".DS_Store").write_text("")
    assert [sid for sid, _ in submissions.discover(tmp_path)] == ["alice", "bob", "carol", "dave"]
    before = submissions.source_fingerprint(tmp_path / "bob.zip")
    (tmp_path / "bob" / "task1").mkdir(parents=True)  # bob uploaded twice, a folder and a zip
    assert dict(submissions.discover(tmp_path))["bob"] == tmp_path / "bob"
    with pytest.raises(submissions.NotGradable, match=re.escape("2 submissions with this id (bob/, bob.zip): which one")):
        submissions.locate(tmp_path / "bob", tmp_path / "unpacked")
    assert submissions.source_fingerprint(tmp_path / "bob.zip") != before  # removing one is a change: graded again
    (tmp_path / "bob" / "task1").rmdir()
    (tmp_path / "bob").rmdir()
    assert submissions.source_fingerprint(tmp_path / "bob.zip") == before


def test_a_link_in_place_of_a_student_file_or_folder_is_tampering(tmp_path):
    (tmp_path / "a" / "task1").mkdir(parents=True)
    (tmp_path / "a" / "task1" / "attention.py").symlink_to("/etc/passwd")
    assert submissions.linked_files(tmp_path / "a") == ["task1/attention.py"]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "task1").symlink_to(tmp_path / "a" / "task1")  # another student's folder
    assert submissions.linked_files(tmp_path / "b") == ["task1/attention.py"]


def test_odd_archives_are_that_students_error_and_dot_entries_are_fine(tmp_path):
    path = tmp_path / "s.tgz"
    with tarfile.open(path, "w:gz") as tf:  # what `tar czf s.tgz -C checkout .` writes
        for name in (".", "./task1"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        info = tarfile.TarInfo("./task1/attention.py")
        info.size = 6
        tf.addfile(info, io.BytesIO(b"x = 1\n"))
    root = submissions.locate(path, tmp_path / "out")
    assert (root / "task1/attention.py").read_text() == "x = 1\n"
    odd = zipped(tmp_path / "z.zip", {"task1/attention.py": "x = 1\n" * 100})
    data = bytearray(odd.read_bytes())
    data[data.index(b"PK\x01\x02") + 10] = 99  # a compression method zipfile does not know: NotImplementedError
    odd.write_bytes(bytes(data))
    with pytest.raises(submissions.BadArchive, match="not a readable archive"):
        submissions.unpack(odd, tmp_path / "out2")


@pytest.mark.parametrize("layout", ["deep zip", "folder holding the upload", "zip in a zip", "plain tar",
                                    "tar.bz2 with its .venv", "zip with its .venv and .git"])
def test_the_checkout_is_found_where_students_put_it(tmp_path, layout):
    """LMS exports and students' own zips: the graded files, two folders deep, in an uploaded zip, beside a .venv."""
    src = tmp_path / "submission"
    if layout == "deep zip":
        source = zipped(tmp_path / "s.zip", {"x-submission/attention-course/task1/attention.py": CODE,
                                           "x-submission/attention-course/README.md": "# notes"})
    elif layout == "folder holding the upload":
        src.mkdir()
        zipped(src / "attention-course-main.zip", {"attention-course-main/task1/attention.py": CODE})
        (src / "comments.txt").write_text("see the zip")
        source = src
    elif layout == "zip in a zip":
        inner = zipped(tmp_path / "inner.zip", {"task1/attention.py": CODE})
        source = zipped(tmp_path / "s.zip", {"student 12/upload.zip": "", "readme.txt": "hi"})
        with zipfile.ZipFile(source, "w") as zf:
            zf.write(inner, "student 12/upload.zip")
    elif layout == "plain tar":
        source = _tar(tmp_path / "s.tar", {"repo/task1/attention.py": CODE})
    elif layout == "tar.bz2 with its .venv":
        source = _tar(tmp_path / "s.tar.bz2", {"repo/task1/attention.py": CODE, **_venv("repo/")}, "w:bz2",
                      links=("repo/.venv/bin/python",))  # a venv's links are not graded, so not refused
    else:
        source = zipped(tmp_path / "s.zip", {"task1/attention.py": CODE, **_venv(""), ".git/HEAD": "ref",
                                           "task1/__pycache__/attention.cpython-311.pyc": "\0"})
    root = submissions.locate(source, tmp_path / "unpacked")
    assert (root / "task1/attention.py").read_text() == CODE
    assert len(list((tmp_path / "unpacked").rglob("*.py"))) <= 1  # only what is graded was taken out


@pytest.mark.parametrize("name, make, words", [
    ("dave.rar", lambda p: p.write_bytes(b"Rar!\x1a\x07"), "dave.rar: a file the kit cannot read as a submission"),
    ("erin.py", lambda p: p.write_text(CODE), "erin.py: a file the kit cannot read"),
    ("empty.zip", lambda p: zipped(p, {}), "none of the files students write"),
    ("notes.zip", lambda p: zipped(p, {"essay/answer.md": "I did task 1"}), "an empty or unrelated submission"),
    ("twice.zip", lambda p: zipped(p, {"old/task1/attention.py": CODE, "new/task1/attention.py": CODE}),
     re.escape("in 2 places: new/ (task1/attention.py); old/ (task1/attention.py); which one counts?")),
    ("bomb.zip", lambda p: zipped(p, {f"d{i}/x": "" for i in range(30)}), "more than 20 entries"),
    ("inbuild.zip", lambda p: zipped(p, {"repo/build/task1/attention.py": CODE}),
     re.escape("only inside folders that are never graded (repo/build/task1/attention.py; build/ is never graded)")),
    ("invenv", lambda p: (p / "venv" / "task1").mkdir(parents=True) or (p / "venv/task1/attention.py").write_text(CODE),
     re.escape("never graded (venv/task1/attention.py; venv/ is never graded): move the checkout out of it")),
])
def test_a_submission_that_cannot_be_graded_says_why(tmp_path, monkeypatch, name, make, words):
    monkeypatch.setattr(submissions, "MAX_ENTRIES", 20)
    make(tmp_path / name)
    with pytest.raises(submissions.NotGradable, match=words):
        submissions.locate(tmp_path / name, tmp_path / "unpacked")


def test_a_folder_with_two_uploads_and_no_checkout_names_them(tmp_path):
    (tmp_path / "s").mkdir()
    zipped(tmp_path / "s" / "a.zip", {"task1/attention.py": CODE})
    zipped(tmp_path / "s" / "b.zip", {"task1/attention.py": CODE})
    with pytest.raises(submissions.NotGradable, match=r"it holds 2 archives \(a.zip, b.zip\)"):
        submissions.locate(tmp_path / "s", tmp_path / "unpacked")
