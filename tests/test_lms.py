"""Submissions as learning-management systems and archivers really export them (grader/submissions.py)."""

import zipfile

import pytest

from grader import submissions

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
