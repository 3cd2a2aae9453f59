"""python -m harness.compare: every implementation written, side by side with PyTorch's, in one table and plot.

On the CPU: tasks 1 and 3 (each in its worker) and PyTorch's naive attention and SDPA; the CUDA tasks are left out
and said so. Tasks 2 and 4's rows run here with the stand-in kernels (tests/stand_in/); on a GPU the first
test runs them for real."""

import csv
import importlib.util
import subprocess
import sys

import torch

from tests.conftest import REPO, bad_variant, needs_solution, submission
from tests.stand_in import CudaOnTheCpu, stand_in  # noqa: F401

SMALL = ["--seqs", "16,40", "--heads", "2", "--tokens", "80", "--reps", "2"]


def compare(tmp_path, *args):
    out = tmp_path / "out" / "compare.csv"
    proc = subprocess.run([sys.executable, "-m", "harness.compare", "--scratch", str(tmp_path / "scratch"),
                           "--csv", str(out), *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(out.open())) if out.exists() else []
    return proc, rows


@needs_solution(1)
def test_the_reference_and_pytorch_side_by_side_with_every_metric(tmp_path):
    proc, rows = compare(tmp_path, "--solution", *SMALL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    labels = {r["implementation"] for r in rows}
    assert {"task 1: naive (PyTorch)", "task 3: FlashAttention-2 (PyTorch)", "PyTorch naive", "SDPA"} <= labels
    for label in labels:  # two lengths, full and causal; batch x seq = 80 at each
        mine = [r for r in rows if r["implementation"] == label]
        assert sorted((int(r["seq"]), int(r["batch"]), r["causal"]) for r in mine) == [
            (16, 5, "False"), (16, 5, "True"), (40, 2, "False"), (40, 2, "True")], mine
    for r in rows:
        assert r["problem"] == "", r
        assert float(r["time_ms"]) > 0 and float(r["tflops"]) > 0 and float(r["gbs"]) > 0, r
        assert float(r["time_spread_pct"]) >= 0, r
        errors = [float(r[k]) for k in ("max_abs_err", "mean_abs_err", "mse", "max_rel_err")]
        most = 2e-2 if r["dtype"] == "bfloat16" else 1e-5  # bf16 keeps 8 bits of mantissa
        assert 0 <= errors[1] <= errors[0] < most and errors[2] <= errors[0] ** 2 and int(r["non_finite"]) == 0, r
        assert (r["peak_extra_mib"] != "") == (r["device"] == "cuda"), r  # measured on a GPU only
    if not torch.cuda.is_available():
        for label in ("task 2: separate kernels", "task 4: fused kernel"):
            assert f"left out: {label}: needs a CUDA GPU" in proc.stdout
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "out" / "compare.png").stat().st_size > 10_000


@needs_solution(1)
def test_a_wrong_implementation_is_compared_with_its_errors_and_a_skeleton_is_left_out_by_its_step(tmp_path):
    files = {"task1/attention.py": bad_variant(1, "attention.py", "/ math.sqrt(q.shape[-1])", ""),  # no scale
             "task3/attention.py": (REPO / "task3" / "attention.py").read_text()}  # the skeleton
    proc, rows = compare(tmp_path, "--student-dir", str(submission(tmp_path, files)), "--tasks", "1,3", *SMALL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wrong = [r for r in rows if r["implementation"] == "task 1: naive (PyTorch)"]
    assert len(wrong) == 4 and all(float(r["max_abs_err"]) > 1e-2 for r in wrong), wrong
    # task 3 is still the skeleton, which names the step to write
    assert "left out: task 3: FlashAttention-2 (PyTorch): not written yet (see README, Task 3, step 1" in proc.stdout
    assert not [r for r in rows if r["implementation"].startswith("task 3")]


@needs_solution(1)
def test_a_noisy_timing_is_marked_on_its_row_and_in_a_summary(tmp_path, monkeypatch, capsys):
    """Another program on the machine spreads the requests' times: such a row says so, and so does the end."""
    from harness import compare as command
    from harness.timing import summarize

    steady, noisy = summarize([1.0, 1.0, 1.01, 1.0, 1.0]), summarize([1.0, 0.4, 2.5, 1.1, 0.5])
    clocks = iter([steady, noisy] * 8)
    monkeypatch.setattr(command.bench, "host_clock", lambda *a, **k: next(clocks))
    out = tmp_path / "compare.csv"
    assert command.main(["--solution", "--tasks", "1", *SMALL, "--csv", str(out), "--scratch", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    marked = [r for r in rows if float(r["time_spread_pct"]) > command.NOISY_PCT]
    assert len(marked) == len(rows) // 2 and said.count("(noisy: the requests' middle half spans") == len(marked)
    assert f"{len(marked)} of {len(rows)} timings are noisy" in said


def test_bad_arguments_are_named(tmp_path):
    for args, words in ((["--seqs", "0,64"], "--seqs"), (["--seqs", "64,x"], "comma-separated"),
                        (["--heads", "0"], "--heads must be at least 1"), (["--tasks", "5"], "--tasks")):
        proc, rows = compare(tmp_path, *args)
        assert proc.returncode == 2 and words in proc.stderr and not rows, (args, proc.stderr)


@needs_solution(1)
def test_the_cuda_tasks_rows_with_the_stand_in_kernels(stand_in, tmp_path, monkeypatch, capsys):
    """The lines a GPU runs (tasks 2 and 4, float32 and bf16, through their workers' entry points), on the CPU with
    PyTorch playing the kernels (tests/stand_in/); the stand-in GPU counts no memory."""
    from harness import compare

    for name, value in (("memory_allocated", lambda device=None: 0), ("max_memory_allocated", lambda device=None: 0),
                        ("reset_peak_memory_stats", lambda device=None: None)):
        monkeypatch.setattr(torch.cuda, name, value)
    out = tmp_path / "compare.csv"
    with CudaOnTheCpu():
        assert compare.main(["--solution", "--tasks", "2,4", "--seqs", "16,40", "--heads", "2", "--tokens", "80",
                             "--reps", "2", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    said = capsys.readouterr().out
    labels = {r["implementation"] for r in rows}
    assert labels == {"task 2: separate kernels", "task 4: fused kernel", "task 4: fused kernel, bf16",
                      "PyTorch naive", "SDPA", "SDPA, bf16"}, said
    for r in rows:
        bf16 = r["dtype"] == "bfloat16"
        assert r["problem"] == "" and r["device"] == "cuda" and float(r["time_ms"]) > 0, r
        assert float(r["max_abs_err"]) < (2e-2 if bf16 else 1e-5), r  # bf16 keeps 8 bits of mantissa
    assert {r["dtype"] for r in rows if r["implementation"].endswith("bf16")} == {"bfloat16"}


def test_a_kernel_still_at_its_skeleton_is_left_out_by_its_step(stand_in, tmp_path, monkeypatch, capsys):
    """A CUDA skeleton returns without writing (its output stays NaN): left out, with the step to write, not timed as
    the fastest kernel of the table."""
    from harness import compare
    from tests.stand_in import Behaviour

    for name, value in (("memory_allocated", lambda device=None: 0), ("max_memory_allocated", lambda device=None: 0),
                        ("reset_peak_memory_stats", lambda device=None: None)):
        monkeypatch.setattr(torch.cuda, name, value)
    stand_in.student[4] = Behaviour(half="unwritten")
    out = tmp_path / "compare.csv"
    with CudaOnTheCpu():
        assert compare.main(["--tasks", "2,4", "--seqs", "40", "--heads", "2", "--tokens", "80", "--reps", "2",
                             "--csv", str(out)]) == 0
    said = capsys.readouterr().out
    assert ("left out: task 4: fused kernel, bf16: not written yet (its output stays as it started, every element "
            "NaN: see README, Task 4, step 8") in said, said
    rows = list(csv.DictReader(out.open()))
    assert not [r for r in rows if r["implementation"] == "task 4: fused kernel, bf16"]
    assert all(r["problem"] == "" for r in rows if r["implementation"] == "task 4: fused kernel"), rows
    assert len([r for r in rows if r["implementation"] == "task 2: separate kernels"]) == 2


def test_an_output_partly_unwritten_is_counted_over_every_head():
    """A NaN or an Inf anywhere in the output, not only in the heads compared with float64, leaves no error figure."""
    from harness.compare import errors

    q, k, v = (torch.randn(3, 4, 20, 16) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert errors(out, q, k, v, False)["max_abs_err"] < 1e-5
    out[1, 2, 7:] = float("nan")  # a middle head, which the float64 comparison does not read
    out[1, 2, 0, 0] = float("inf")
    said = errors(out, q, k, v, False)
    assert said["non_finite"] == 13 * 16 + 1 and said["max_abs_err"] == float("inf"), said

