"""Task 4's step 25 (optional): the masks beyond causal in the Hopper kernel, graded on the CPU from end to end with
PyTorch standing in for the kernels (tests/stand_in/): every masks case in bf16 and fp16 against float64 within
PyTorch's own 16-bit error, its sanitizer pass, nothing scored; the skeleton's part names step 25, a window one key too
wide is named with it; flash_attention sends 16-bit masks to the Hopper kernel only once step 25 is written."""

import pytest

from grader.rubric import RUBRIC, score
from tests.conftest import REPO, needs_solution
from tests.stand_in import HIDDEN, SCORED, Behaviour, CudaOnTheCpu, failed, stand_in  # noqa: F401
from tests.stand_in import gpu

pytestmark = [needs_solution(4)]


def hopper_mask_checks(record):
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].startswith("Hopper masks: ")]


def test_the_hopper_masks_part_is_checked_in_both_types_with_its_pass_and_scores_nothing(stand_in):
    from checks.task4.masks import HOPPER_MASKS_PASS_NAME, MASK_CASES
    from checks.task4.measure import HALF_TYPES
    from grader.hidden import CASES as HIDDEN_CASES

    record = stand_in.run(4, "--solution", "--hopper-masks", *HIDDEN)
    checks = hopper_mask_checks(record)
    cases = len(MASK_CASES) + len(HIDDEN_CASES[4]["masks"])
    assert len(checks) == len(HALF_TYPES) * cases, [c["name"] for c in checks]
    assert all(c["passed"] for c in checks), failed(record)
    assert all("allowed" in c["message"] and "PyTorch's" in c["message"] for c in checks), checks[0]
    assert any(c["name"].startswith("Hopper masks: fp16 ") and "softcap" in c["name"] for c in checks)
    named = {c["name"]: c for c in record["cases"]}
    assert named[HOPPER_MASKS_PASS_NAME]["passed"] and named[HOPPER_MASKS_PASS_NAME]["kind"] == "optional"
    graded = stand_in.run(4, "--solution", *SCORED[4], "--hopper", "--hopper-masks", "--grading")
    assert hopper_mask_checks(graded) and score(4, graded)[0] == RUBRIC[4].points, failed(graded)
    # a grading checks each case in one of the two types, by turns: both types, half the time
    in_turns = hopper_mask_checks(graded)
    assert len(in_turns) == len(MASK_CASES) and {c["name"].split()[2] for c in in_turns} == set(HALF_TYPES), \
        [c["name"] for c in in_turns]
    alone = stand_in.run(4, "--solution", "--sanitize", "--hopper-masks")
    assert [c["name"] for c in alone["cases"] if c["name"].startswith("memory-safe")] == [HOPPER_MASKS_PASS_NAME]


def test_the_hopper_masks_wait_for_the_hopper_part_and_for_compute_capability_9_0(stand_in, monkeypatch, tmp_path):
    stand_in.student[4] = Behaviour(hopper="wrong")
    record = stand_in.run(4, "--student-dir", str(student_files(tmp_path)), "--hopper", "--hopper-masks")
    assert not hopper_mask_checks(record)
    assert any("masks (step 25) were not checked" in n and "steps 17-22 first" in n for n in record["notes"])
    monkeypatch.setattr(gpu.GPU, "major", 8)
    stand_in.student[4] = Behaviour()
    record = stand_in.run(4, "--solution", "--hopper-masks")
    said = [n for n in record["notes"] if "compute capability 9.0 only" in n]
    assert len(said) == 1 and not hopper_mask_checks(record), record["notes"]


def student_files(tmp_path, hopper_masks_written=True):
    for rel in ("task4/kernels/attention.cu", "task4/kernels/attention_hopper.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    if not hopper_masks_written:
        (tmp_path / "task4/kernels/attention_hopper.cu").write_text(
            (REPO / "task4/solution/kernels/attention_hopper.cu").read_text()
            + "// TODO (README, Task 4, step 25: the masks)\n")
    return tmp_path


@pytest.mark.parametrize("how, words", [
    ("window_wide", "it matches the window one key too wide"),
    ("unwritten", "not implemented yet: see README, Task 4, step 25"),
])
def test_a_wrong_or_unwritten_hopper_masks_kernel_fails_its_part_only_with_the_step(stand_in, tmp_path, how, words):
    stand_in.student[4] = Behaviour(masks=how)
    student = student_files(tmp_path, hopper_masks_written=how != "unwritten")
    record = stand_in.run(4, "--student-dir", str(student), *SCORED[4], "--hopper-masks")
    assert record["status"] == "passed" and score(4, record)[0] == RUBRIC[4].points, failed(record)
    wrong = [c for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert wrong and all(words in c["message"] for c in wrong), [c["message"][:300] for c in wrong]
    if how == "window_wide":  # a case without a window is right; one with it named with its step
        assert all("window" in c["name"] for c in wrong) and "step 25" in wrong[0]["message"], wrong[0]
        assert any(c["passed"] for c in hopper_mask_checks(record))


def test_flash_attention_sends_16_bit_masks_to_the_hopper_kernel_once_step_25_is_written(stand_in, monkeypatch,
                                                                                      tmp_path):
    """The reference's bf16 masks run forward_masks (the binding sends them to the Hopper kernel); a student's once
    step 25 is written, while steps 17-22 alone keep their 16-bit attention on the Hopper kernel; elsewhere the masks
    in 16 bits are refused with what to do."""
    import torch

    from common import build
    from task4 import attention

    def run(solution=True, **masks):
        monkeypatch.setattr(attention, "_hopper_written", {})
        with CudaOnTheCpu():
            q, k, v = (torch.randn(1, 2, 70, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            out = attention.flash_attention(q, k, v, True, solution=solution, **masks)
        return out, attention.uses_hopper(q, solution)

    out, _ = run(window_left=8)
    assert torch.isfinite(out.float()).all()
    student = tmp_path / "task4" / "kernels"
    monkeypatch.setattr(build, "kernel_folder", lambda task, solution, kernels=None: student)
    stand_in.worker_started(4, solution=False)
    student_files(tmp_path, hopper_masks_written=False)
    with pytest.raises(ValueError, match="step 25.*not all written yet: give float32 tensors"):
        run(solution=False, window_left=8)
    assert run(solution=False)[1]  # steps 17-22 written: 16-bit attention without masks on the Hopper kernel
    student_files(tmp_path)
    out, _ = run(solution=False, softcap=2.0)
    assert torch.isfinite(out.float()).all()
    monkeypatch.setattr(gpu.GPU, "major", 8)
    with pytest.raises(ValueError, match="this is not an H100/H200: give float32 tensors"):
        run(window_left=8)
