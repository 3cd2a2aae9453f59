"""python -m task5.compare: task 5's 16-bit decode, the student's contiguous and paged, beside SDPA's and FlashInfer's,
on the CPU with PyTorch playing the kernels and FlashInfer (tests/stand_in/): every line a GPU runs."""

import csv
import importlib.util
import subprocess
import sys

import torch

from tests.conftest import REPO
from tests.stand_in import CudaOnTheCpu, stand_in  # noqa: F401

CASES = "1,4,2,256,16;2,2,1,128,32"
LABELS = ["yours (step 6)", "yours, pages of 16 (step 7)", "yours, pages of 64 (step 7)", "SDPA",
          "FlashInfer, pages of 16"]


def compare(tmp_path, name, *args):
    from checks.task5 import compare as command

    with CudaOnTheCpu():
        code = command.main(["--cases", CASES, "--csv", str(tmp_path / f"{name}.csv"), *args])
    path = tmp_path / f"{name}.csv"
    return code, list(csv.DictReader(path.open())) if path.exists() else []


def test_every_decode_on_each_cache_with_its_share_of_the_copy_bandwidth(stand_in, tmp_path, monkeypatch, capsys):
    """Per cache: yours, yours over pages of 16 and of 64 (each against the contiguous decode timed beside it), SDPA
    and FlashInfer, each timed with its share of the copy bandwidth, in a CSV and a chart."""
    from tests.stand_in.flashinfer import installed

    installed(monkeypatch)
    code, rows = compare(tmp_path, "a", "--solution")
    said = capsys.readouterr().out
    assert code == 0 and [r["implementation"] for r in rows] == LABELS * 2, said
    assert [(r["batch"], r["kv_heads"], r["length"]) for r in rows] == [("1", "2", "256")] * 5 + [("2", "1", "128")] * 5
    for r in rows:
        assert r["problem"] == "" and r["dtype"] == "bfloat16" and float(r["time_ms"]) > 0, r
        assert float(r["of_copy"]) == float(r["gbs"]) / float(r["copy_gbs"]) > 0, r
        assert (r["of_contiguous"] != "") == r["implementation"].startswith("yours, pages of"), r
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "a.png").stat().st_size > 10_000


def test_a_wrong_or_unwritten_decode_is_named_and_not_timed_as_right(stand_in, tmp_path, monkeypatch, capsys):
    """A paged decode one row off is left out by the small case run first, and its rows are not timed; the handout's
    skeleton of step 7 is left out by its step, the contiguous rows compared; step 6 unwritten leaves nothing to
    compare; without a GPU one line says it needs one."""
    from tests.stand_in import Behaviour

    monkeypatch.setitem(sys.modules, "flashinfer", None)  # not installed: one line says so
    student = tmp_path / "student"
    for name in ("decode.cu", "decode_half.cu"):  # a finished student's files (no step marked TODO)
        (student / "task5" / "kernels").mkdir(parents=True, exist_ok=True)
        (student / "task5" / "kernels" / name).write_text((REPO / "task5/solution/kernels" / name).read_text())
    stand_in.student[5] = Behaviour(paged_half="wrong")
    code, rows = compare(tmp_path, "b", "--dtype", "fp16", "--student-dir", str(student))
    said = capsys.readouterr().out
    assert code == 0 and "FlashInfer is not installed" in said, said
    assert ("left out: your paged decode: wrong on a small case (not bit for bit step 6's decode on the same rows): "
            "python -m task5.test --paged-half names the step") in said, said
    assert [r["implementation"] for r in rows] == ["yours (step 6)", "SDPA"] * 2 and all(
        r["dtype"] == "float16" and r["problem"] == "" for r in rows), rows

    stand_in.student[5] = Behaviour()
    half = student / "task5" / "kernels" / "decode_half.cu"
    half.write_text(half.read_text().replace('// BEGIN SOLUTION "step 7', '// TODO (README, Task 5, step 7: the lookup)\n'
                                             '// BEGIN SOLUTION "step 7', 1))
    code, rows = compare(tmp_path, "c", "--student-dir", str(student))
    assert code == 0 and "left out: your paged decode: not written yet (see README, Task 5, step 7: the lookup)" in \
        capsys.readouterr().out
    assert {r["implementation"] for r in rows} == {"yours (step 6)", "SDPA"}

    stand_in.student[5] = Behaviour(half="unwritten")
    code, rows = compare(tmp_path, "d", "--student-dir", str(student))
    assert code == 1 and not rows
    assert ("left out: your decode: not written yet (its output stays as it started, every element NaN: see README, "
            "Task 5, step 6); nothing to compare") in capsys.readouterr().out

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, rows = compare(tmp_path, "e")
    assert code == 1 and "needs a CUDA GPU" in capsys.readouterr().out


def test_bad_arguments_are_named(tmp_path):
    for args, words in ((["--cases", "16,32,8,4096"], "batch,heads,kv_heads,tokens,head_dim"),
                        (["--cases", "1,6,4,64,32"], "heads a multiple of kv_heads"),
                        (["--cases", "1,4,4,64,256"], "head_dim at most 128"), (["--dtype", "fp32"], "--dtype")):
        proc = subprocess.run([sys.executable, "-m", "task5.compare", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
