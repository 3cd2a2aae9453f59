"""grader.batch --slurm through a real one-node Slurm (tests/slurm_cluster.py), against the local backend.

A small class of task 1 submissions: correct ones (a folder, a zip), PyTorch's own attention, a
link in place of the student's file, a broken archive, one that hangs past Slurm's time limit, and
one that is cancelled while it runs. Slurm grades the class as an array job, a gather job sends the
stopped ones once more, and the gradebook must equal the one the local backend writes for the same
class (the problem column's wording and the times aside). Then two students are sent again and that
array is cancelled while it waits: the gather records that they never started, keeps their earlier
grades, and sends nothing again.

Time: the local backend grades the class while Slurm does (they share nothing but TMPDIR), in two
runs side by side, so that the hang's --timeout is not added to the other gradings' time; and once the
hang's Slurm grading has hung, its limit is cut from --time's minutes (Slurm counts no less than a
minute) to 0, so that slurmctld's next time-limit check (every 30 s) stops it.
"""

import contextlib
import csv
import datetime
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
from tests.task1_submissions import submission_text

SLOW_S = 8  # the cancelled submission sleeps this long at import: it is cancelled 3-4 s into its grading
WAIT_S = 900  # the whole Slurm class, bounded
LOCAL_TIMEOUT_S = 60  # the local backend's --timeout in the run with the hang
# the hang's Slurm limit is cut once its grading has run this long: by then it sleeps in the student's code (it
# gets there 8-22 s after it starts on this busy 2-core machine), and Slurm stops it 0-30 s after the cut
HANG_S = 20
# Several gradings share the machine's cores here: one PyTorch thread each, so that none spins waiting on a
# thread that has no core (grader/schedule.py's cpu_threads does the same for the tasks of one grading)
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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


def _cut_time_limit(job, env):
    """Stop a running element at slurmctld's next time-limit check (every 30 s) rather than minutes on: Slurm's
    time limits are whole minutes, and TimeLimit=0 ends the element as --time would (JobState TIMEOUT, SIGTERM to
    the grading). The class asks for 2 minutes, so that no other grading of this busy machine nears its limit."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True).stdout
    assert "TimeLimit=00:02:00 " in shown, shown  # the kit's --time 2 is the element's limit
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=0"], env=env, check=True, timeout=30)


def _local(subs, out, temp, *options):
    """The local backend on the class, started now; its output goes to OUT.log."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "grader.batch", str(subs), "--out", str(out), "--tasks", "1",
                                 *options], cwd=REPO, env=dict(os.environ, TMPDIR=str(temp), **THREADS), stdout=log,
                                stderr=subprocess.STDOUT)


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
        env |= {"TMPDIR": str(temp), **THREADS}
        out = tmp_path / "slurm"
        submitted = subprocess.run(  # first, on its own: the array starts the sooner
            [sys.executable, "-m", "grader.batch", str(subs), "--out", str(out), "--tasks", "1", "--slurm",
             "--time", "2", "--timeout", "600", "--cpus", "1", *sandbox],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "submitted array job" in submitted.stdout
        # more CPUs than the node has: it would pend forever (PartitionConfig); refused before anything is written
        refused = subprocess.Popen(
            [sys.executable, "-m", "grader.batch", str(subs), "--out", str(out), "--tasks", "1", "--slurm",
             "--cpus", "999", *sandbox], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # the local backend on the same class meanwhile, in two runs: the hang, stopped at its --timeout, and one
        # more after it (the class goes on); the others beside them, with a --timeout that no grading nears
        local, local_hang = tmp_path / "local", tmp_path / "local-hang"
        runs = [_local(subs, local, temp, "--timeout", "600", *sandbox, "--only", "good,zipped,own_work,slow,broken"),
                _local(subs, local_hang, temp, "--timeout", str(LOCAL_TIMEOUT_S), *sandbox, "--only", "hang,linked")]
        for run in runs:  # stopped if the test fails before they end
            stack.callback(lambda run=run: run.poll() is None and run.kill())

        def running_for(sid, seconds, tries=1):  # the student's Slurm element once its tries-th grading ran so long
            tried = class_state.attempts(out, sid)
            if len(tried) != tries or "ended" in tried[-1]:
                return None
            started = datetime.datetime.fromisoformat(tried[-1]["started"]).timestamp()
            return tried[-1]["job"] if time.time() >= started + seconds else None

        # the first round, whichever starts first: the hang's limit cut once it has hung, and the slow submission
        # cancelled 3 s into its grading
        acts = {"hang": (HANG_S, lambda job: _cut_time_limit(job, env)),
                "slow": (3, lambda job: subprocess.run(["scancel", job], env=env, check=True, timeout=30))}

        def first_round():
            for sid, (seconds, act) in list(acts.items()):
                if job := running_for(sid, seconds):
                    act(job)
                    del acts[sid]
            return not acts

        _wait("the hang's or the slow submission's grading did not start", first_round, 300, env)
        said = refused.communicate(timeout=120)
        assert refused.returncode == 2 and "--cpus 999: the nodes of the default partition have at most" in (
            said[1]), said
        _wait("the hang was not sent again", lambda: running_for("hang", HANG_S, tries=2), 300, env)
        _cut_time_limit(running_for("hang", HANG_S, tries=2), env)
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
        for run, folder in zip(runs, (local, local_hang)):
            assert run.wait(timeout=900) == 0, open(f"{folder}.log").read()

    assert not list(temp.iterdir()), "a stopped grading left its scratch copy"
    here = book(local) | {sid: book(local_hang)[sid] for sid in ("hang", "linked")}

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
