"""Task 4's masks beyond causal (steps 23-24, optional) graded on the CPU from end to end, PyTorch standing in for the
float32 kernel (tests/stand_in/): every case against float64, its sanitizer pass and the binding's errors, nothing
scored; a skeleton's part names step 23, and a window one key too wide is named as that mistake."""

import pytest

from grader.rubric import RUBRIC, score
from tests.conftest import REPO, needs_solution
from tests.stand_in import HIDDEN, SCORED, Behaviour, failed, stand_in  # noqa: F401

pytestmark = [needs_solution(4)]


def mask_checks(record):
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].startswith("masks: ")]


def test_the_masks_part_is_checked_with_its_pass_and_errors_and_scores_nothing(stand_in):
    from checks.task4.masks import MASK_CASES, MASKS_PASS_NAME
    from grader.hidden import CASES as HIDDEN_CASES

    record = stand_in.run(4, "--solution", "--masks", *HIDDEN)
    checks = [c for c in mask_checks(record) if " at batch " not in c["name"]]  # the benchmarks are below
    assert len(checks) == len(MASK_CASES) + len(HIDDEN_CASES[4]["masks"]), [c["name"] for c in checks]
    assert all(c["passed"] for c in checks), failed(record)
    assert any("window 0" in c["name"] and "documents" not in c["name"] for c in checks)
    assert any("key_start 0,150" in c["name"] and "documents 90+210" in c["name"] for c in checks)
    named = {c["name"]: c for c in record["cases"]}
    assert named[MASKS_PASS_NAME]["passed"] and named[MASKS_PASS_NAME]["kind"] == "optional", named.get(MASKS_PASS_NAME)
    errors = named["bad input to the masks raises clear errors (the given binding)"]
    assert errors["passed"] and "9 kinds" in errors["message"], errors
    timed = [c for c in record["cases"] if c["name"].startswith("masks: ") and " at batch " in c["name"]]
    assert len(timed) == 2 and all(c["kind"] == "optional" and "x its speed" in c["message"] and "1/" in c["message"]
                                   and "not scored" in c["message"] for c in timed), timed
    graded = stand_in.run(4, "--solution", *SCORED[4], "--masks", "--grading")
    assert mask_checks(graded) and score(4, graded)[0] == RUBRIC[4].points, failed(graded)
    assert not [c for c in graded["cases"] if " at batch " in c["name"] and c["name"].startswith("masks: ")]


def student_files(tmp_path):
    rel = "task4/kernels/attention.cu"
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text((REPO / "task4/solution/kernels/attention.cu").read_text())
    return tmp_path


@pytest.mark.parametrize("how, words", [
    ("window_wide", "it matches the window one key too wide"),
    ("unwritten", "not implemented yet: see README, Task 4, step 23"),
])
def test_a_wrong_or_unwritten_masks_kernel_fails_its_part_only_with_the_step(stand_in, tmp_path, how, words):
    stand_in.student[4] = Behaviour(masks=how)
    student = student_files(tmp_path) if how == "window_wide" else None  # the skeleton's steps 23-24 still TODO
    record = stand_in.run(4, *(("--student-dir", str(student)) if student else ()), *SCORED[4], "--masks")
    assert record["status"] == "passed" and score(4, record)[0] == RUBRIC[4].points, failed(record)
    wrong = [c for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert wrong and all(words in c["message"] for c in wrong), [c["message"][:300] for c in wrong]
    if how == "window_wide":  # a case without a window is right; one with it named with its step
        assert all("window" in c["name"] for c in wrong) and "steps 23-24" in wrong[0]["message"], wrong[0]
        assert any(c["passed"] for c in mask_checks(record))
