"""Task 4's step 26 (optional): the backward part with the masks beyond causal, graded on the CPU from end to end with
PyTorch standing in for the kernels (tests/stand_in/): forward_lse and backward under each mask against float64, the
sanitizer pass, nothing scored; the skeleton's part names step 26, dS left unscaled by the cap's slope is named."""

import pytest

from grader.rubric import RUBRIC, score
from tests.conftest import REPO, needs_solution
from tests.stand_in import HIDDEN, SCORED, Behaviour, failed, stand_in  # noqa: F401

pytestmark = [needs_solution(4)]


def backward_mask_checks(record):
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].startswith("backward masks: ")]


def test_the_backward_masks_part_is_checked_with_its_pass_and_scores_nothing(stand_in):
    from checks.task4.backward_masks import BACKWARD_MASKS_PASS_NAME, backward_shapes
    from checks.task4.masks import MASK_CASES
    from grader.hidden import CASES as HIDDEN_CASES

    record = stand_in.run(4, "--solution", "--backward-masks", *HIDDEN)
    checks = backward_mask_checks(record)
    assert len(checks) == len(backward_shapes(MASK_CASES + HIDDEN_CASES[4]["masks"])), [c["name"] for c in checks]
    assert all(c["passed"] and "dq " in c["message"] and "lse " in c["message"] for c in checks), failed(record)
    assert any("softcap" in c["name"] for c in checks) and any("documents" in c["name"] for c in checks)
    named = {c["name"]: c for c in record["cases"]}
    assert named[BACKWARD_MASKS_PASS_NAME]["passed"] and named[BACKWARD_MASKS_PASS_NAME]["kind"] == "optional"
    graded = stand_in.run(4, "--solution", *SCORED[4], "--backward", "--masks", "--backward-masks", "--grading")
    assert backward_mask_checks(graded) and score(4, graded)[0] == RUBRIC[4].points, failed(graded)


def student_files(tmp_path, unwritten=False):
    for rel in ("task4/kernels/attention.cu", "task4/kernels/attention_backward.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text()
                                    + ("// TODO (README, Task 4, step 26: the masks)\n" if unwritten else ""))
    return tmp_path


@pytest.mark.parametrize("how, words", [
    ("no cap slope", "it matches dS not multiplied by the cap's slope"),
    ("masks unwritten", "not implemented yet: see README, Task 4, step 26"),
])
def test_a_wrong_or_unwritten_backward_masks_kernel_fails_its_part_only_with_the_step(stand_in, tmp_path, how, words):
    stand_in.student[4] = Behaviour(backward=how)
    record = stand_in.run(4, "--student-dir", str(student_files(tmp_path, how == "masks unwritten")), *SCORED[4],
                          "--backward-masks")
    assert record["status"] == "passed" and score(4, record)[0] == RUBRIC[4].points, failed(record)
    wrong = [c for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert wrong and all(words in c["message"] for c in wrong), [c["message"][:300] for c in wrong]
    if how == "no cap slope":  # the cases without a cap are right
        assert all("softcap" in c["name"] for c in wrong) and "Task 4, step 26" in wrong[0]["message"], wrong[0]
        assert any(c["passed"] for c in backward_mask_checks(record))


def test_the_backward_masks_wait_for_the_parts_they_build_on(stand_in, tmp_path):
    stand_in.student[4] = Behaviour(backward="wrong")
    record = stand_in.run(4, "--student-dir", str(student_files(tmp_path)), "--backward", "--masks",
                          "--backward-masks")
    assert not backward_mask_checks(record)
    assert any("step 26) were not checked" in n and "the backward kernels" in n for n in record["notes"]), \
        record["notes"]
