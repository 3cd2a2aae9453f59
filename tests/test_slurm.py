"""grader.batch --slurm through a real one-node Slurm (tests/slurm_cluster.py), against the local backend.

A small class of task 1 submissions: correct ones (a folder, a zip), PyTorch's own attention, a
link in place of the student's file, a broken archive, one that hangs past Slurm's one-minute
time limit, and one that is cancelled while it runs. Slurm grades the class as an array job, a
gather job sends the stopped ones once more, and the gradebook must equal the one the local
backend writes for the same class (the problem column's wording and the times aside). Then two
students are sent again and that array is cancelled while it waits: the gather records that they
never started, keeps their earlier grades, and sends nothing again.
"""

import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

from grader import class_state, gradebook
from tests import slurm_cluster
from tests.conftest import REPO, needs_solution
from tests.test_grader import submission_text

SLOW_S = 20  # the cancelled submission sleeps this long at import: long enough to be cancelled mid-run
WAIT_S = 900  # the whole Slurm class, bounded


def make_class(folder):
    solution = (REPO / "task1/solution/attention.py").read_text()
    texts = {"good": solution, "own_work": submission_text("pytorch_attention"), "hang": submission_text("hang"),
             "slow": solution + f"\nimport time\ntime.sleep({SLOW_S})\n"}
    for sid, text in texts.items():
        (folder / sid / "task1").mkdir(parents=True)
        (folder / sid / "task1" / "attention.py").write_text(text)
    with zipfile.ZipFile(folder / "zipped.zip", "w") as zf:
        zf.writestr("checkout/task1/attention.py", solution)
    (folder / "linked" / "task1").mkdir(parents=True)
    (folder / "linked" / "task1" / "attention.py").symlink_to(REPO / "task1/solution/attention.py")
    (folder / "broken.zip").write_bytes(b"PK\x03\x04 not really")
    return folder


def book(out):
    return {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}


def _wait(what, done, limit_s, env):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(1)
    queue = subprocess.run(["squeue"], env=env, capture_output=True, text=True).stdout
    raise AssertionError(f"{what} within {limit_s} s; squeue:\n{queue}")


@needs_solution(1)
def test_a_class_on_slurm_gets_the_local_backends_gradebook(tmp_path):
    subs = make_class(tmp_path / "subs")
    sandbox = [] if shutil.which("bwrap") else ["--no-sandbox"]
    with contextlib.ExitStack() as stack:
        try:
            env = stack.enter_context(slurm_cluster.cluster(tmp_path / "cluster"))
        except slurm_cluster.Unavailable as err:
            pytest.skip(f"no one-node Slurm here: {err}")
        temp = tmp_path / "node-tmp"  # the node's /tmp for the gradings: a stopped one must leave nothing in it
        temp.mkdir()
        env["TMPDIR"] = str(temp)
        out = tmp_path / "slurm"
        refused = subprocess.run(  # more CPUs than the node has: it would pend forever (PartitionConfig)
            [sys.executable, "-m", "grader.batch", str(subs), "--out", str(out), "--tasks", "1", "--slurm",
             "--cpus", "999", *sandbox], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "--cpus 999: the nodes of the default partition have at most" in (
            refused.stderr), refused.stdout + refused.stderr
        submitted = subprocess.run(
            [sys.executable, "-m", "grader.batch", str(subs), "--out", str(out), "--tasks", "1", "--slurm",
             "--time", "1", "--timeout", "600", "--cpus", "1", *sandbox],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "submitted array job" in submitted.stdout

        def running_slow():
            tried = class_state.attempts(out, "slow")
            return tried and "ended" not in tried[-1] and tried[-1]["job"]

        _wait("the slow submission's grading did not start", running_slow, 300, env)
        time.sleep(3)
        subprocess.run(["scancel", running_slow()], env=env, check=True, timeout=30)
        _wait("the class was not graded",
              lambda: not subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip(),
              WAIT_S, env)
        on_slurm = book(out)
        gathers = len(list((out / "slurm" / "logs").glob("gather-*.log")))

        # Two students sent again, and the array cancelled while it waits (held here, so it cannot start):
        # the gather must record that they never started and send nothing again.
        held = subprocess.run(
            [sys.executable, "-m", "grader.batch", str(subs), "--out", str(out), "--slurm", "--time", "1",
             "--timeout", "600", "--cpus", "1", "--only", "good,zipped", "--sbatch=--hold", *sandbox],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert held.returncode == 0, held.stdout + held.stderr
        array = class_state.load_class(out)["array_of"][str(sorted(on_slurm).index("good"))]
        jobs = subprocess.run(["squeue", "-h", "-o", "%A %j"], env=env, capture_output=True, text=True).stdout.split()
        subprocess.run(["scancel", array], env=env, check=True, timeout=30)
        assert array in jobs[::2] and len(jobs) == 4, jobs  # the array and its gather, both held
        for job in set(jobs[::2]) - {array}:  # the gather job: let it run now
            subprocess.run(["scontrol", "release", job], env=env, check=True, timeout=30)
        _wait("the gather after the cancel did not end",
              lambda: not subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip(),
              300, env)
        after_cancel = book(out)

    local = tmp_path / "local"
    ran = subprocess.run([sys.executable, "-m", "grader.batch", str(subs), "--out", str(local), "--tasks", "1",
                          "--timeout", "60", *sandbox], cwd=REPO, env=dict(os.environ, TMPDIR=str(temp)),
                         capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert not list(temp.iterdir()), "a stopped grading left its scratch copy"
    here = book(local)

    assert on_slurm.keys() == here.keys() == {"good", "zipped", "own_work", "hang", "slow", "linked", "broken"}
    for sid in here:
        for column in gradebook.COLUMNS:
            if column not in ("problem", "seconds"):
                assert on_slurm[sid][column] == here[sid][column], (sid, column, on_slurm[sid], here[sid])
    assert [here[s]["total"] for s in ("good", "zipped", "slow")] == ["2", "2", "2"]
    assert (here["own_work"]["total"], here["own_work"]["own_work"]) == ("0", "1")
    assert (here["linked"]["total"], here["linked"]["tampering"]) == ("0", "all")
    assert here["broken"]["problem"] == on_slurm["broken"]["problem"] != ""
    assert (here["hang"]["total"], here["hang"]["timed_out"]) == ("0", "all")
    assert on_slurm["hang"]["problem"].startswith("stopped by Slurm: TIMEOUT") and "2 times" in on_slurm["hang"]["problem"]
    slow = [a.get("state") or a["outcome"] for a in class_state.attempts(out, "slow")]
    assert slow == ["CANCELLED", "graded"], slow
    assert gathers == 2  # the first gather, and the one it sent
    report = (out / "report.md").read_text()
    assert "Students: 7; with a total: 7" in report and "| timed_out | hang (all) |" in report

    for sid in ("good", "zipped"):  # not sent again, and the gradebook says why, beside the earlier grade
        assert after_cancel[sid]["total"] == "2"
        assert after_cancel[sid]["problem"].startswith("never started: Slurm ended it as CANCELLED"), after_cancel[sid]
        assert after_cancel[sid]["problem"].endswith("; this is the earlier grade")
        assert [a.get("never_started", False) for a in class_state.attempts(out, sid)] == [False, True]
    assert len(list((out / "slurm" / "logs").glob("gather-*.log"))) == 3  # the cancel's gather sent nothing
    assert json.loads((out / "students/good/grading.json").read_text())["job"] != "local"
