"""The optional parts of tasks 4, 5, 6 and 7 graded on the CPU from end to end, with PyTorch standing in for the
kernels (tests/stand_in/): task 4's bf16/fp16 kernel and backward pass, task 5's 16-bit cache, tasks 6 and 7's
16-bit models. Each is checked, timed where a student's own run times it, and moves no point.
"""

import sys

import pytest
import torch

from harness import bench
from harness.checks import HALF_TYPES, HUNG_16BIT, MODEL_16BIT_CALL_TIMEOUT_S
from grader.rubric import RUBRIC, score
from tests.conftest import REPO, needs_solution
from tests.stand_in import HIDDEN, SCORED, Behaviour, CudaOnTheCpu, failed, stand_in  # noqa: F401

pytestmark = [needs_solution(2), needs_solution(4), needs_solution(5)]


def half_checks(record):
    """The bf16/fp16 part's checks: optional cases named by their type (bf16 ..., fp16 ...), timings left out."""
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].split()[0] in ("bf16", "fp16")
            and " attention batch " not in c["name"]]


def test_task4s_half_precision_part_is_checked_in_both_types_and_scores_nothing(stand_in, tmp_path):
    """The optional bf16/fp16 kernel (steps 8-11): every public and hidden case in both types passes for the
    reference, then its own sanitizer pass, its bad input and its timings, all optional; a student's kernel 1% off
    fails those cases only, with the allowance said, and keeps every point; with the steps still TODO the part
    says which step, and the float32 part is untouched by those TODOs."""
    from checks.task4 import measure
    from checks.task4.cases import HALF_CASES
    from checks.task4.measure import HALF_TYPES
    from checks.task4.test import BACKWARD_PASS_NAME, HALF_PASS_NAME
    from grader.hidden import CASES as HIDDEN_CASES

    record = stand_in.run(4, "--solution", *SCORED[4], "--half", *HIDDEN)  # the float32 part, then this one
    checks = half_checks(record)
    shapes = HALF_CASES + HIDDEN_CASES[4]["half"]
    causal = sum(1 for s in shapes if s[3] <= s[4])
    assert len(checks) == len(HALF_TYPES) * (len(shapes) + causal + 1), [c["name"] for c in checks]  # + large scores
    assert all(c["passed"] and "x SDPA's" in c["message"] for c in checks), failed(record)
    assert sum("large scores" in c["name"] for c in checks) == len(HALF_TYPES)
    passes = {c["name"]: c for c in record["cases"] if c["name"].startswith("memory-safe")}
    assert passes[HALF_PASS_NAME]["kind"] == "optional" and passes[HALF_PASS_NAME]["passed"]
    assert [c["kind"] for name, c in passes.items() if name not in (HALF_PASS_NAME, BACKWARD_PASS_NAME)] == ["rule"]
    timed = [c for c in record["cases"] if " attention batch " in c["name"] and c["name"].split()[0] in HALF_TYPES]
    assert len(timed) == len(HALF_TYPES) * len(measure.HALF_BENCHMARKS) * 2, [c["name"] for c in timed]
    assert all(c["kind"] == "optional" and c["passed"] and c["message"].endswith("not scored")
               and "flash backend" in c["message"] and "reference kernel" in c["message"]
               and bench.VS_REFERENCE not in c["metrics"] for c in timed), timed
    assert score(4, record)[0] == RUBRIC[4].points
    graded = stand_in.run(4, "--solution", *SCORED[4], "--half", "--grading")
    assert half_checks(graded) and not [c for c in graded["cases"] if " attention batch " in c["name"]
                                        and c["name"].split()[0] in HALF_TYPES]
    assert any("the bf16/fp16 and Hopper kernels against SDPA" in n for n in graded["notes"]), graded["notes"]

    for rel in ("task4/kernels/attention.cu", "task4/kernels/attention_half.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    stand_in.student[4] = Behaviour(half="wrong")
    record = stand_in.run(4, "--student-dir", str(tmp_path), *SCORED[4], "--half")
    points, why = score(4, record)
    assert record["status"] == "passed" and points == RUBRIC[4].points, why
    wrong = [c for c in half_checks(record) if not c["passed"]]
    assert wrong and all("allowed" in c["message"] and "not implemented" not in c["message"] for c in wrong)
    assert all(c["passed"] for c in record["cases"] if c["kind"] == "check")
    assert HALF_PASS_NAME not in {c["name"] for c in record["cases"]}  # the part failed: no pass of its own

    stand_in.student[4] = Behaviour(half="unwritten")
    record = stand_in.run(4, *SCORED[4], "--half")  # the handout's skeletons: every step TODO, float32's right
    assert record["status"] == "passed", failed(record)
    said = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert len(said) == 1 and "not implemented yet: see README, Task 4, step 8" in said[0], said


def half_cache_checks(record):
    """Task 5's bf16/fp16 part (step 6): its update and decode checks, named by their type, timings left out."""
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].split()[0] in ("bf16", "fp16")
            and " cached tokens " not in c["name"]]


def test_task5s_half_precision_cache_is_checked_in_both_types_and_scores_nothing(stand_in, tmp_path, monkeypatch):
    """The optional bf16/fp16 cache (step 6): every public and hidden update and decode case in both types passes for
    the reference, then its own sanitizer pass, its bad input and its timings (FlashInfer's decode beside them, here
    its stand-in), all optional; a decode 1% off fails those cases only and keeps every point; the skeleton's step 6
    says so, the float32 parts untouched by it."""
    from tests.stand_in.flashinfer import installed
    from checks.task4.measure import HALF_TYPES
    from checks.task5 import measure
    from checks.task5.cases import HALF_DECODE_CASES, HALF_UPDATE_CASES
    from checks.task5.half import HALF_PASS_NAME
    from grader.hidden import CASES as HIDDEN_CASES

    installed(monkeypatch)
    record = stand_in.run(5, "--solution", "--half", *HIDDEN)
    checks = half_cache_checks(record)
    cases = (len(HALF_UPDATE_CASES) + len(HIDDEN_CASES[5]["half update"]) + len(HALF_DECODE_CASES)
             + len(HIDDEN_CASES[5]["half decode"]))
    assert len(checks) == len(HALF_TYPES) * cases, [c["name"] for c in checks]
    assert all(c["passed"] for c in checks), failed(record)
    decodes = [c for c in checks if " decode " in c["name"]]
    assert decodes and all("x SDPA's" in c["message"] or "out of range: NaN" in c["message"] for c in decodes)
    passes = {c["name"]: c for c in record["cases"] if c["name"].startswith("memory-safe")}
    assert passes[HALF_PASS_NAME]["kind"] == "optional" and passes[HALF_PASS_NAME]["passed"]
    errors = [c for c in record["cases"] if c["name"].startswith("bad input to the bf16/fp16 cache")]
    assert len(errors) == 1 and errors[0]["passed"] and errors[0]["kind"] == "optional", errors
    timed = [c for c in record["cases"] if " cached tokens " in c["name"] and c["name"].split()[0] in HALF_TYPES]
    assert len(timed) == len(measure.HALF_BENCHMARKS), [c["name"] for c in timed]
    assert all(c["kind"] == "optional" and c["passed"] and c["message"].endswith("not scored")
               and "copy bandwidth" in c["message"] and "reference kernel" in c["message"]
               and "FlashInfer over pages of 16" in c["message"] and "of copy)" in c["message"].split("FlashInfer")[1]
               for c in timed), timed
    graded = stand_in.run(5, "--solution", "--grading", "--half")
    assert half_cache_checks(graded) and not [c for c in graded["cases"] if " cached tokens " in c["name"]
                                              and c["name"].split()[0] in HALF_TYPES]

    for rel in ("task5/kernels/decode.cu", "task5/kernels/decode_half.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    stand_in.student[5] = Behaviour(half="wrong")
    record = stand_in.run(5, "--student-dir", str(tmp_path), *SCORED[5], "--half")  # its checks before the timings
    points, why = score(5, record)
    assert record["status"] == "passed" and points == RUBRIC[5].points, why
    kinds = [c["kind"] for c in record["cases"]]
    last_half = record["cases"].index(half_cache_checks(record)[-1])
    assert "benchmark" in kinds and last_half < kinds.index("benchmark")
    wrong = [c for c in half_cache_checks(record) if not c["passed"]]
    assert wrong and all(" decode " in c["name"] and "allowed" in c["message"] for c in wrong), wrong
    assert all(c["passed"] for c in half_cache_checks(record) if " update " in c["name"])
    assert HALF_PASS_NAME not in {c["name"] for c in record["cases"]}  # the part failed: no pass of its own

    stand_in.student[5] = Behaviour(half="unwritten")
    record = stand_in.run(5, "--half")  # the handout's skeleton: step 6 TODO
    said = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert len(said) == 1 and "not implemented yet: see README, Task 5, step 6" in said[0], said
    assert any("--half tests the optional part alone" in n for n in record["notes"]), record["notes"]


def test_task5s_paged_16_bit_cache_is_checked_against_step_6s_decode_and_scores_nothing(stand_in, tmp_path,
                                                                                       monkeypatch):
    """Step 7 (optional): with --paged-half, step 6's part first, then every public and hidden paged case in both
    types, bit for bit step 6's decode; the pass covers its kernels, bad input names the function a pool's type
    goes to, and the bf16 paged decode is timed against the contiguous one; a lookup one row off fails step 7's
    decode cases only, named with its step; while step 6 fails, step 7 waits and says why."""
    from checks.task4.measure import HALF_TYPES
    from checks.task5.cases import PAGED_DECODE_CASES, PAGED_UPDATE_CASES
    from checks.task5.half import HALF_PASS_NAME, half_sanitizer_calls
    from grader.hidden import CASES as HIDDEN_CASES

    def paged(record):
        return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].split()[:2] in
                [[t, "paged"] for t in HALF_TYPES] and "(step 7)" not in c["name"]]  # the timing left out

    monkeypatch.setitem(sys.modules, "flashinfer", None)  # not installed: its benchmarks say so in one line
    record = stand_in.run(5, "--solution", "--paged-half", *HIDDEN)
    assert sum("FlashInfer is not installed" in n for n in record["notes"]) == 1, record["notes"]
    cases = (len(PAGED_UPDATE_CASES) + len(HIDDEN_CASES[5]["paged update"]) + len(PAGED_DECODE_CASES)
             + len(HIDDEN_CASES[5]["paged decode"]))
    checks = paged(record)
    assert len(checks) == len(HALF_TYPES) * cases, [c["name"] for c in checks]
    assert all(c["passed"] for c in checks), failed(record)
    assert all("bit for bit" in c["message"] for c in checks if " decode " in c["name"]), checks
    assert half_cache_checks(record) and all(c["passed"] for c in half_cache_checks(record))  # step 6's ran first
    passes = {c["name"]: c for c in record["cases"] if c["name"].startswith("memory-safe")}
    calls = len(half_sanitizer_calls(None, with_pages=True))  # step 6's and step 7's
    assert passes[HALF_PASS_NAME]["passed"] and f"on {calls} small cases" in passes[HALF_PASS_NAME]["message"]
    errors = [c for c in record["cases"] if c["name"].startswith("bad input to the bf16/fp16 cache")]
    assert len(errors) == 1 and errors[0]["passed"], errors
    timed = [c for c in record["cases"] if c["name"].startswith("bf16 paged decode (step 7)")]
    assert len(timed) == 1 and timed[0]["passed"] and " kv heads) " in timed[0]["message"], timed  # grouped heads
    assert any("--paged-half tests the optional part alone" in n for n in record["notes"]), record["notes"]

    for rel in ("task5/kernels/decode.cu", "task5/kernels/decode_half.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    stand_in.student[5] = Behaviour(paged_half="wrong")
    record = stand_in.run(5, "--student-dir", str(tmp_path), "--paged-half")
    wrong = [c for c in paged(record) if not c["passed"]]
    assert wrong and all(" decode " in c["name"] and "Task 5, step 7" in c["message"] for c in wrong), wrong
    assert all(c["passed"] for c in paged(record) if " update " in c["name"])

    stand_in.student[5] = Behaviour(half="unwritten")
    record = stand_in.run(5, "--paged-half")  # the handout's skeleton: step 6 TODO, so step 7 waits
    assert not paged(record) and any("step 7" in n and "once step 6's part passes" in n for n in record["notes"])


def test_a_16_bit_cache_goes_to_step_6s_kernels(stand_in):
    """task5/attention.py's update_cache and decode take a bf16/fp16 cache to update_cache_half and decode_half (as
    task 4's flash_attention does for its 16-bit kernel): the cached layer, and tasks 6 and 7, run in 16 bits through
    the same functions; a 16-bit query over a float32 cache is refused with the type each needs."""
    from task5 import attention

    with CudaOnTheCpu():
        check_16_bit_cache(attention)


def check_16_bit_cache(attention):
    for dtype in (torch.bfloat16, torch.float16):
        k_cache, v_cache = (torch.zeros(2, 2, 16, 32, device="cuda", dtype=dtype) for _ in range(2))
        k_new, v_new = (torch.randn(2, 2, 5, 32, device="cuda").to(dtype) for _ in range(2))
        attention.update_cache(k_new, v_new, k_cache, v_cache, 0, solution=True)
        assert torch.equal(k_cache[:, :, :5], k_new) and torch.equal(v_cache[:, :, :5], v_new)
        q = torch.randn(2, 4, 1, 32, device="cuda").to(dtype)
        out = attention.decode(q, k_cache, v_cache, 5, solution=True)
        k, v = (c[:, :, :5].float().repeat_interleave(2, 1) for c in (k_cache, v_cache))
        expected = torch.softmax(q.float() @ k.transpose(-1, -2) / 32 ** 0.5, -1) @ v
        assert out.dtype == dtype and torch.allclose(out.float(), expected, atol=2e-2), (out.float() - expected).abs().max()
    with pytest.raises(RuntimeError, match="q must be float32"):
        attention.decode(q, torch.zeros(2, 2, 16, 32, device="cuda"), torch.zeros(2, 2, 16, 32, device="cuda"), 5,
                         solution=True)


@needs_solution(7)
def test_task7s_16_bit_models_fail_on_a_wrong_16_bit_kernel_and_cost_no_point(stand_in, monkeypatch, tmp_path):
    """Task 4's bf16/fp16 kernel 1% off: task 7's float32 models (and every point) are untouched, and its optional
    16-bit models say what is off, within what the type allows, and where to look. Graded: the generation's timing
    (no point depends on it) is left out with a note."""
    from checks.task7.test import HALF_TYPES

    (tmp_path / "task7").mkdir()
    (tmp_path / "task7/attention.py").write_text((REPO / "task7/solution/attention.py").read_text())
    stand_in.student[4] = Behaviour(half="wrong")
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda *args, **kwargs: 1e3)
    record = stand_in.run(7, "--student-dir", str(tmp_path), *HIDDEN, "--grading")
    points, why = score(7, record)
    assert record["status"] == "passed" and points == RUBRIC[7].points, why
    assert not [c for c in record["cases"] if c["kind"] == "benchmark"]
    assert any("the generation's time per token" in note for note in record["notes"]), record["notes"]
    half = [c for c in record["cases"] if c["name"].split()[0] in HALF_TYPES]
    wrong = [c["message"] for c in half if not c["passed"]]
    assert wrong and all("allowed" in m and "--half" in m for m in wrong), wrong
    # step 4's models on the (stand-in) GPU: task 4's float32 masks inside, right whatever its 16-bit kernel does
    masked = [c for c in record["cases"] if c["kind"] == "optional" and not c["name"].startswith("cpu ")
              and ("Gemma 2" in c["name"] or "Mistral" in c["name"] or "window of 8" in c["name"])]
    assert len(masked) == 4 and all(c["passed"] for c in masked), masked

    stand_in.student[4] = Behaviour(half="hang")  # a 16-bit kernel that hangs: the part ends after its first call
    record = stand_in.run(7, "--student-dir", str(tmp_path), *HIDDEN, "--grading")
    assert record["status"] == "passed" and score(7, record)[0] == RUBRIC[7].points, failed(record)
    hung = [c["message"] for c in record["cases"] if c["name"].split()[0] in HALF_TYPES and not c["passed"]]
    assert len(hung) == 1 and f"did not answer within {MODEL_16BIT_CALL_TIMEOUT_S} s" in hung[0], hung
    assert HUNG_16BIT in record["notes"], record["notes"]


@needs_solution(6)
def test_task6s_16_bit_model_fails_on_a_wrong_16_bit_kernel_and_costs_no_point(stand_in, monkeypatch, tmp_path):
    """Task 5's bf16/fp16 decode 1% off: task 6's float32 model (and every point) is untouched, and its optional
    16-bit model says what is off, within what the type allows, and where to look; its generation run waits."""
    from checks.task6 import measure, test as task6_test
    from task6.model import SIZES

    monkeypatch.setattr(task6_test, "HANDOUT", measure.Run(batch=2, prompt=10, steps=6))
    monkeypatch.setitem(SIZES, "small", SIZES["tiny"])
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda *args, **kwargs: 1e3)
    (tmp_path / "task6").mkdir()
    (tmp_path / "task6/attention.py").write_text((REPO / "task6/solution/attention.py").read_text())
    stand_in.student[5] = Behaviour(half="wrong")
    record = stand_in.run(6, "--student-dir", str(tmp_path), "--size", "small")
    points, why = score(6, record)
    assert record["status"] == "passed" and points == RUBRIC[6].points, why
    half = [c for c in record["cases"] if c["name"].split(":")[0] in HALF_TYPES]
    wrong = [c["message"] for c in half if not c["passed"]]
    assert wrong and all("allowed" in m and "--half" in m for m in wrong), wrong
    assert not any("in bfloat16" in c["name"] for c in record["cases"])  # no 16-bit generation run
    assert any("generation run in 16 bits is skipped" in n for n in record["notes"]), record["notes"]

    stand_in.student[5] = Behaviour()
    stand_in.student[4] = Behaviour(half="hang")  # task 4's 16-bit kernel hangs: the part ends after its first call
    record = stand_in.run(6, "--student-dir", str(tmp_path), "--size", "small")
    assert record["status"] == "passed" and score(6, record)[0] == RUBRIC[6].points, failed(record)
    hung = [c["message"] for c in record["cases"] if c["name"].split(":")[0] in HALF_TYPES and not c["passed"]]
    assert len(hung) == 1 and f"did not answer within {MODEL_16BIT_CALL_TIMEOUT_S} s" in hung[0], hung
    assert HUNG_16BIT in record["notes"], record["notes"]


def backward_checks(record):
    """The backward part's checks (steps 12-16): optional cases named "backward ...", timings left out."""
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].startswith("backward batch ")]


def test_task4s_backward_part_is_checked_timed_and_scores_nothing(stand_in, tmp_path, monkeypatch):
    """The optional backward part (steps 12-16): every public and hidden case passes for the reference (lse, out,
    then dq, dk, dv), then its sanitizer pass, its bad input, the copy model trained through it against SDPA (its
    curves written with --backward) and its timings against SDPA's backward, all optional (a grading checks the
    training untimed and times nothing of the part); a student's dk 1% off
    fails those cases only, with the step named, and keeps every point; with the steps still TODO the part says
    which step."""
    from checks.task4 import measure_backward
    from checks.task4.cases import BACKWARD_CASES
    from checks.task4.test import BACKWARD_PASS_NAME
    from grader.hidden import CASES as HIDDEN_CASES

    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where --backward writes the training curves
    record = stand_in.run(4, "--solution", "--backward", *HIDDEN)
    checks = backward_checks(record)
    shapes = BACKWARD_CASES + HIDDEN_CASES[4]["backward"]
    causal = sum(1 for s in shapes if s[3] <= s[4])
    assert len(checks) == len(shapes) + causal + 2, [c["name"] for c in checks]  # + every score very negative
    assert all(c["passed"] and "lse " in c["message"] and "dv " in c["message"] for c in checks), failed(record)
    passes = {c["name"]: c for c in record["cases"] if c["name"].startswith("memory-safe")}
    assert passes[BACKWARD_PASS_NAME]["kind"] == "optional" and passes[BACKWARD_PASS_NAME]["passed"]
    errors = [c for c in record["cases"] if c["name"].startswith("bad input to the backward part")]
    assert len(errors) == 1 and errors[0]["passed"], errors
    training = [c for c in record["cases"] if c["name"].startswith("a model trained through your kernels")]
    assert len(training) == 1 and training[0]["passed"] and training[0]["kind"] == "optional", training
    assert "the curves agree step by step" in training[0]["message"], training[0]["message"]
    assert {"kernel_step_ms", "sdpa_step_ms", "largest_loss_gap"} <= set(training[0]["metrics"])
    assert (tmp_path / "cwd" / "task4-training.csv").exists() and "wrote task4-training.csv" in training[0]["message"]
    timed = [c for c in record["cases"] if c["name"].startswith("backward pass time: ")]
    assert len(timed) == len(measure_backward.BACKWARD_BENCHMARKS) * 2, [c["name"] for c in timed]
    assert all(c["kind"] == "optional" and c["passed"] and c["message"].endswith("not scored")
               and "SDPA's backward" in c["message"] and "reference kernels" in c["message"] for c in timed), timed
    assert any("--backward tests the optional part alone" in n for n in record["notes"]), record["notes"]

    # a grading runs the training check untimed, as a check beside the sanitizer passes, and times nothing optional
    record = stand_in.run(4, "--solution", "--backward", "--grading", *HIDDEN)
    names = [c["name"] for c in record["cases"]]
    training = [c for c in record["cases"] if c["name"].startswith("a model trained through your kernels")]
    assert len(training) == 1 and training[0]["passed"], training
    assert "not timed in a grading" in training[0]["message"] and "kernel_step_ms" not in training[0]["metrics"]
    assert names.index(training[0]["name"]) < names.index(BACKWARD_PASS_NAME)
    assert not any(name.startswith("backward pass time: ") for name in names)

    for rel in ("task4/kernels/attention.cu", "task4/kernels/attention_backward.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    stand_in.student[4] = Behaviour(backward="wrong")
    record = stand_in.run(4, "--student-dir", str(tmp_path), *SCORED[4], "--backward")
    points, why = score(4, record)
    assert record["status"] == "passed" and points == RUBRIC[4].points, why
    wrong = [c for c in backward_checks(record) if not c["passed"]]
    assert wrong and all("dk" in c["message"] and "steps 13-15" in c["message"] for c in wrong), wrong
    assert all(c["passed"] for c in record["cases"] if c["kind"] == "check")
    assert BACKWARD_PASS_NAME not in {c["name"] for c in record["cases"]}  # the part failed: no pass of its own

    stand_in.student[4] = Behaviour(backward="no D")  # dS = P dP: named with its step, said once with a count
    record = stand_in.run(4, "--student-dir", str(tmp_path), "--backward")
    wrong = [c for c in backward_checks(record) if not c["passed"]]
    assert wrong and all(c["message"].startswith("looks like dS without D") and "Task 4, step 16." in c["message"]
                         for c in wrong), [c["message"][:150] for c in wrong]  # dQ is checked first
    from grader import __main__ as grader
    assert sum(line.startswith("- FAIL") for line in grader._details({"task": 4, "record": record})) == 1

    stand_in.student[4] = Behaviour(backward="unwritten")
    record = stand_in.run(4, "--backward")  # the handout's skeletons: every step TODO
    said = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert len(said) == 1 and "not implemented yet: see README, Task 4, step 12" in said[0], said


def test_task4s_trainable_attention_gives_autograds_gradients(stand_in):
    """flash_attention_trainable (given) saves forward_lse's output and L and hands them to backward: autograd
    through it gives what autograd through naive attention gives, grouped heads and causal included."""
    from harness.attention_math import attention_gradients
    from task4.attention import flash_attention_trainable

    with CudaOnTheCpu():
        q = torch.randn(2, 4, 37, 24, device="cuda", requires_grad=True)
        k, v = (torch.randn(2, 2, 53, 24, device="cuda", requires_grad=True) for _ in range(2))
        d_out = torch.randn(2, 4, 37, 24, device="cuda")
        flash_attention_trainable(q, k, v, causal=True, solution=True).backward(d_out)
    for got, expected in zip((q.grad, k.grad, v.grad), attention_gradients(q, k, v, d_out, causal=True)):
        assert torch.allclose(got.double(), expected, atol=1e-5), (got - expected).abs().max()


@pytest.mark.parametrize("task, flags, steps", [(4, ("--attention", "--half"), {"check": 3, "optional": 10}),
                                                (4, ("--attention", "--hopper"), {"check": 3, "optional": 19}),
                                                (5, ("--decode", "--layer", "--half"), {"check": 2, "optional": 6})])
def test_a_kernel_mistake_is_named_in_every_case_it_shows_in(stand_in, task, flags, steps):
    """Kernels that ignore their scale: every failing case says so with its step, the grouped-query, padded and
    per-sequence cases and the 16-bit parts' too (there, step 10, 19 or 6, within the part's allowance); the layer
    checks built on those kernels point to them; Results.md says each kind once, with its count."""
    from grader import __main__ as grader

    stand_in.student[task] = Behaviour(unscaled=True)
    record = stand_in.run(task, *flags, *HIDDEN)
    wrong = [c for c in record["cases"] if c["kind"] in steps and not c["passed"]]
    named = {kind: [c for c in wrong if c["kind"] == kind and c["message"].startswith(
        f"looks like attention without the 1/sqrt(head_dim) scale: see README, Task {task}, step {step}.")]
        for kind, step in steps.items()}
    layers = [c for c in wrong if "fix that first." in c["message"] and c["name"].startswith("layer")]
    assert all(named.values()) and layers, failed(record)
    assert len(wrong) == sum(map(len, named.values())) + len(layers), [c["message"][:120] for c in wrong
                                                                      if not c["message"].startswith("looks like")]
    assert any("(sequence " in c["message"] for c in named["check"]), "no padded case diagnosed"
    assert any(" kv heads" in c["name"] or "MQA" in c["name"] for c in named["check"]), "no grouped case diagnosed"
    details = grader._details({"task": task, "record": record}, limit=50)
    assert sum(line.startswith("- FAIL") for line in details) <= 4, details  # each kind once


@pytest.mark.parametrize("behaviour, flags, says, step, shown", [
    (Behaviour(decode_one_short=True), ("--decode",), "a decode over one position too few", 2,
     lambda c: " length 1 " in c["name"] and "every row came out NaN (0/0)" in c["message"]),
    (Behaviour(update_rows_late=1), ("--cache",), "the new rows written at other rows than pos", 1,
     lambda c: "; the guard band says: wrote 1 row past the end of `k_cache`" in c["message"]),
])
def test_a_task5_mistake_is_named_in_every_scored_case_it_shows_in(stand_in, behaviour, flags, says, step, shown):
    """The known-bad kernels of tests/test_cuda_submissions.py's DIAGNOSED, played by the stand-in: every failing
    case names the mistake, the single-row, grouped, padded and per-sequence decodes too, and an update whose last
    row lands past the cache's end (the guard band's damage said as well: `shown`)."""
    stand_in.student[5] = behaviour
    record = stand_in.run(5, *flags, *HIDDEN)
    wrong = [c for c in record["cases"] if c["kind"] == "check" and not c["passed"]]
    assert wrong and record["status"] == "failed", failed(record)
    unnamed = [c["name"] + ": " + c["message"][:400] for c in wrong
               if says not in c["message"] or f"see README, Task 5, step {step}." not in c["message"]]
    assert not unnamed, "\n".join(unnamed)
    assert any(shown(c) for c in wrong), [c["name"] + ": " + c["message"][:300] for c in wrong]
