"""Known-bad submissions of task 4's 16-bit backward part (steps 27-30), each the reference's files with one edit, and
their verdicts (GPU only): the common mistakes named with the 16-bit part's step, the rest failing where they show,
a missing barrier caught by the sanitizer, and nothing of the float32 part's points lost."""

import pytest

from harness.sanitize import PASS_NAME, find_sanitizer
from tests.conftest import REPO, needs_cuda, needs_solution, run_test, submission

pytestmark = [needs_cuda, needs_solution(4)]

HALF_BACKWARD_REFERENCE = "task4/solution/kernels/attention_backward_half.cu"
NO_D = ("        dp[n][e] = pt * (dp[n][e] - delta[query]);", "        dp[n][e] = pt * dp[n][e];")  # dS = P dP
DS_WITHOUT_P = ("        dp[n][e] = pt * (dp[n][e] - delta[query]);",
                "        dp[n][e] = dp[n][e] - delta[query];")  # dS = dP - D
DK_UNSCALED = ("Half<T>::pack(dk[d][2 * r] * p.scale, dk[d][2 * r + 1] * p.scale)",
               "Half<T>::pack(dk[d][2 * r], dk[d][2 * r + 1])")
DQ_UNSCALED = ("dq[i] = Half<T>::from_float(dq_accum[i] * scale);", "dq[i] = Half<T>::from_float(dq_accum[i]);")
ONE_HEAD_OF_THE_GROUP = ("  const int tiles = group * tiles_per_head;", "  const int tiles = tiles_per_head;")
# plain stores where the key blocks' shares of dQ must add up: each block overwrites the others'
DQ_STORED = ("          if (col < head_dim) add_pair(dq_rows + (size_t)row * head_dim + col, dq[d][2 * r], dq[d][2 * r + 1]);",
             "          if (col < head_dim) dq_rows[(size_t)row * head_dim + col] = dq[d][2 * r],\n"
             "                              dq_rows[(size_t)row * head_dim + col + 1] = dq[d][2 * r + 1];")
TAIL_UNMASKED = ("    const bool masked = n0 + KEYS > seq_k || (p.causal", "    const bool masked = (p.causal")
NO_BARRIER = ("    __syncthreads();  // dS^T complete: every warp's rows\n", "")  # dQ reads rows other warps write
LSE_WITHOUT_THE_SUM = ("(row_max[mt][r] + log2f(sum)) * LN2", "row_max[mt][r] * LN2")  # step 27, attention_half.cu
# each edit of the backward file, for tests/test_known_bad_edits.py (CI sees one that no longer applies)
HALF_BACKWARD_EDITS = [NO_D, DS_WITHOUT_P, DK_UNSCALED, DQ_UNSCALED, ONE_HEAD_OF_THE_GROUP, DQ_STORED, TAIL_UNMASKED,
                       NO_BARRIER]


def half_backward_submission(tmp_path, *edits, forward_edits=()):
    """Task 4's float32 kernel, its 16-bit kernel (with step 27) and its 16-bit backward kernels: the reference's,
    with exact edits."""
    files = {"task4/kernels/attention.cu": (REPO / "task4/solution/kernels/attention.cu").read_text()}
    for rel, changes in (("task4/kernels/attention_half.cu", forward_edits),
                         ("task4/kernels/attention_backward_half.cu", edits)):
        reference = rel.replace("kernels/", "solution/kernels/")
        text = (REPO / reference).read_text()
        for old, new in changes:
            assert old in text, f"known-bad variant no longer applies: {old!r} not in {reference}"
            text = text.replace(old, new, 1)
        files[rel] = text
    return submission(tmp_path, files)


@pytest.mark.parametrize("edits, forward_edits, words", [
    ((NO_D,), (), "looks like dS without D (dS = P dP: the D = rowsum(dO * O) term left out of dQ"),
    ((DS_WITHOUT_P,), (), "looks like dS without P (dS = dP - D where P (dP - D) is meant) in dQ: see README, Task 4, "
                          "step 30."),
    ((DK_UNSCALED,), (), "looks like dK without its scale (write scale * dK at the end): see README, Task 4, step 29."),
    ((DQ_UNSCALED,), (), "looks like dQ without its scale (write scale * dQ at the end): see README, Task 4, step 30."),
    ((ONE_HEAD_OF_THE_GROUP,), (), "looks like dQ of one query head of each group alone: the key blocks do not walk "
                                   "the group's other heads: see README, Task 4, step 28."),
    ((DQ_STORED,), (), "(README, Task 4, steps 28 and 30)"),
    ((TAIL_UNMASKED,), (), "(README, Task 4, steps 28"),
    ((), (LSE_WITHOUT_THE_SUM,), "forward_lse's lse"),
], ids=["d_left_out", "ds_without_p", "dk_unscaled", "dq_unscaled", "one_head_of_the_group", "dq_stored_not_added",
        "tail_unmasked", "lse_without_the_sum"])
def test_task4_16_bit_backward_kernels_that_are_wrong_fail_their_optional_part(edits, forward_edits, words, tmp_path):
    record = run_test(4, half_backward_submission(tmp_path, *edits, forward_edits=forward_edits), tmp_path,
                      "--backward-half")
    part = [c for c in record["cases"] if c["kind"] == "optional"]
    wrong = [c["message"] for c in part if not c["passed"]]
    assert part and any(words in m for m in wrong), wrong[:3] or "every case passed"
    assert not [c for c in record["cases"] if c["kind"] == "check" and not c["passed"]]


@pytest.mark.skipif(find_sanitizer() is None, reason="needs compute-sanitizer (CUDA_HOME/bin or PATH)")
def test_task4_16_bit_backward_without_a_barrier_fails_the_sanitizer(tmp_path):
    record = run_test(4, half_backward_submission(tmp_path, NO_BARRIER), tmp_path, "--backward-half", "--sanitize")
    message = next(c for c in record["cases"]
                   if c["name"] == f"{PASS_NAME}, the 16-bit backward kernels (optional)")["message"]
    assert "race" in message and "attention_backward_half.cu" in message, message
