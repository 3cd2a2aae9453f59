"""A class's jobs on Slurm (grader.slurm): the job scripts follow the options, the jobs are chained prebuild, array,
gather, and what Slurm says back (no node fits, a reason that never clears, a cancelled array) is told; with a fake
sinfo, squeue and sbatch (CPU). A real one-node cluster: tests/test_slurm.py."""

import csv
import os

import pytest
import torch

from grader import batch, class_state, gather, grading, slurm, submissions
from tests.conftest import needs_solution


def test_array_ranges():
    assert slurm.array_spec([0, 1, 2, 5, 7, 8], None) == "0-2,5,7-8"
    assert slurm.array_spec([3], 4) == "3%4"


def test_the_job_scripts_follow_the_options_and_the_template(tmp_path, capsys):
    subs = tmp_path / "subs"
    (subs / "ann").mkdir(parents=True)
    out = tmp_path / "out"
    argv = [str(subs), "--out", str(out), "--tasks", "1,4", "--slurm", "--dry-run", "--partition", "gpu",
            "--account", "course", "--time", "30", "--max-running", "8", "--sbatch=--qos=short"]
    assert batch.main(argv) == 0
    grade = (out / "slurm/grade.sh").read_text()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=course", "#SBATCH --time=30", "#SBATCH --gres=gpu:1",
                 "#SBATCH --requeue", "#SBATCH --qos=short", "#SBATCH --open-mode=append", "-m grader.batch element"):
        assert line in grade, line
    gather = (out / "slurm/gather.sh").read_text()
    assert "--gres" not in gather and "-m grader.batch gather" in gather and '"$@"' in gather
    said = capsys.readouterr().out
    prebuild = (out / "slurm/prebuild.sh").read_text()  # task 4's reference, built once before the gradings
    for line in ("#SBATCH --gres=gpu:1", "#SBATCH --partition=gpu", "#SBATCH --qos=short", "-m grader.batch prebuild"):
        assert line in prebuild, line
    assert "--requeue" not in prebuild
    assert f"sbatch {out / 'slurm/prebuild.sh'}\n" in said
    assert "sbatch --array=0%8 --dependency=afterany:<the prebuild's job id>" in said
    # task 1 alone: no reference to build (another task set than the class's: an explicit --regrade)
    assert batch.main(argv[:4] + ["1"] + argv[5:] + ["--regrade"]) == 0
    assert not (out / "slurm/prebuild.sh").exists() and "sbatch --array=0%8 " in capsys.readouterr().out
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\n@SBATCH@\n")
    with pytest.raises(SystemExit):
        batch.main(argv + ["--template", str(bad)])
    assert "lacks @REPO@, @COMMAND@" in capsys.readouterr().err


def test_the_jobs_are_chained_prebuild_array_gather(tmp_path, monkeypatch, capsys):
    submitted = []

    def sbatch(*args):
        submitted.append(args)
        return str(100 + len(submitted))

    monkeypatch.setattr(slurm, "sbatch", sbatch)
    fake = tmp_path / "bin" / "sbatch"  # never run (sbatch() is replaced): only found, as on a login node
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    (tmp_path / "subs" / "bob").mkdir()
    out = tmp_path / "out"
    assert batch.main([str(tmp_path / "subs"), "--out", str(out), "--tasks", "6", "--slurm"]) == 0
    assert submitted == [(str(out / "slurm/prebuild.sh"),),
                         ("--array=0-1", "--dependency=afterany:101", str(out / "slurm/grade.sh")),
                         ("--dependency=afterany:102", str(out / "slurm/gather.sh"), "--requeue")]
    assert "submitted prebuild job 101 (the reference kernels), array job 102 (2 elements) and gather job 103" in (
        capsys.readouterr().out)

    def refused(*args):  # a partition that refuses the prebuild job: the class goes on without it
        if args == (str(out / "slurm/prebuild.sh"),):
            raise SystemExit("sbatch: error: Batch job submission failed")
        return sbatch(*args)

    submitted.clear()
    monkeypatch.setattr(slurm, "sbatch", refused)
    assert batch.main([str(tmp_path / "subs"), "--out", str(out), "--tasks", "6", "--slurm", "--regrade"]) == 0
    assert submitted == [("--array=0-1", str(out / "slurm/grade.sh")),
                         ("--dependency=afterany:101", str(out / "slurm/gather.sh"), "--requeue")]
    assert "each builds the reference kernels itself" in capsys.readouterr().out


@needs_solution(4)
def test_the_references_a_class_needs(monkeypatch):
    assert grading.reference_builds("1,3") == []
    assert grading.reference_builds("4") == [4]
    assert grading.reference_builds("6") == grading.reference_builds("7") == [4, 5]  # the model runs tasks 4 and 5
    assert grading.reference_builds("2,5") == [2, 4, 5]
    import common.impl

    monkeypatch.setattr(common.impl, "has_solution", lambda task: False)  # the handout
    assert grading.reference_builds("2,4,5") == []


@needs_solution(4)
def test_a_prebuild_that_cannot_build_says_the_gradings_will(tmp_path, capsys):
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    class_state.write_class(tmp_path / "out", submissions.discover(tmp_path / "subs"), "4", 60, False)
    assert grading.prebuild(tmp_path / "out") == 0
    said = capsys.readouterr().out
    if torch.cuda.is_available():
        assert said.startswith("task 4's reference: task 4 (reference solution): ")
    else:
        assert said.startswith("task 4's reference was not prebuilt, so each grading builds it: task 4: ")
        assert "CPU-only build" in said or "no CUDA GPU" in said


def _fake_slurm(tmp_path, monkeypatch, sinfo="", squeue=""):
    """sbatch (never run: slurm.sbatch is replaced), sinfo and squeue saying what a cluster would."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, says in (("sbatch", ""), ("sinfo", sinfo), ("squeue", squeue)):
        (folder / name).write_text(f"#!/bin/sh\nprintf '{says}'\n")
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    submitted = []
    monkeypatch.setattr(slurm, "sbatch", lambda *args: submitted.append(args) or str(100 + len(submitted)))
    monkeypatch.setattr(slurm, "PENDING_CHECK_S", 0)
    return submitted


def test_options_no_node_of_the_partition_can_satisfy_are_refused_at_submission(tmp_path, monkeypatch, capsys):
    submitted = _fake_slurm(tmp_path, monkeypatch,
                            sinfo="debug*|2|1000|(null)|2:00:00\\ngpu|16|64000|gpu:4|infinite\\n"
                                  "short|2|1000|(null)|10:00\\n")
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    argv = [str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--tasks", "1", "--slurm"]
    for extra, words in ((["--cpus", "4"], "--cpus 4: the nodes of the default partition have at most 2 CPUs"),
                         (["--mem", "4G"], "--mem 4G: the nodes of the default partition have at most 1000 MB"),
                         (["--gres", "gpu:1"], "--gres gpu:1: no node of the default partition has a GPU"),
                         (["--partition", "short"], "--time 25 (minutes per element, by default the graded tasks' "
                                                    "limits and 5): partition short allows at most 10 minutes"),
                         (["--sbatch=--partition=short"], "partition short allows at most 10 minutes")):
        with pytest.raises(SystemExit):
            batch.main(argv + extra)
        assert words in capsys.readouterr().err
    assert submitted == []
    assert batch.main(argv) == 0  # the default --cpus fits the node: 2, not 4
    assert "#SBATCH --cpus-per-task=2" in (tmp_path / "out/slurm/grade.sh").read_text()
    with pytest.raises(SystemExit, match="no node of the default partition has a GPU"):  # task 4 needs one
        batch.main(argv[:4] + ["4", "--slurm", "--regrade"])
    assert batch.main(argv[:4] + ["4", "--slurm", "--regrade", "--partition", "gpu", "--cpus", "8"]) == 0
    template = tmp_path / "own.sh"  # a partition the template chooses is not read here: nothing is checked
    template.write_text(slurm.TEMPLATE.read_text().replace("@SBATCH@", "#SBATCH --partition=short\n@SBATCH@"))
    assert batch.main(argv + ["--template", str(template), "--regrade"]) == 0


def test_a_pending_reason_that_never_clears_is_told(tmp_path, monkeypatch, capsys):
    _fake_slurm(tmp_path, monkeypatch, sinfo="debug*|2|1000|gpu:1|infinite\\n",
                squeue="PartitionConfig\\nPartitionConfig\\n")
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    assert batch.main([str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--tasks", "1", "--slurm"]) == 0
    said = capsys.readouterr().out
    assert "warning: array job 101 is pending for PartitionConfig: it asks for more than the partition's" in said
    assert said.count("warning") == 1


def test_an_array_cancelled_before_it_ran_is_not_sent_again_and_says_so(tmp_path, monkeypatch):
    submitted = _fake_slurm(tmp_path, monkeypatch)
    for sid in ("ann", "bob"):
        (tmp_path / "subs" / sid).mkdir(parents=True)
    out = tmp_path / "out"
    assert batch.main([str(tmp_path / "subs"), "--out", str(out), "--tasks", "1", "--slurm"]) == 0
    klass = class_state.load_class(out)
    assert klass["array_of"] == {"0": "101", "1": "101"}
    # ann's element ran and was cancelled mid-grading (sent once more); bob's never ran: the array was cancelled
    class_state.save_attempts(out, "ann", [{"round": klass["round"], "job": "101_0", "started": "t", "ended": "t",
                                      "outcome": "stopped by Slurm: CANCELLED (scancel)", "state": "CANCELLED"}])
    monkeypatch.setattr(gather, "job_state", lambda job: {"101_1": "CANCELLED"}.get(job, gather.FORGOTTEN))
    submitted.clear()
    assert gather.main([str(out), "--requeue"]) == 0
    assert submitted[0][0] == "--array=0"  # ann only
    rows = {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}
    assert rows["bob"]["problem"] == ("never started: Slurm ended it as CANCELLED (scancel) before the grading began; not graded "
                                      "(run grader.batch again to grade it)")
    gather.main([str(out)])  # a second gather records nothing twice
    assert len(class_state.attempts(out, "bob")) == 1
