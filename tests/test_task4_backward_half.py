"""Task 4's optional 16-bit backward part (steps 27-30) graded on the CPU from end to end, with PyTorch standing in for
the kernels (tests/stand_in/): checked in both types against float64 within SDPA's own 16-bit error, its sanitizer
pass and bad input, and no point moved either way."""

import contextlib
import math

import torch

from checks.task4.backward import check_training, training_name
from grader.rubric import RUBRIC, score
from tests.conftest import REPO, needs_solution
from tests.stand_in import HIDDEN, SCORED, Behaviour, failed, stand_in  # noqa: F401

pytestmark = [needs_solution(4)]


def half_backward_checks(record):
    """The part's checks: optional cases named "bf16 backward ..." or "fp16 backward ...", timings left out."""
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].split()[0] in ("bf16", "fp16")
            and c["name"].split()[1] == "backward" and " pass time: " not in c["name"]]


def test_the_reference_passes_every_case_in_both_types_and_scores_nothing(stand_in):
    """Every public and hidden case in bf16 and fp16 (causal too where seq_q <= seq_k) and the very negative scores
    pass for the reference, each gradient within its allowance, said; then the part's sanitizer pass and the binding's
    bad input, and its timings against SDPA's flash backward; a grading the same but the timings; the points are the
    float32 part's alone."""
    from checks.task4 import measure_backward
    from checks.task4.backward_half import BACKWARD_HALF_PASS_NAME
    from checks.task4.cases import BACKWARD_HALF_CASES
    from checks.task4.measure import HALF_TYPES
    from grader.hidden import CASES as HIDDEN_CASES

    for flags in ((), ("--grading",)):
        record = stand_in.run(4, "--solution", *SCORED[4], "--backward-half", *HIDDEN, *flags)
        checks = half_backward_checks(record)
        shapes = BACKWARD_HALF_CASES + HIDDEN_CASES[4]["backward_half"]
        causal = sum(1 for s in shapes if s[3] <= s[4])
        # a grading checks each case in one of the two types, by turns: both types, half the time
        each = 1 if flags else len(HALF_TYPES)
        assert len(checks) == each * (len(shapes) + causal + 2), [c["name"] for c in checks]
        assert {c["name"].split()[0] for c in checks} == set(HALF_TYPES)
        assert all(c["passed"] and "lse " in c["message"] and "dq " in c["message"] and "x SDPA's" in c["message"]
                   for c in checks), failed(record)
        assert sum("every score very negative" in c["name"] for c in checks) == 2 * each
        passes = {c["name"]: c for c in record["cases"] if c["name"].startswith("memory-safe")}
        assert passes[BACKWARD_HALF_PASS_NAME]["kind"] == "optional" and passes[BACKWARD_HALF_PASS_NAME]["passed"]
        errors = [c for c in record["cases"] if c["name"].startswith("bad input to the 16-bit backward part")]
        assert len(errors) == 1 and errors[0]["passed"] and "6 kinds" in errors[0]["message"], errors
        assert score(4, record)[0] == RUBRIC[4].points
        trained = [c for c in record["cases"] if c["name"] == training_name(torch.bfloat16)]
        assert len(trained) == 1 and trained[0]["passed"] and trained[0]["kind"] == "optional", trained
        assert "in bfloat16" in trained[0]["message"] and "largest_loss_gap" in trained[0]["metrics"], trained
        timed = [c for c in record["cases"] if c["name"].startswith("bf16 backward pass time: ")]
        if flags:  # a grading times nothing optional
            assert not timed and "kernel_step_ms" not in trained[0]["metrics"]
            continue
        assert {"kernel_step_ms", "sdpa_step_ms"} <= set(trained[0]["metrics"])
        assert len(timed) == len(measure_backward.BACKWARD_HALF_BENCHMARKS) * 2, [c["name"] for c in timed]
        assert all(c["kind"] == "optional" and c["passed"] and c["message"].endswith("not scored")
                   and "SDPA's backward (flash backend, bfloat16)" in c["message"]
                   and "reference kernels" in c["message"] for c in timed), timed


def test_a_wrong_student_part_fails_its_cases_named_and_keeps_every_point(stand_in, tmp_path):
    """A student's dk 1% off fails the part's cases with the steps named, and no point; a mistake of the common list
    (D left out of dS) is named with the 16-bit part's step, said once; the handout's skeletons stop at step 27."""
    for rel in ("task4/kernels/attention.cu", "task4/kernels/attention_half.cu",
                "task4/kernels/attention_backward_half.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    stand_in.student[4] = Behaviour(backward_half="wrong")
    record = stand_in.run(4, "--student-dir", str(tmp_path), *SCORED[4], "--backward-half")
    points, why = score(4, record)
    assert record["status"] == "passed" and points == RUBRIC[4].points, why
    wrong = [c for c in half_backward_checks(record) if not c["passed"]]
    assert wrong and all("dk" in c["message"] and "steps 28-29" in c["message"] for c in wrong), wrong
    assert all(c["passed"] for c in record["cases"] if c["kind"] == "check")

    stand_in.student[4] = Behaviour(backward_half="no D")  # dS = P dP: named with step 30 (dQ is checked first)
    record = stand_in.run(4, "--student-dir", str(tmp_path), "--backward-half")
    wrong = [c for c in half_backward_checks(record) if not c["passed"]]
    assert wrong and all(c["message"].startswith("looks like dS without D") and "Task 4, step 30." in c["message"]
                         for c in wrong), [c["message"][:150] for c in wrong]

    stand_in.student[4] = Behaviour(backward_half="one head")  # the key blocks walk a group's first head alone
    record = stand_in.run(4, "--student-dir", str(tmp_path), "--backward-half")
    wrong = [c for c in half_backward_checks(record) if not c["passed"]]
    assert wrong and all(c["message"].startswith("looks like dQ of one query head of each group")
                         and "Task 4, step 28." in c["message"] and ("kv heads" in c["name"] or "MQA" in c["name"])
                         for c in wrong), \
        [(c["name"], c["message"][:150]) for c in wrong]

    stand_in.student[4] = Behaviour(backward_half="lse unwritten")
    record = stand_in.run(4, "--backward-half")  # the handout's skeletons: every step TODO
    said = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert len(said) == 1 and "not implemented yet: see README, Task 4, step 27" in said[0], said


class CurveWorker:
    """A worker whose training call returns `losses(SDPA's curve)`: the check's verdicts on curves made to order."""

    def __init__(self, losses):
        self.losses = losses

    def call(self, entry, seed, steps, dtype, timeout):
        assert entry == "train_with_kernels" and steps is None
        return self.losses(sdpa_curve(getattr(torch, dtype), seed))


CURVES: dict = {}  # SDPA's curves, trained once for each type, backend, configuration and seed


def sdpa_curve(dtype, seed, backend=None):
    """SDPA's training curve as the check trains it (its default backend, or `backend`)."""
    from torch.nn.attention import sdpa_kernel

    from task4 import train

    key = (dtype, backend, train.TRAINING, seed)
    if key not in CURVES:
        with sdpa_kernel(backend) if backend else contextlib.nullcontext():
            CURVES[key] = train.train(train.sdpa_attention, train.TRAINING, seed, "cuda", None, dtype)
    return list(CURVES[key])


def test_the_training_check_holds_the_curves_to_sdpas_in_both_types(stand_in):
    """The training check (untimed): SDPA's own bf16 curve passes within step 16's band (no third training); a step
    off by that band plus the gap between SDPA's default and math backends passes in bf16 (its band widened by twice
    that gap, said) and fails in float32; half a unit off fails in both with the step and the README's steps; a NaN
    fails with its step."""
    from torch.nn.attention import SDPBackend

    from checks.task4.backward import TRAINING_ATOL, TRAINING_RTOL
    from harness import cli
    from tests.stand_in.gpu import CudaOnTheCpu

    def off_at_9(by):
        return lambda losses: losses[:9] + [losses[9] + by(losses[9])] + losses[10:]

    with CudaOnTheCpu():
        seed = cli.seed(23, None)
        spread = max(abs(a - b) for a, b in zip(sdpa_curve(torch.bfloat16, seed),
                                                sdpa_curve(torch.bfloat16, seed, SDPBackend.MATH)))
        assert spread > 0
        same = check_training(CurveWorker(lambda losses: losses), None, timed=False, dtype=torch.bfloat16)
        assert same[0] and "the curves agree step by step" in same[1] and "math backends" not in same[1], same[1]
        assert "sdpa_backends_gap" not in same[2]
        past_band = off_at_9(lambda loss: TRAINING_ATOL + TRAINING_RTOL * loss + spread)
        widened = check_training(CurveWorker(past_band), None, timed=False, dtype=torch.bfloat16)
        assert widened[0] and "SDPA's default and math backends" in widened[1], widened[1]
        assert widened[2]["sdpa_backends_gap"] == spread
        narrow = check_training(CurveWorker(past_band), None, timed=False)
        assert not narrow[0] and "at step 9 " in narrow[1], narrow[1]
        for dtype, steps in ((torch.float32, "steps 12-16"), (torch.bfloat16, "steps 27-30")):
            off = check_training(CurveWorker(off_at_9(lambda loss: 0.5)), None, timed=False, dtype=dtype)
            assert not off[0] and "at step 9 " in off[1] and f"(README, Task 4, {steps})" in off[1], off[1]
            assert ("SDPA's default and math backends" in off[1]) == (dtype != torch.float32), off[1]
        nan = check_training(CurveWorker(lambda losses: losses[:3] + [math.nan] + losses[4:]), None, timed=False)
        assert not nan[0] and "the loss is nan at step 3" in nan[1], nan[1]
