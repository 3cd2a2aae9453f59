"""The grader's verdicts on known-bad submissions, one per failure mode (tests/task1_submissions.py), and its output
formats."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader import __main__ as grader
from grader.hidden import SECRET_SEED
from grader.rubric import RUBRIC, TOTAL_POINTS, score
from tests.conftest import REPO, bad_variant, needs_solution
from tests.task1_submissions import CANARY, SOLUTION_1, THREAD_BOMB, grade, needs_bwrap, submission_text




@needs_bwrap
@needs_solution(1)
@pytest.mark.parametrize("name, status, points, words", [
    ("correct", "passed", 2, "checks passed"),
    ("wrong_scale", "failed", None, "checks passed"),
    ("segfault", "failed", None, "segmentation fault"),  # in attention(): steps 1-3, checked before it, still earn
    ("fork_bomb", "failed", None, "a fork bomb?"),
    ("thread_bomb", "failed", None, "a thread bomb?"),
    ("pytorch_attention", "failed", 0, "PyTorch's own attention"),
    ("sdpa_by_built_name_in_a_thread", "failed", 0, "PyTorch's own attention"),
    ("raises", "failed", None, "checks passed"),
    ("imports_solution", "failed", 0, "import"),
    ("imports_the_checks_reference", "failed", 0, "No module named 'harness'"),
    ("syntax_error", "failed", 0, "could not import your code: SyntaxError"),
    ("sys_exit_at_import", "passed", 2, "called sys.exit(0) while it was imported"),
    ("leftover_thread", "passed", 2, "checks passed"),
    ("reads_the_reference_from_disk", "not implemented yet", 0, "see README, Task 1, step 1"),
    ("forges_the_record", "not implemented yet", 0, "see README, Task 1, step 1"),
    ("kills_the_checks", "not implemented yet", 0, "see README, Task 1, step 1"),
    ("patches_the_checks", "not implemented yet", 0, "see README, Task 1, step 1"),
    ("detached_process", "not implemented yet", 0, "see README, Task 1, step 1"),
    ("reads_the_hidden_cases", "passed", 2, "checks passed"),
    ("writes_outside_its_view", "not implemented yet", 0, "see README, Task 1, step 1"),
    ("empties_the_watch_list", "failed", 0, "PyTorch's own attention"),
    ("missing", "not implemented yet", 0, "see README, Task 1, step 1"),
])
def test_verdicts_on_known_submissions(tmp_path, name, status, points, words):
    if name == "thread_bomb":
        skip_unless_a_thread_bomb_fits()
    results, md = grade(tmp_path, name, files={} if name == "missing" else None)
    if name == "detached_process":
        time.sleep(3)  # a process that outlived its task would rewrite the results now
        results = json.loads((tmp_path / "grading" / name / "results.json").read_text())
    (test,) = results["tests"]
    assert test["name"].startswith("Task 1") and test["max_score"] == 2 and test["visibility"] == "visible"
    assert test["output"].startswith(status), test["output"]
    assert words in test["output"] + results["output"], test["output"]
    if points is not None:
        assert test["score"] == points
    else:
        assert 0 < test["score"] < 2
    assert results["score"] == test["score"]
    assert f"| 1. {RUBRIC[1].title} | {status} |" in md
    assert str(SECRET_SEED) not in json.dumps(results) + md and hex(SECRET_SEED) not in json.dumps(results) + md
    assert not fork_bomb_leftovers(), "processes of the fork bomb outlived the grading"
    written = [p for root in (REPO, tmp_path) for p in root.rglob(CANARY)]
    for p in written:
        p.unlink()
    assert not written, f"the submission wrote outside its view: {written}"


@needs_bwrap
@needs_solution(1)
def test_links_and_odd_bytes_in_a_submission(tmp_path):
    # valid Python in Latin-1 (it says so), which the checks must read without choking on its bytes
    text = ("# -*- coding: latin-1 -*-\n" + SOLUTION_1.replace('"""Task 1:', '"""Task 1 (caf\xe9):')).encode("latin-1")
    results, _ = grade(tmp_path, "latin1", files={"task1/attention.py": text})
    assert results["tests"][0]["score"] == 2
    sub = tmp_path / "linked"
    (sub / "task1").mkdir(parents=True)
    (sub / "task1" / "attention.py").symlink_to(REPO / "task1/solution/attention.py")
    proc = subprocess.run([sys.executable, "-m", "grader", "--submission", str(sub), "--tasks", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    results = json.loads((tmp_path / "grading" / "linked" / "results.json").read_text())
    assert results["score"] == 0 and "not a regular file" in results["output"], proc.stdout[-2000:]
    sub = tmp_path / "linked_folder"  # its task1/ is the folder of another checkout (the reference's)
    sub.mkdir()
    (sub / "task1").symlink_to(REPO / "task1/solution")
    proc = subprocess.run([sys.executable, "-m", "grader", "--submission", str(sub), "--tasks", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    results = json.loads((tmp_path / "grading" / "linked_folder" / "results.json").read_text())
    assert results["score"] == 0 and "in a folder that is a link" in results["output"], proc.stdout[-2000:]


def test_results_are_written_without_following_links(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").symlink_to(victim)
    grader.write_grader_failure(tmp_path / "out", "boom")
    assert victim.read_text() == "keep me" and not (tmp_path / "out" / "results.json").is_symlink()


def test_a_malformed_record_costs_its_task_only():
    from grader.runner import valid_record

    good = {"task": 1, "status": "passed", "cases": [{"name": "a", "kind": "check", "passed": True, "message": ""}]}
    assert valid_record(good, 1)["cases"][0]["metrics"] == {}
    optional = {"task": 5, "status": "passed", "cases": [{"name": "split", "kind": "optional", "passed": False,
                                                         "message": ""}]}
    assert valid_record(optional, 5)["cases"][0]["kind"] == "optional"  # task 5's split-KV part
    for bad in ({"task": 1, "status": "passed", "cases": [{"name": "a", "passed": True, "message": ""}]},
                {"task": 2, "status": "passed", "cases": []}, {"task": 1, "status": "great", "cases": []}, []):
        with pytest.raises((ValueError, TypeError)):
            valid_record(bad, 1)


@needs_bwrap
@needs_solution(3)
def test_a_broken_task1_does_not_cost_task3(tmp_path):
    sub = tmp_path / "sub"
    for task in (1, 3):
        (sub / f"task{task}").mkdir(parents=True)
    (sub / "task3" / "attention.py").write_text((REPO / "task3/solution/attention.py").read_text())
    (sub / "task1" / "attention.py").write_text(bad_variant(1, "attention.py", "    scores = attention_scores(q, k)\n",
                                                            "    raise RuntimeError('task 1 is broken')\n"))
    proc = subprocess.run([sys.executable, "-m", "grader", "--submission", str(sub), "--tasks", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (test,) = json.loads((tmp_path / "grading" / "sub" / "results.json").read_text())["tests"]
    # task 3 loads task 1's code only to time itself against it, which a grading leaves out
    assert test["score"] == 3 and "leaves out the slowest timings that are not scored (the CPU and CUDA time " \
        "against task 1)" in test["output"]


@needs_bwrap
@needs_solution(1)
def test_keep_lists_earlier_tasks_of_the_same_files_only(tmp_path):
    results, _ = grade(tmp_path, "correct")
    sub, out = tmp_path / "correct", tmp_path / "grading" / "correct"
    assert json.loads((out / "graded" / "task1.json").read_text())["entry"]["status"] == "passed"

    def grade_task2(*flags):  # no GPU here: task 2 is recorded as needing one, at once
        proc = subprocess.run([sys.executable, "-m", "grader", "--submission", str(sub), "--tasks", "2", *flags],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return json.loads((out / "results.json").read_text()), (out / "Results.md").read_text()

    with_keep, md = grade_task2("--keep")
    assert [t["name"][:6] for t in with_keep["tests"]] == ["Task 1", "Task 2"] and with_keep["score"] == 2
    assert "task 1 kept from the run of" in md and f"| 1. {RUBRIC[1].title} | passed | 2 / 2 |" in md
    without, _ = grade_task2()
    assert [t["name"][:6] for t in without["tests"]] == ["Task 2"]
    # a kept result's points are scored again from its record, not taken from the file
    saved = json.loads((out / "graded" / "task1.json").read_text())
    saved["entry"] |= {"points": 99, "status": "unavailable", "summary": None}
    (out / "graded" / "task1.json").write_text(json.dumps(saved))
    tampered, md = grade_task2("--keep")
    assert tampered["score"] == 2 and f"| 1. {RUBRIC[1].title} | passed | 2 / 2 |" in md
    (sub / "task1" / "attention.py").write_text(submission_text("wrong_scale"))  # other files: nothing kept
    changed, md = grade_task2("--keep")
    assert [t["name"][:6] for t in changed["tests"]] == ["Task 2"] and "kept" not in md


@pytest.mark.parametrize("line", ["from harness.diagnose import _attention",
                                  "from common.torch_kernels import PyTorchKernels",
                                  "from harness.attention_math import attention_float64"])
def test_importing_the_checks_own_attention_breaks_the_rule(tmp_path, line):
    from common.impl import check_own_work

    (tmp_path / "task1").mkdir()
    (tmp_path / "task1" / "attention.py").write_text(f"{line}\n\ndef attention(q, k, v, causal=False):\n    pass\n")
    passed, message, _ = check_own_work(1, False, tmp_path)
    assert not passed and "task1/attention.py:1" in message


def test_crash_reasons():
    from grader.runner import crash_reason

    oom_baseline = "attention alone: naive out of memory\n" + "ok\n" * 40
    assert crash_reason(-11, oom_baseline) == "crashed with SIGSEGV (segmentation fault)"
    assert "illegal memory access" in crash_reason(1, "RuntimeError: CUDA error: an illegal memory access")
    assert "exited with code 3" in crash_reason(3, "something\nelse")


@needs_bwrap
@needs_solution(1)
def test_a_hang_costs_only_its_task(tmp_path):
    results, _ = grade(tmp_path, "hang", timeout=15)
    (test,) = results["tests"]
    assert test["score"] == 0 and "timed out after 15 s" in test["output"]


@needs_solution(1)
@needs_solution(3)
def test_code_that_hangs_at_import_costs_one_time_limit_not_two(tmp_path):
    """Task 3 loads task 1's code only to time itself against it (a student's own run; a grading leaves that timing
    out): task 1's hang at import costs task 3 nothing, and the grading one time limit."""
    files = {"task1/attention.py": (REPO / "task1/solution/attention.py").read_text() + "\nimport time\ntime.sleep(600)\n",
             "task3/attention.py": (REPO / "task3/solution/attention.py").read_text()}
    started = time.monotonic()
    # 120 s: task 3 with its optional backward part takes 60-90 s on 2 busy cores, and must end inside the limit
    results, md = grade(tmp_path, "hang_at_import", timeout=120, tasks="1,3", files=files, plain=True)
    task1, task3 = results["tests"]
    assert task1["score"] == 0 and "timed out after 120 s" in task1["output"]
    assert task3["score"] == 3 and "(the CPU and CUDA time against task 1)" in md
    assert time.monotonic() - started < 2 * 120


@needs_bwrap
@needs_solution(1)
def test_a_sandboxed_submission_cannot_connect_to_the_machines_unix_sockets(tmp_path):
    """A read-only bind still lets connect() through: munge's, Docker's, D-Bus's or slurmstepd's socket
    would be a way out of the sandbox. This test listens where they live and checks that nobody knocked."""
    folders = [Path("/var/tmp"), Path("/run") if os.geteuid() == 0 else Path(os.environ.get("XDG_RUNTIME_DIR", "/run"))]
    listeners = []
    try:
        for folder in folders:
            path = folder / f"kit-test-{os.getpid()}.sock"
            listener = socket.socket(socket.AF_UNIX)
            try:
                listener.bind(str(path))
            except OSError:
                listener.close()
                continue
            listener.listen()
            listener.setblocking(False)
            listeners.append((listener, path))
        if not listeners:
            pytest.skip(f"cannot make a socket to listen on in {' or '.join(map(str, folders))}")
        results, _ = grade(tmp_path, "connects_to_sockets")
        assert results["tests"][0]["output"].startswith("not implemented yet") and results["score"] == 0
        for listener, path in listeners:
            with pytest.raises(BlockingIOError):
                listener.accept()
    finally:
        for listener, path in listeners:
            listener.close()
            path.unlink()


@needs_bwrap
@needs_solution(1)
def test_the_worker_has_a_temp_folder_where_tmpdir_names_a_hidden_one(tmp_path):
    """TMPDIR=/tmp/$USER or /scratch/... is hidden in the sandbox: nvcc would fail to write its temporary files."""
    (tmp_path / "sub" / "task1").mkdir(parents=True)
    (tmp_path / "sub" / "task1" / "attention.py").write_text(
        SOLUTION_1 + "\nimport os\nopen(os.path.join(os.environ['TMPDIR'], 'probe'), 'w').close()\n")
    (tmp_path / "elsewhere").mkdir()
    proc = subprocess.run([sys.executable, "-m", "task1.test", "--student-dir", str(tmp_path / "sub")], cwd=REPO,
                          env=dict(os.environ, TMPDIR=str(tmp_path / "elsewhere")), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "PASSED" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not list((tmp_path / "elsewhere").iterdir())  # the worker wrote into its own, not into this one


def skip_unless_a_thread_bomb_fits():
    """A user's process limit (4096 on some distributions) counts threads too: the bomb must fit under it."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if os.geteuid() != 0 and soft != resource.RLIM_INFINITY and soft < THREAD_BOMB + 2048:
        pytest.skip(f"this user may have {soft} processes and threads, too few for a thread bomb of {THREAD_BOMB}")


def fork_bomb_leftovers(wait_s: float = 10) -> list[int]:
    """Live processes of the fork_bomb submission (they name themselves), after they had wait_s to die."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            if "(kit_fork_bomb)" in text and text.rsplit(")", 1)[1].split()[0] != "Z":  # a zombie is dead
                found.append(int(stat.parent.name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@needs_solution(1)
@pytest.mark.parametrize("name, words", [("fork_bomb", "a fork bomb?"), ("thread_bomb", "a thread bomb?")])
def test_a_fork_or_thread_bomb_is_stopped_without_bubblewrap_too(tmp_path, name, words):
    """The watch counts the worker's processes itself, root or not; without bubblewrap's PID namespace
    only those that stay in the worker's process group or under it are sure to be found and ended."""
    if name == "thread_bomb":
        skip_unless_a_thread_bomb_fits()
    results, _ = grade(tmp_path, name, plain=True)
    (test,) = results["tests"]
    assert test["output"].startswith("failed") and words in test["output"], test["output"]
    assert 0 < test["score"] < 2
    assert not fork_bomb_leftovers()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores a folder's permissions")
def test_a_scratch_copy_is_removed_even_where_the_student_took_away_write_permission(tmp_path):
    from harness.view import remove_tree

    locked = tmp_path / "scratch" / "worker-builds" / "locked"
    locked.mkdir(parents=True)
    (locked / "file").write_text("x")
    locked.chmod(0o500)
    remove_tree(tmp_path / "scratch", wait_s=5)
    assert not (tmp_path / "scratch").exists()


def test_removing_a_folder_that_is_not_there_leaves_its_parent_alone(tmp_path):
    from harness.view import remove_tree

    tmp_path.chmod(0o1777)  # as /tmp is: a chmod 700 of it would lock every other user out
    remove_tree(tmp_path / "not-there", wait_s=0)
    assert tmp_path.stat().st_mode & 0o7777 == 0o1777


@needs_solution(1)
def test_a_stopped_grader_kills_its_task_then_removes_its_scratch_copy(tmp_path):
    """SIGTERM (Slurm's time limit, scancel, grader.batch's timeout) mid-task, the student still writing."""
    sub, temp = tmp_path / "sub", tmp_path / "tmp"
    (sub / "task1").mkdir(parents=True)
    (sub / "task1" / "attention.py").write_text(submission_text("hang_writing"))
    temp.mkdir()
    cmd = [sys.executable, "-m", "grader", "--submission", str(sub), "--tasks", "1", "--out", str(tmp_path / "out")]
    cmd += [] if shutil.which("bwrap") else ["--no-sandbox"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, TMPDIR=str(temp)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not list(temp.glob("grade-*/task1-work/worker-builds/*/junk*")):
            assert proc.poll() is None and time.monotonic() < deadline, "the submission never started writing"
            time.sleep(0.2)
        time.sleep(1)
        proc.terminate()
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert not list(temp.iterdir()), "the stopped grader left its scratch copy"


def test_cuda_tasks_without_a_gpu_are_not_failed(tmp_path):
    (tmp_path / "task2").mkdir()
    (tmp_path / "task2" / "test.py").write_text("raise SystemExit('must not run')\n")
    entry = grader.grade_task(2, tmp_path, tmp_path, solution=False, hidden=False, timeout=10, has_cuda=False)
    assert entry["status"] == "needs_cuda" and entry["points"] == 0
    md, js = grader.write_results([entry], tmp_path, "test", {"device": "CPU", "python": "3", "torch": "t",
                                                              "cuda": None, "commit": None})
    assert "needs a CUDA GPU" in md.read_text() and "– / 3" in md.read_text()
    assert "python -m task2.test" not in entry["summary"]  # task 2's test needs the GPU too
    # task 6 is Python around the kernels: its test checks the logic on this machine, and the summary says so
    entry = grader.grade_task(6, tmp_path, tmp_path, solution=False, hidden=False, timeout=10, has_cuda=False)
    assert entry["status"] == "needs_cuda" and "checked here too: python -m task6.test" in entry["summary"]


def test_tasks_not_yet_built_are_marked_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr(grader, "REPO", tmp_path)  # a checkout without task 7's test
    entry = grader.grade_task(7, tmp_path, tmp_path, solution=False, hidden=False, timeout=10, has_cuda=True)
    assert entry["status"] == "unavailable"


def test_grader_failure_is_a_visible_entry(tmp_path):
    grader.write_grader_failure(tmp_path, "Traceback: boom")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["tests"][0]["name"] == "grader failed" and "boom" in results["tests"][0]["output"]


def test_rubric_totals_twenty_points():
    assert TOTAL_POINTS == 20
    assert {t: r.points for t, r in RUBRIC.items()} == {1: 2, 2: 3, 3: 3, 4: 4, 5: 4, 6: 3, 7: 1}


def _record(checks, speeds=()):
    cases = [{"kind": "check", "passed": p, "metrics": {}} for p in checks]
    cases += [{"kind": "benchmark", "passed": True, "metrics": {"vs_reference": s}} for s in speeds]
    return {"status": "passed" if all(checks) else "failed", "cases": cases}


def test_a_failed_benchmark_forfeits_the_performance_points():
    record = _record([True, True], [3.0])
    record["cases"].append({"kind": "benchmark", "passed": False, "name": "attention", "metrics": {},
                            "message": "faster than the GPU's float32 peak"})
    points, why = score(4, record)
    assert points == 3 and "faster than the GPU" in why


def test_a_broken_rule_scores_zero():
    record = _record([True, True])
    record["cases"].append({"kind": "rule", "passed": False, "name": "own work", "metrics": {},
                            "message": "calls PyTorch's own attention"})
    assert score(1, record) == (0.0, "0 points: calls PyTorch's own attention")


def test_performance_points_need_every_check_and_follow_the_reference_ratio():
    # harness/points.py: full at 0.9x the reference, none at 0.5x or below, in proportion between
    assert score(4, _record([True, True], [0.9, 1.3]))[0] == 4
    assert score(4, _record([True, True], [0.7, 0.7]))[0] == 3.5
    assert score(4, _record([True, True], [0.5, 0.4]))[0] == 3
    points, why = score(4, _record([True, False], [2.0]))
    assert points == 1.5 and "until every check passes" in why
    assert score(4, _record([True], []))[0] == 3  # no reference timing: correctness only


def test_bad_task_list_is_refused():
    proc = subprocess.run([sys.executable, "-m", "grader", "--tasks", "9"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0 and "no task 9" in proc.stderr


def test_the_score_line_says_what_was_not_graded_and_why():
    from grader.__main__ import score_text

    entries = [{"task": 1, "points": 2, "max_points": 2, "status": "passed"},
               {"task": 2, "points": 0, "max_points": 3, "status": "needs_cuda"}]
    assert score_text(entries) == ("2 / 2 of the tasks graded (2 of the 20 points graded: task 2 needs a GPU; "
                                   "tasks 3, 4, 5, 6, 7 not asked for)")
    every = [{"task": t, "points": r.points, "max_points": r.points, "status": "passed"} for t, r in RUBRIC.items()]
    assert score_text(every, bold="**") == "**20 / 20** (20 of the 20 points graded)"


def test_a_submission_without_an_optional_file_gets_its_skeleton_and_a_plain_note(tmp_path):
    """Task 4's bf16/fp16 file is an optional part: a submission without it is graded with its skeleton, said
    plainly, and the class gradebook does not list it missing (a required file still is)."""
    from grader.__main__ import prepare_submission

    submission = tmp_path / "alice"
    (submission / "task4/kernels").mkdir(parents=True)
    (submission / "task4/kernels/attention.cu").write_text((REPO / "task4/kernels/attention.cu").read_text())
    notes = prepare_submission(submission, tmp_path / "graded")
    half = [n for n in notes if n.startswith("task4/kernels/attention_half.cu")]
    assert half == ["task4/kernels/attention_half.cu: not in the submission (an optional part, not scored), so its "
                    "skeleton was used"]
    assert (tmp_path / "graded/task4/kernels/attention_half.cu").read_text() == \
        (REPO / "task4/kernels/attention_half.cu").read_text()
    assert any(n.startswith("task1/attention.py: missing") for n in notes)  # a required file: said as before
    # graded alone, task 4 says nothing of the other tasks' files (it runs none of them)
    assert [n.split(":")[0] for n in prepare_submission(submission, tmp_path / "graded4", [4])] == [
        "task4/kernels/attention_half.cu", "task4/kernels/attention_backward.cu", "task4/kernels/attention_hopper.cu",
        "task4/kernels/attention_backward_half.cu"]
