"""A grade the machine took is not a 0 (grader/machine.py): a task that ran out of GPU memory is graded again alone,
and if other processes held the GPU's memory then too, it is "could not grade", flagged, and graded again later."""

import json
import os
import subprocess
import sys

from grader import class_state, gradebook, machine
from grader.grading import tasks_the_machine_took
from grader.submissions import source_fingerprint
from harness.outcome import Cause, Status
from tests.conftest import REPO

OOM = "raised OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def _entry(task=4, passed=True, message="ok", status=None):
    cases = [{"name": "a case", "kind": "check", "passed": passed, "message": message, "metrics": {}}]
    return {"task": task, "title": "t", "max_points": 4, "points": 4.0 if passed else 0.0, "summary": "s",
            "status": status or (Status.PASSED if passed else Status.FAILED), "record": {"cases": cases}}


def test_what_counts_as_running_out_of_gpu_memory():
    assert machine.ran_out_of_gpu_memory(_entry(passed=False, message=OOM))
    assert machine.ran_out_of_gpu_memory({"task": 4, "status": Status.CRASHED, "summary": "ran out of memory"})
    assert not machine.ran_out_of_gpu_memory(_entry(passed=False, message="max abs err 3.1"))
    assert not machine.ran_out_of_gpu_memory(_entry(passed=True, message="out of memory check passed"))
    # the kit's own words for other things: a baseline that did not fit, a worker the OOM killer (or the student) ended
    assert not machine.ran_out_of_gpu_memory(_entry(passed=False, message="naive out of memory; the worker was "
                                                                          "killed, perhaps out of memory"))
    # a passed task whose optional part ran out is not graded again
    passed = _entry(passed=True) | {"out_of_memory": True}
    assert not machine.ran_out_of_gpu_memory(passed)
    # a worker that died of it: "the worker stopped answering" in its case, the error in the test's output
    died = _entry(passed=False, message="the worker stopped answering")
    assert not machine.ran_out_of_gpu_memory(died)
    assert machine.ran_out_of_gpu_memory(died | {"out_of_memory": machine.says_out_of_memory(
        "torch.AcceleratorError: CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'")})


def test_a_test_that_could_not_start_cuda_beside_a_gpu_is_the_machines():
    on_cpu = _entry() | {"record": {"cases": [], "environment": {"device": "CPU (x86_64)"}}}
    assert machine.to_look_at(on_cpu, has_cuda=True) and not machine.to_look_at(on_cpu, has_cuda=False)
    entry, said = machine.verdict(on_cpu, on_cpu, (120.0, 141.0))
    assert (entry["status"], entry["cause"]) == (Status.NOT_GRADED, Cause.INFRASTRUCTURE)
    assert "could not start CUDA" in entry["summary"]


def test_the_second_grading_decides_and_the_memory_others_held_names_whose_it_was():
    first = _entry(passed=False, message=OOM)
    again, said = machine.verdict(first, _entry(), (90.0, 141.0))
    assert again["status"] == Status.PASSED and "graded again alone; that grade counts" in said
    # out of memory again, with 90 of 141 GiB held by other processes: the machine's
    entry, said = machine.verdict(first, _entry(passed=False, message=OOM), (90.0, 141.0))
    assert (entry["status"], entry["cause"], entry["points"]) == (Status.NOT_GRADED, Cause.INFRASTRUCTURE, 0.0)
    assert entry["summary"].startswith("could not grade: ") and "90 of its 141 GiB" in entry["summary"]
    # out of memory again on a free GPU: the submission's own, and its grade stands
    entry, said = machine.verdict(first, _entry(passed=False, message=OOM), (0.6, 141.0))
    assert entry["status"] == Status.FAILED and "the memory was your code's" in said
    entry, said = machine.verdict(first, _entry(passed=False, message=OOM), None)  # no GPU to read
    assert entry["status"] == Status.FAILED


def test_a_task_the_machine_took_is_flagged_and_graded_again_by_the_next_batch_run(tmp_path):
    folder = tmp_path / "students" / "ann"
    (folder / "graded").mkdir(parents=True)
    entry, _ = machine.verdict(_entry(passed=False, message=OOM), _entry(passed=False, message=OOM), (90.0, 141.0))
    (folder / "graded" / "task4.json").write_text(json.dumps({"key": {}, "entry": entry}))
    (folder / "results.json").write_text(json.dumps({"score": 16, "tests": []}))
    source = tmp_path / "ann.zip"
    source.write_bytes(b"zip")
    klass = {"tasks": "4", "no_sandbox": False, "regrade": None, "students": [{"id": "ann"}]}
    about = {"tasks": "4", "no_sandbox": False, "regrade": None, "source_sha256": source_fingerprint(source),
             "machine": tasks_the_machine_took(folder)}
    assert about["machine"] == [4]
    (folder / "grading.json").write_text(json.dumps(about))
    assert class_state.grade_state(tmp_path, "ann", source, klass) == "machine"
    row = gradebook.student_row(tmp_path, "ann")
    assert row["machine"] == "4" and "could not be graded on the machine" in row["problem"]
    assert row["task4"] == "not graded" and "run grader.batch again" in row["problem"]
    # the machine took it TRIES times in a row: the class goes on without it, and says how to grade it
    (folder / "grading.json").write_text(json.dumps(about | {"machine_tries": class_state.TRIES}))
    assert class_state.grade_state(tmp_path, "ann", source, klass) == "graded"
    assert "grade it on a free GPU" in gradebook.student_row(tmp_path, "ann")["problem"]


def test_the_grader_grades_a_task_again_and_says_could_not_grade_when_others_hold_the_gpu(tmp_path):
    """Through the grader: task 1's code runs out of GPU memory every time, and the probe reads 100 of 141 GiB held
    by other processes (a stand-in for the GPU: a sitecustomize in the grader's process)."""
    text = (REPO / "task1/attention.py").read_text().replace(
        'raise NotImplementedError("', 'raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate '
        '2.00 GiB; ')
    sub = tmp_path / "sub"
    (sub / "task1").mkdir(parents=True)
    (sub / "task1/attention.py").write_text(text)
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text("import grader.machine as m\nm.gpu_memory_in_use = lambda: (100.0, 141.0)\n")
    env = dict(os.environ, PYTHONPATH=f"{probe}{os.pathsep}{REPO}", KIT_NO_SANDBOX="1")
    proc = subprocess.run([sys.executable, "-m", "grader", "--submission", str(sub), "--tasks", "1", "--no-sandbox",
                           "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "graded again, alone on the GPU" in proc.stdout
    results = (tmp_path / "out" / "Results.md").read_text()
    assert "| could not grade | 0 / 2 | could not grade: the GPU ran out of memory while other processes held 100 " \
           "of its 141 GiB" in results, results
    assert "**0 / 0** of the tasks graded (0 of the 20 points graded: task 1 could not be graded on this machine " \
           "(regrade)" in results, results
    assert "missing, so the skeleton" not in results  # only task 1 was asked for: the other tasks' files are no news
    saved = json.loads((tmp_path / "out" / "graded" / "task1.json").read_text())["entry"]
    assert (saved["status"], saved["cause"]) == (Status.NOT_GRADED, Cause.INFRASTRUCTURE)
