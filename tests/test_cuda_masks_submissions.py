"""Known-bad masks (task 4, steps 23-26, optional) on a GPU: the reference's float32 kernel (steps 23-24), Hopper
kernel (step 25, compute capability 9.0) and backward kernels (step 26) with one exact edit each fail their optional
part with the mistake named and its step (tests/test_known_bad_edits.py checks here, on the CPU, that each edit still
applies)."""

import pytest

from tests.conftest import REPO, bad_variant, needs_cuda, needs_solution, run_test, submission
from tests.test_cuda_hopper_submissions import hopper_submission, on_hopper
from tests.test_cuda_submissions import kernel_file

pytestmark = [needs_cuda, needs_solution(4)]

MASKS_REFERENCE = "task4/solution/kernels/attention.cu"
# (edit, what the part says): the window one key early, the documents left out of the rows' ranges, the cap twice,
# no -inf row guard
EDITS = {
    "window_one_key_wide": (("row + causal_offset - masks.window_left : 0;",
                             "row + causal_offset - masks.window_left - 1 : 0;"),
                            "it matches the window one key too wide"),
    "documents_ignored": (("      if (masks.cu_seqlens != nullptr) {\n        const int doc",
                           "      if (false) {\n        const int doc"),
                          "it matches no document mask: queries saw the keys of other documents"),
    "capped_twice": (("s[i][j] = cap * tanhf(s[i][j] * inv_cap);",
                      "s[i][j] = cap * tanhf(cap * tanhf(s[i][j] * inv_cap) * inv_cap);"),
                     "it matches the cap applied twice"),
    "no_row_guard": (("const float m_use = MASKS && m_new == -INFINITY ? 0.0f : m_new;", "const float m_use = m_new;"),
                     "output rows are NaN"),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_task4_masks_that_are_wrong_fail_their_optional_part_with_the_mistake_named(name, tmp_path):
    edit, words = EDITS[name]
    record = run_test(4, submission(tmp_path, kernel_file(4, edit)), tmp_path, "--masks")
    wrong = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert wrong and any(words in m and "Task 4, step" in m for m in wrong), [m[:300] for m in wrong]
    # the part's cases alone fail (the other instances of the file are the same machine code: b0062ce)
    assert all(c["passed"] for c in record["cases"] if c["kind"] != "optional"), record["cases"]


# Step 25's (the Hopper kernel): the window one key early, the documents left out, the cap twice, the block's tiles
# started one late (its first row's first key never loaded)
HOPPER_EDITS = {
    "window_one_key_wide": (("diagonal - p.masks.window_left : 0;", "diagonal - p.masks.window_left - 1 : 0;"),
                            "it matches the window one key too wide"),
    "documents_ignored": (("  if (p.masks.cu_seqlens != nullptr) {  // a document's",
                           "  if (false) {  // a document's"),
                          "it matches no document mask: queries saw the keys of other documents"),
    "capped_twice": (("s[i] = soft_cap(s[i], cap, inv_cap);",
                      "s[i] = soft_cap(soft_cap(s[i], cap, inv_cap), cap, inv_cap);"),
                     "it matches the cap applied twice"),
    "first_tile_late": (("b.first_tile = keys_of_row(p, b.q_start, b.seq_q, b.seq_k, b.padding, b.skip).x / COLS;",
                         "b.first_tile = keys_of_row(p, b.q_start, b.seq_q, b.seq_k, b.padding, b.skip).x / COLS + 1;"),
                        "elements differ"),
}


@on_hopper
@pytest.mark.parametrize("name", list(HOPPER_EDITS))
def test_hopper_masks_that_are_wrong_fail_their_optional_part_with_the_mistake_named(name, tmp_path):
    edit, words = HOPPER_EDITS[name]
    record = run_test(4, hopper_submission(tmp_path, edit), tmp_path, "--hopper-masks")
    wrong = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert wrong and any(words in m and "Task 4, step 25" in m for m in wrong), [m[:300] for m in wrong]
    assert all(c["passed"] for c in record["cases"] if c["kind"] != "optional"), record["cases"]


BACKWARD_REFERENCE = "task4/solution/kernels/attention_backward.cu"
# Step 26's (the backward kernels): dS not taken back through the cap, the window's last query tile left out of dK/dV
BACKWARD_EDITS = {
    "no_cap_slope": (("    slope = 1.0f - (score / cap) * (score / cap);\n", ""),
                     "it matches dS not multiplied by the cap's slope"),
    "window_queries_one_short": (("end = min(end, last_key - causal_offset + masks.window_left + 1);",
                                  "end = min(end, last_key - causal_offset + masks.window_left);"),
                                 "elements differ"),
}


@pytest.mark.parametrize("name", list(BACKWARD_EDITS))
def test_backward_masks_that_are_wrong_fail_their_optional_part_with_the_mistake_named(name, tmp_path):
    edit, words = BACKWARD_EDITS[name]
    files = {"task4/kernels/attention.cu": (REPO / MASKS_REFERENCE).read_text(),
             "task4/kernels/attention_backward.cu": bad_variant(4, "kernels/attention_backward.cu", *edit)}
    record = run_test(4, submission(tmp_path, files), tmp_path, "--backward-masks")
    wrong = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert wrong and any(words in m and "Task 4, step 26" in m for m in wrong), [m[:300] for m in wrong]
    assert all(c["passed"] for c in record["cases"] if c["kind"] != "optional"), record["cases"]
