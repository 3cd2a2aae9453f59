"""grader.batch: a class graded one submission after another, archives unpacked safely, a gradebook (CPU)."""

import csv
import io
import tarfile
import zipfile

import pytest

from grader import batch
from tests.conftest import REPO, needs_solution


def _zip(path, files, links=()):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16)  # a symbolic link
            zf.writestr(info, "/etc/passwd")
    return path


def test_a_good_archive_unpacks_to_its_single_top_folder(tmp_path):
    archive = _zip(tmp_path / "s1.zip", {"repo/task1/attention.py": "x = 1\n", "__MACOSX/._x": ""})
    root = batch.unpack(archive, tmp_path / "out")
    assert root == tmp_path / "out" / "repo" and (root / "task1/attention.py").read_text() == "x = 1\n"


@pytest.mark.parametrize("files, links, words", [
    ({"../evil.py": "x"}, (), "outside its folder"),
    ({"/abs.py": "x"}, (), "outside its folder"),
    ({"a.py": "x"}, ("task1/attention.py",), "link or device"),
    ({f"f{i}.py": "" for i in range(12)}, (), "more than 10 files"),
])
def test_an_unsafe_archive_is_refused_with_its_reason(tmp_path, monkeypatch, files, links, words):
    monkeypatch.setattr(batch, "MAX_FILES", 10)
    with pytest.raises(batch.BadArchive, match=words):
        batch.unpack(_zip(tmp_path / "s.zip", files, links), tmp_path / "out")
    assert not (tmp_path / "evil.py").exists()


def test_a_tar_with_a_link_or_too_many_bytes_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "s.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        link = tarfile.TarInfo("task1/attention.py")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    with pytest.raises(batch.BadArchive, match="link or device"):
        batch.unpack(path, tmp_path / "a")
    with tarfile.open(path, "w:gz") as tf:
        data = b"x" * 100
        info = tarfile.TarInfo("big.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    monkeypatch.setattr(batch, "MAX_BYTES", 50)
    with pytest.raises(batch.BadArchive, match="MiB unpacked"):
        batch.unpack(path, tmp_path / "b")
    (tmp_path / "junk.tar.gz").write_bytes(b"not gzip")
    with pytest.raises(batch.BadArchive, match="not a readable archive"):
        batch.unpack(tmp_path / "junk.tar.gz", tmp_path / "c")


def test_each_submission_is_a_student_and_ids_are_unique(tmp_path):
    (tmp_path / "alice").mkdir()
    _zip(tmp_path / "bob.zip", {"a": ""})
    (tmp_path / "carol.tar.gz").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a submission")
    assert [sid for sid, _ in batch.discover(tmp_path)] == ["alice", "bob", "carol"]
    (tmp_path / "bob").mkdir()
    with pytest.raises(SystemExit, match="two submissions for student 'bob'"):
        batch.discover(tmp_path)


@needs_solution(1)
def test_a_class_is_graded_resumed_and_booked(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    solution = (REPO / "task1/solution/attention.py").read_text()
    _zip(subs / "good.zip", {"checkout/task1/attention.py": solution})
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
    capsys.readouterr()
    batch.main([str(subs), "--out", str(out), "--tasks", "1", "--no-sandbox"])  # resumes: only the failed one again
    assert "3 submissions, 1 to grade (2 already graded)" in capsys.readouterr().out
