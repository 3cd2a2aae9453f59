"""Known-bad Hopper kernels (task 4, steps 17-22) on a GPU of compute capability 9.0: each fails its optional part
with the words that say why, and none of them costs the float32 part anything. The reference with exact edits, as
tests/test_cuda_submissions.py does for the other parts (tests/test_known_bad_edits.py checks here, on the CPU, that
each edit still applies)."""

import pytest
import torch

from tests.conftest import REPO, bad_variant, needs_cuda, needs_solution, run_test, submission

HOPPER_REFERENCE = "task4/solution/kernels/attention_hopper.cu"
on_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                               reason="needs a GPU of compute capability 9.0 (H100, H200): the part runs there alone")
pytestmark = [needs_cuda, on_hopper, needs_solution(4)]

# the consumers never give a stage back: the producer waits for it forever, and the consumers for the tile after
P4_STAGE_NEVER_EMPTIED = ("      mbarrier_arrive(&empty[before]);\n", "")
# the same in steps 18-20's loop (steps 21 and 22 turned off)
P4_NO_PINGPONG = ("constexpr int PINGPONG = 1;", "constexpr int PINGPONG = 0;")
P4_NO_OVERLAP = ("constexpr int OVERLAP = 1;", "constexpr int OVERLAP = 0;")
P4_STAGE_NEVER_EMPTIED_NO_OVERLAP = ("      mbarrier_arrive(&empty[stage]);\n", "")
# V read with the default panel distance: head_dim 128's second 64 columns come from the wrong place
P4_V_PANELS_WRONG = ("swizzled_tile(v_tile + t * 16 * ROW_BYTES, N * ROW_BYTES)",
                     "swizzled_tile(v_tile + t * 16 * ROW_BYTES)")
# V's copies never announced: its barrier never gets the producer's arrival, and the consumers wait for it forever
P4_V_NEVER_ANNOUNCED = ("      mbarrier_expect_bytes(&v_full[stage], L::KV_TILE);\n", "")
# K's boxes all copied from the tile's first 64 rows (step 17's box loop without its row offset): keys 64 .. of every
# tile score as keys 0-63 (three boxes a tile up to head_dim 64, two above)
P4_K_BOXES_SAME_ROWS = ("panel * HOPPER_BOX_COLS, key + box * HOPPER_KV_BOX_ROWS, kv_bh, &k_full[stage]);",
                        "panel * HOPPER_BOX_COLS, key, kv_bh, &k_full[stage]);")
# the mask keeps only the causal part: keys past seq_k (TMA's zero rows, scores of 0, not -inf) weigh in
P4_TAIL_UNMASKED = ("if (key >= seq_k || (CAUSAL && key > r + causal_offset))", "if (CAUSAL && key > r + causal_offset)")
# step 21 without the product after its loop: the last tile's P V never reaches O
P4_LAST_TILE_DROPPED = ("    issue_pv<T, D, COLS>(o, pa, v_tiles + last * L::KV_TILE);\n", "")
# step 22 without consumer 1's first arrival: each consumer waits for the other's turn to end, forever (a named
# barrier does not trap: the case runs into its minute)
P4_TURNS_NEVER_STARTED = ("  if (PINGPONG && consumer == 1) named_barrier_arrive(1, 2 * WARPGROUP);\n", "")

EDITS = [P4_STAGE_NEVER_EMPTIED, P4_NO_PINGPONG, P4_NO_OVERLAP, P4_STAGE_NEVER_EMPTIED_NO_OVERLAP, P4_V_PANELS_WRONG,
         P4_V_NEVER_ANNOUNCED, P4_K_BOXES_SAME_ROWS, P4_TAIL_UNMASKED, P4_LAST_TILE_DROPPED, P4_TURNS_NEVER_STARTED]


def hopper_submission(tmp_path, *edits):
    """Task 4's float32 kernel (the reference's: right) and the Hopper kernel with exact edits."""
    return submission(tmp_path, {"task4/kernels/attention.cu": (REPO / "task4/solution/kernels/attention.cu").read_text(),
                                 "task4/kernels/attention_hopper.cu": bad_variant(4, "kernels/attention_hopper.cu",
                                                                                  *edits[0], *edits[1:])})


@pytest.mark.parametrize("edits, words", [
    ([P4_STAGE_NEVER_EMPTIED], "an mbarrier wait that never completed"),
    ([P4_NO_PINGPONG, P4_NO_OVERLAP, P4_STAGE_NEVER_EMPTIED_NO_OVERLAP], "an mbarrier wait that never completed"),
    ([P4_V_PANELS_WRONG], "elements differ"),
    ([P4_V_NEVER_ANNOUNCED], "an mbarrier wait that never completed"),
    ([P4_K_BOXES_SAME_ROWS], "elements differ"),
    ([P4_TAIL_UNMASKED], "see README, Task 4, step 19."),
    ([P4_LAST_TILE_DROPPED], "elements differ"),
    ([P4_TURNS_NEVER_STARTED], "did not answer within"),
], ids=["stage_never_emptied", "stage_never_emptied_no_overlap", "v_panels_wrong", "v_never_announced",
        "k_boxes_same_rows", "tail_unmasked", "last_tile_dropped", "turns_never_started"])
def test_hopper_kernels_that_are_wrong_fail_their_optional_part(edits, words, tmp_path):
    record = run_test(4, hopper_submission(tmp_path, *edits), tmp_path, "--hopper")
    hopper = [c for c in record["cases"] if c["kind"] == "optional"]
    wrong = [c["message"] for c in hopper if not c["passed"]]
    assert hopper and wrong, "every case passed"
    assert any(words in m for m in wrong), wrong[:3]
    if P4_TURNS_NEVER_STARTED in edits:
        assert any("step 22" in n for n in record["notes"]), record["notes"]
    assert record["status"] == "passed"  # the optional part decides nothing


def test_a_hopper_file_that_does_not_compile_is_left_out_and_its_part_says_why(tmp_path):
    files = {"task4/kernels/attention.cu": (REPO / "task4/solution/kernels/attention.cu").read_text(),
             "task4/kernels/attention_hopper.cu": "// nvcc target: sm_90a\n__global__ void k() { int x = ; }\n"}
    record = run_test(4, submission(tmp_path, files), tmp_path, "--hopper")
    failed = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert failed and "attention_hopper.cu was left out of the build" in failed[0] and "error" in failed[0], failed[:2]


def test_steps_8_to_11s_kernel_under_the_hopper_name_gets_the_numbers_and_fails_the_part(tmp_path):
    """Right numbers from mma.sync: every case passes, and the machine code says wgmma and TMA are missing."""
    from common.machine_code import tools_missing
    from tests.test_machine_code import BORROWED_HOPPER

    if tools_missing():
        pytest.skip(tools_missing())
    reference = REPO / "task4/solution/kernels"
    files = {"task4/kernels/attention.cu": (reference / "attention.cu").read_text(),
             "task4/kernels/attention_half.cu": (reference / "attention_half.cu").read_text(),
             "task4/kernels/attention_hopper.cu": BORROWED_HOPPER}
    record = run_test(4, submission(tmp_path, files), tmp_path, "--hopper")
    hopper = [c for c in record["cases"] if c["kind"] == "optional"]
    wrong = [c for c in hopper if not c["passed"]]
    assert len(wrong) == 1 and wrong[0]["name"].startswith("the Hopper kernel computes with wgmma"), (
        wrong[:3], record["notes"])
    assert "steps 17-18" in wrong[0]["message"], wrong[0]
    assert record["status"] == "passed"
