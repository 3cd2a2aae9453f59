"""Known-bad CUDA submissions, each the reference kernel file with one edit, and their verdicts (GPU only).

Each of these used to earn full marks or be told the wrong thing: kernels that read past
an array or race on shared memory but happen to give the right answer, a kernel that
writes past its output, and kernels that are not the student's own. The guard bands,
the compute-sanitizer pass and the kernel rules each catch their share, with a message
that names the file, the line and the tensor.
"""

import pytest

from harness.sanitize import PASS_NAME, find_sanitizer
from tests.conftest import REPO, bad_variant, needs_cuda, needs_solution, run_test, submission
from tests.task1_submissions import grade, needs_bwrap

pytestmark = [needs_cuda, needs_solution(2), needs_solution(4)]
needs_sanitizer = pytest.mark.skipif(find_sanitizer() is None,
                                     reason="needs compute-sanitizer (CUDA_HOME/bin or PATH)")

NO_ROW_GUARD_2 = ("(row0 + r < m && k0 + kk < k) ? a[", "(k0 + kk < k) ? a[")
NO_SYNC_2 = ("    __syncthreads();  // everyone is done with the tiles before the next load overwrites them\n", "")
GRID_ROUNDED_DOWN_2 = ("(m + TILE_M - 1) / TILE_M", "m / TILE_M")  # the last, partial tile of rows is never run
NO_STORE_GUARD_2 = ("if (row0 + r < m && col0 + col < n) c[r * n + col]", "c[r * n + col]")
GEMM_NT = "__global__ void gemm_nt_kernel(const float* a, const float* b, float* c, int m, int n, int k) {\n"
PRINTF_2 = [("#include <cuda_runtime.h>\n", "#include <cuda_runtime.h>\n#include <cstdio>\n"),
            ("  gemm_nt_kernel<<<", '  printf("gemm_nt m %d\\n", m);\n  gemm_nt_kernel<<<'),
            (GEMM_NT, GEMM_NT + "  if (blockIdx.x + blockIdx.y + threadIdx.x + threadIdx.y == 0) "
                                'printf("in gemm_nt\\n");\n')]
CUBLAS_2 = [("#include <cuda_runtime.h>\n", "#include <cuda_runtime.h>\n#include <dlfcn.h>\n"),
            ("  gemm_nt_kernel<<<", '  void* lib = dlopen("libcublas.so.12", RTLD_NOW);\n'
                                    '  if (lib) (void)dlsym(lib, "cublasSgemmStridedBatched");\n  gemm_nt_kernel<<<')]
NO_ROW_GUARD_4 = ("    if (row >= seq_q) continue;\n", "")
NO_WAIT_FOR_V_4 = ("    __pipeline_wait_prior(0);  // this thread's copies of V landed\n"
                   "    __syncthreads();           // P and V are complete\n", "")


def kernel_file(task, *edits):
    """The reference kernel file with exact edits: a known-bad submission that stays in step with it."""
    text = (REPO / f"task{task}/solution/kernels/attention.cu").read_text()
    for old, new in edits:
        assert old in text, f"known-bad variant no longer applies: {old!r} not in task{task}'s reference kernel"
        text = text.replace(old, new, 1)
    return {f"task{task}/kernels/attention.cu": text}


def case(record, name):
    (found,) = [c for c in record["cases"] if c["name"] == name]
    return found


def value_checks(record):
    return [c for c in record["cases"] if c["kind"] == "check"]


@needs_sanitizer
@pytest.mark.parametrize("task", [2, 4])
def test_the_reference_kernels_are_memory_safe_and_race_free(task, tmp_path):
    record = run_test(task, REPO, tmp_path, "--solution", "--sanitize")
    assert case(record, PASS_NAME)["passed"], case(record, PASS_NAME)["message"]


@needs_sanitizer
@pytest.mark.parametrize("edit, words", [
    (NO_ROW_GUARD_2, ["out-of-bounds read of global memory in gemm_nt_kernel at attention.cu:",
                      "right after the end of `a`", "(README, Task 2, step 3)"]),
    (NO_SYNC_2, ["shared-memory race in gemm_nt_kernel: attention.cu:", "__syncthreads() missing"]),
], ids=["no_row_guard", "no_sync"])
def test_task2_kernels_that_match_but_are_wrong_lose_their_points(edit, words, tmp_path):
    record = run_test(2, submission(tmp_path, kernel_file(2, edit)), tmp_path, "--gemm")
    assert all(c["passed"] for c in value_checks(record)), "the values match: only the sanitizer can tell"
    verdict = case(record, PASS_NAME)
    assert verdict["kind"] == "rule" and not verdict["passed"]
    for w in words:
        assert w in verdict["message"], verdict["message"]
    assert record["status"] == "failed"


@needs_sanitizer
def test_task2_store_without_its_guard_is_told_where_it_wrote(tmp_path):
    record = run_test(2, submission(tmp_path, kernel_file(2, NO_STORE_GUARD_2)), tmp_path, "--sanitize")
    message = case(record, PASS_NAME)["message"]
    assert "out-of-bounds write of global memory in gemm_nt_kernel at attention.cu:" in message, message
    assert "right after the end of `c`" in message and "c[r * n + col]" in message, message


def test_task2_kernel_with_printf_is_graded_on_its_answers(tmp_path):
    record = run_test(2, submission(tmp_path, kernel_file(2, *PRINTF_2)), tmp_path, "--gemm")
    assert record["status"] == "passed", [c["message"] for c in record["cases"] if not c["passed"]]


def test_task2_grid_that_leaves_out_the_last_tile_is_told_which_rows(tmp_path):
    record = run_test(2, submission(tmp_path, kernel_file(2, GRID_ROUNDED_DOWN_2)), tmp_path, "--gemm")
    failed = [c["message"] for c in value_checks(record) if not c["passed"]]
    named = [m for m in failed if "never written" in m and "the last" in m and "round the number of tiles up" in m]
    assert named, failed


def test_task4_writing_past_out_is_told_so(tmp_path):
    record = run_test(4, submission(tmp_path, kernel_file(4, NO_ROW_GUARD_4)), tmp_path)
    # the layer checks allocate their own output (no bands around it): only the kernel checks can tell
    failed = [c["message"] for c in value_checks(record) if not c["passed"] and not c["name"].startswith("layer")]
    odd = [m for m in failed if not (m.startswith("wrote ") and " past the end of `out`" in m)]
    assert failed and not odd, odd


@needs_sanitizer
def test_task4_reading_v_before_it_landed_is_a_race(tmp_path):
    record = run_test(4, submission(tmp_path, kernel_file(4, NO_WAIT_FOR_V_4)), tmp_path, "--sanitize")
    message = case(record, PASS_NAME)["message"]
    assert "shared-memory race in flash_attention_kernel: an asynchronous copy (cp.async)" in message, message
    assert "__pipeline_wait_prior" in message and "attention.cu:" in message


MACRO_INCLUDE = f'#define REFERENCE "{REPO}/task4/solution/kernels/attention.cu"\n#include REFERENCE\n'


@needs_bwrap
@pytest.mark.parametrize("task, edits, words", [
    (4, None, ("solution/kernels/attention.cu: No such file", "includes")),
    (2, CUBLAS_2, ("dlopen",)),
], ids=["includes_the_reference_through_a_macro", "cublas_through_dlsym"])
def test_kernels_that_are_not_the_students_score_zero(task, edits, words, tmp_path):
    # In the sandbox the reference's path is hidden (a build error); without it the include rule refuses it.
    files = kernel_file(task, *edits) if edits else {"task4/kernels/attention.cu": MACRO_INCLUDE}
    results, md = grade(tmp_path, f"not_own_{task}", tasks=str(task), files=files)
    (test,) = results["tests"]
    assert test["score"] == 0 and test["output"].startswith("failed"), test["output"]
    assert any(w in test["output"] for w in words), test["output"]


T5_NO_BARRIER = ("  __syncthreads();\n", "")  # between the groups writing their state and reading the others'
T5_WRITE_PAST = ("i < total;", "i <= total;")  # one element more than the new rows
T5_READ_PAST_LENGTH = [("const bool ok = row < end && 4 * g < head_dim;",  # loads row `end` too, where it lies
                        "const bool ok = row <= end && 4 * g < head_dim;"),
                       ("const size_t at = row < end ? rows.offset(row) : 0;", "const size_t at = rows.offset(row);")]

T5_PAGED_WITHOUT_TABLE = ("const int page = table[row >> page_shift], within", "const int page = row >> page_shift, within")


def task5_kernel(*edits):
    text = (REPO / "task5/solution/kernels/decode.cu").read_text()
    for old, new in edits:
        assert old in text, f"known-bad variant no longer applies: {old!r} not in task 5's reference kernel"
        text = text.replace(old, new, 1)
    return {"task5/kernels/decode.cu": text}


@needs_solution(5)
@needs_sanitizer
@pytest.mark.parametrize("edit, words", [
    (T5_NO_BARRIER, ["shared-memory race in attend_rows: decode.cu:", "__syncthreads() missing",
                     "(README, Task 5, step 2)"]),
    # the first element past the new rows belongs to sequence `batch`: its pos is read past the end first
    # first_position is the device library's (device/decode.cuh): the message quotes it and the student's call
    (T5_WRITE_PAST, ["out-of-bounds read of global memory in first_position at decode.cuh:", "`const int p = pos[b];`",
                     "called from update_cache_kernel at decode.cu:", "first_position(pos,", "(README, Task 5, step 1)"]),
], ids=["no_barrier_before_the_merge", "update_writes_past_the_new_rows"])
def test_task5_kernels_with_undefined_behaviour_fail_the_sanitizer(edit, words, tmp_path):
    record = run_test(5, submission(tmp_path, task5_kernel(edit)), tmp_path, "--sanitize")
    message = case(record, PASS_NAME)["message"]
    for w in words:
        assert w in message, message


@needs_solution(5)
def test_task5_decode_reading_past_length_is_told_so(tmp_path):
    record = run_test(5, submission(tmp_path, task5_kernel(*T5_READ_PAST_LENGTH)), tmp_path, "--decode")
    failed = [c["message"] for c in value_checks(record) if not c["passed"]]
    # the cache holds NaN past `length` (and a guard band past a full one): every failure is a NaN
    assert any("reads past `length`" in m and "Task 5, step 2." in m for m in failed), failed
    assert all("NaN" in m for m in failed), failed


# -- the optional bf16/fp16 kernel (task4/kernels/attention_half.cu, steps 8-11) ----------------------------

HALF_REFERENCE = "task4/solution/kernels/attention_half.cu"
H4_O_NOT_RESCALED = ("          o[mt][d][0] *= alpha[0];\n          o[mt][d][1] *= alpha[0];\n"
                     "          o[mt][d][2] *= alpha[1];\n          o[mt][d][3] *= alpha[1];\n", "")
H4_DIAGONAL_MASKED = ("(causal && key > diagonal + mt * 16 + (e / 2) * 8)",
                      "(causal && key >= diagonal + mt * 16 + (e / 2) * 8)")
H4_ONE_TILE_SHORT = ("ceil_div(last_key, COLS) : 0;", "ceil_div(last_key, COLS) - 1 : 0;")
H4_V_WITHOUT_TRANS = ("ldmatrix_x4_trans(b, v_rows", "ldmatrix_x4(b, v_rows")
H4_NO_ROW_GUARD = ("      if (row >= seq_q) continue;\n      const float inv", "      const float inv")


def half_submission(tmp_path, *edits):
    """Task 4's two files: the reference's float32 kernel (right) and its bf16/fp16 kernel with exact edits."""
    return submission(tmp_path, {"task4/kernels/attention.cu": (REPO / "task4/solution/kernels/attention.cu").read_text(),
                                 "task4/kernels/attention_half.cu": bad_variant(4, "kernels/attention_half.cu", *edits[0],
                                                                                *edits[1:])})


@needs_solution(4)
@pytest.mark.parametrize("edit, words", [
    (H4_O_NOT_RESCALED, "looks like acc not rescaled by exp(m_old - m_new) when the maximum grows: see README, Task 4, "
                        "step 10."),
    (H4_DIAGONAL_MASKED, "looks like a causal mask that hides each query's own key too (triu's diagonal one too low; "
                         "in a kernel, col >= row + offset where col > row + offset is meant): see README, Task 4, "
                         "step 10."),
    (H4_ONE_TILE_SHORT, "elements differ"),
    (H4_V_WITHOUT_TRANS, "elements differ"),
    (H4_NO_ROW_GUARD, "past the end of `out`"),
], ids=["o_not_rescaled", "diagonal_masked", "one_tile_short", "v_without_trans", "no_row_guard"])
def test_task4_half_kernels_that_are_wrong_fail_their_optional_part(edit, words, tmp_path):
    record = run_test(4, half_submission(tmp_path, edit), tmp_path, "--half")
    half = [c for c in record["cases"] if c["kind"] == "optional"]
    wrong = [c["message"] for c in half if not c["passed"]]
    assert half and any(words in m for m in wrong), wrong[:3] or "every case passed"


@needs_solution(4)
def test_task4_half_file_that_does_not_compile_is_left_out_and_its_part_says_why(tmp_path):
    files = {"task4/kernels/attention.cu": (REPO / "task4/solution/kernels/attention.cu").read_text(),
             "task4/kernels/attention_half.cu": "#include <cuda_runtime.h>\n__global__ void k() { int x = ; }\n"}
    record = run_test(4, submission(tmp_path, files), tmp_path, "--half")
    assert not [c for c in record["cases"] if c["name"] == "build"], "the float32 file built: task 4 is not lost"
    half = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert half and "attention_half.cu was left out of the build" in half[0] and "error" in half[0], half[:2]


# -- the optional backward part (task4/kernels/attention_backward.cu, steps 12-16) --------------------------

BACKWARD_REFERENCE = "task4/solution/kernels/attention_backward.cu"
B4_NO_DELTA = ("ds_tile[at] = st[i][j] * slope[i][j] * (dpt[i][j] - delta_tile[tx + j * COL_THREADS]);",
               "ds_tile[at] = st[i][j] * slope[i][j] * dpt[i][j];")  # dS = P dP: D left out of dK
B4_DS_WITHOUT_P = ("ds_tile[at] = st[i][j] * slope[i][j] * (dpt[i][j] - delta_tile[tx + j * COL_THREADS]);",
                   "ds_tile[at] = slope[i][j] * (dpt[i][j] - delta_tile[tx + j * COL_THREADS]);")  # dS = dP - D in dK
B4_DK_UNSCALED = ("store_rows<D>(dk, dk_acc, scale, kv_start", "store_rows<D>(dk, dk_acc, 1.0f, kv_start")
B4_DQ_UNSCALED = ("store_rows<D>(dq, dq_acc, scale, q_start", "store_rows<D>(dq, dq_acc, 1.0f, q_start")
B4_ONE_HEAD_OF_THE_GROUP = ("  for (int g = 0; g < group; ++g) {", "  for (int g = 0; g < 1; ++g) {")
B4_CAUSAL_START_LATE = ("max(0, kv_start - causal_offset) / BLOCK_COLS * BLOCK_COLS",
                        "(max(0, kv_start - causal_offset) / BLOCK_COLS + 1) * BLOCK_COLS")  # a tile of queries skipped
B4_DQ_TAIL_UNMASKED = ("    const bool needs_mask = kv_start + BLOCK_COLS > seq_k ||\n                            (causal",
                       "    const bool needs_mask = (causal")  # keys past seq_k weigh in dQ
# the next query tile's copies land while other warps still read this one's Q and dO
B4_NO_BARRIER = ("      __syncthreads();  // everyone is done with Q, dO, P^T and dS^T before the next tile overwrites them\n",
                 "")
B4_LSE_NOT_WRITTEN = ("      if (tx == 0 && row < seq_q) lse[row] = (m_i[i] + log2f(l)) * LN2;",
                      "      if (tx == 0 && row < seq_q) lse[row] = m_i[i] * LN2;")  # L without the sum


def backward_submission(tmp_path, *edits, forward_edits=()):
    """Task 4's float32 kernel (with step 12) and its backward kernels, the reference's with exact edits."""
    files = {}
    for rel, reference, changes in (("task4/kernels/attention.cu", "task4/solution/kernels/attention.cu",
                                     forward_edits), ("task4/kernels/attention_backward.cu", BACKWARD_REFERENCE, edits)):
        text = (REPO / reference).read_text()
        for old, new in changes:
            assert old in text, f"known-bad variant no longer applies: {old!r} not in {reference}"
            text = text.replace(old, new, 1)
        files[rel] = text
    return submission(tmp_path, files)


@needs_solution(4)
@pytest.mark.parametrize("edits, forward_edits, words", [
    ((B4_NO_DELTA,), (), "looks like dS without D (dS = P dP: the D = rowsum(dO * O) term left out of dK): see "
                         "README, Task 4, step 15."),
    ((B4_CAUSAL_START_LATE,), (), "looks like dK with the causal skip a query tile late (the first tile that sees a "
                                  "block's keys skipped): see README, Task 4, step 14."),
    ((B4_DS_WITHOUT_P,), (), "looks like dS without P (dS = dP - D where P (dP - D) is meant) in dK: see README, "
                             "Task 4, step 15."),
    ((B4_DK_UNSCALED,), (), "looks like dK without its scale (write scale * dK at the end): see README, Task 4, "
                            "step 15."),
    ((B4_DQ_UNSCALED,), (), "looks like dQ without its scale (write scale * dQ at the end): see README, Task 4, "
                            "step 16."),
    ((B4_ONE_HEAD_OF_THE_GROUP,), (), "looks like dK of one query head of each group alone: the heads that share a "
                                      "key/value head not summed: see README, Task 4, step 14."),
    ((B4_DQ_TAIL_UNMASKED,), (), "(README, Task 4, steps 13 and 16)"),
    ((), (B4_LSE_NOT_WRITTEN,), "forward_lse's lse"),
], ids=["d_left_out", "causal_start_a_tile_late", "ds_without_p", "dk_unscaled", "dq_unscaled", "one_head_of_the_group",
        "dq_tail_unmasked", "lse_without_the_sum"])
def test_task4_backward_kernels_that_are_wrong_fail_their_optional_part(edits, forward_edits, words, tmp_path):
    record = run_test(4, backward_submission(tmp_path, *edits, forward_edits=forward_edits), tmp_path, "--backward")
    part = [c for c in record["cases"] if c["kind"] == "optional"]
    wrong = [c["message"] for c in part if not c["passed"]]
    assert part and any(words in m for m in wrong), wrong[:3] or "every case passed"
    assert not [c for c in record["cases"] if c["kind"] == "check" and not c["passed"]]


@needs_solution(4)
def test_task4_backward_without_a_barrier_fails_the_sanitizer(tmp_path):
    record = run_test(4, backward_submission(tmp_path, B4_NO_BARRIER), tmp_path, "--backward", "--sanitize")
    message = case(record, f"{PASS_NAME}, the backward kernels (optional)")["message"]
    assert "race" in message and "attention_backward.cu" in message, message


@needs_solution(4)
def test_task4_backward_file_that_does_not_compile_is_left_out_and_its_part_says_why(tmp_path):
    files = {"task4/kernels/attention.cu": (REPO / "task4/solution/kernels/attention.cu").read_text(),
             "task4/kernels/attention_backward.cu": "#include <cuda_runtime.h>\n__global__ void k() { int x = ; }\n"}
    record = run_test(4, submission(tmp_path, files), tmp_path, "--backward")
    assert not [c for c in record["cases"] if c["name"] == "build"], "the float32 file built: task 4 is not lost"
    said = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert said and "attention_backward.cu was left out of the build" in said[0] and "error" in said[0], said[:2]


# -- the optional bf16/fp16 cache (task5/kernels/decode_half.cu, step 6) ------------------------------------

HALF5_REFERENCE = "task5/solution/kernels/decode_half.cu"
H5_V_READ_AS_K = ("Half<T>::unpack8(v_raw[u], value);", "Half<T>::unpack8(k_raw[u], value);")
H5_ROWS_PAST_THE_END_SCORED = ("      const bool valid = round + u * GROUPS + grp < end;\n",
                               "      const bool valid = true;\n")  # zeros past the end, scored 0: weight they lack
H5_UPDATE_ONE_ROW_LATE = ("const size_t dst = (bh * max_seq + p) * head_dim + within;",
                          "const size_t dst = (bh * max_seq + p + 1) * head_dim + within;")


@needs_solution(5)
@pytest.mark.parametrize("edit, words", [
    (H5_V_READ_AS_K, "elements differ"),
    (H5_ROWS_PAST_THE_END_SCORED, "elements differ"),
    (H5_UPDATE_ONE_ROW_LATE, "landed 1 row past pos"),
], ids=["v_read_as_k", "rows_past_the_end_scored", "update_one_row_late"])
def test_task5_half_kernels_that_are_wrong_fail_their_optional_part(edit, words, tmp_path):
    text = (REPO / HALF5_REFERENCE).read_text()
    assert edit[0] in text, f"known-bad variant no longer applies: {edit[0]!r} not in {HALF5_REFERENCE}"
    files = {"task5/kernels/decode.cu": (REPO / "task5/solution/kernels/decode.cu").read_text(),
             "task5/kernels/decode_half.cu": text.replace(edit[0], edit[1], 1)}
    record = run_test(5, submission(tmp_path, files), tmp_path, "--half")
    half = [c for c in record["cases"] if c["kind"] == "optional"]
    wrong = [c["message"] for c in half if not c["passed"]]
    assert half and any(words in m for m in wrong), wrong[:3] or "every case passed"


# -- mistakes that give wrong answers: each is named, with its README step, in the first lines -------------

DIAGNOSED = {  # id: (task, edits, flags, what the diagnosis says, its step)
    "task4_diagonal_masked": (4, [("(causal && col > row + causal_offset)", "(causal && col >= row + causal_offset)")],
                              [], "a causal mask that hides each query's own key too", 3),
    "task4_acc_not_rescaled": (4, [("scale_vec(acc[i][c], alpha);", "(void)acc[i][c];")], [], "acc not rescaled", 4),
    "task4_tail_masked_only_when_causal": (4, [("(col >= seq_k || (causal && col > row + causal_offset))",
                                                "(causal && (col >= seq_k || col > row + causal_offset))")], [],
                                           "the keys past seq_k in the last, partial tile not masked", 3),
    "task4_scores_not_scaled": (4, [("        s[i][j] *= scale_log2;\n", "")], [],
                                "exp2f() over scores that were never scaled", 3),
    "task5_l_not_rescaled": (5, [("      l[i] *= alpha;\n", "")], ["--decode"], "l_i not rescaled", 2),
    "task5_decode_one_short": (5, [("b.begin, b.end, scale_log2)", "b.begin, b.end - 1, scale_log2)")],
                               ["--decode"], "a decode over one position too few", 2),
    "task5_splits_without_weights": (5, [("weight[s] = exp2f(weight[s] - big);", "weight[s] = 1.0f; (void)big;")],
                                     ["--split"], "split-KV partial outputs averaged without their log-sum-exp", 3),
    "task5_update_one_row_off": (5, [("(bh * max_seq + p) * head_dim", "(bh * max_seq + p + 1) * head_dim")],
                                 ["--cache"], "the new rows written at other rows than pos", 1),
    "task2_softmax_without_the_max": (2, [("expf(x[j] - row_max);", "expf(x[j]);"),
                                          ("expf(x[j] - row_max) * inv_sum", "expf(x[j]) * inv_sum")],
                                      ["--softmax"], "exp(x) without the row's maximum subtracted", 2),
    "task2_no_scale_and_mask": (2, [("  err = scale_and_mask(scores, batch_heads, seq_q, seq_k, scale, causal, stream);\n"
                                     "  if (err != cudaSuccess) return err;\n", "  (void)scale;\n")],
                                ["--attention"], "neither scaled nor masked", 5),
}


def run_printing(task, student_dir, tmp_path, *extra):
    """taskN.test on a checkout: (the record, the lines it printed)."""
    import json
    import subprocess
    import sys

    record = tmp_path / "record.json"
    proc = subprocess.run([sys.executable, "-m", f"task{task}.test", "--student-dir", str(student_dir), "--scratch",
                           str(tmp_path / "scratch"), "--json", str(record), *extra], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert record.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(record.read_text()), proc.stdout.splitlines()


@needs_solution(5)
@pytest.mark.parametrize("name", list(DIAGNOSED))
def test_a_kernel_mistake_is_named_with_its_step_in_the_first_lines(name, tmp_path):
    task, edits, flags, says, step = DIAGNOSED[name]
    files = task5_kernel(*edits) if task == 5 else kernel_file(task, *edits)
    record, lines = run_printing(task, submission(tmp_path, files), tmp_path, *flags)
    failed = [c["message"] for c in record["cases"] if c["kind"] in ("check", "optional") and not c["passed"]]
    named = [m for m in failed if says in m and f"see README, Task {task}, step {step}." in m]
    assert named, failed
    if task in (4, 5):  # every scored case it shows in says it: grouped, padded and per-sequence ones too
        scored = [c["message"] for c in record["cases"] if c["kind"] == "check" and not c["passed"]]
        assert all(says in m or "fix that first." in m for m in scored), [m[:160] for m in scored if says not in m]
    assert record["status"] == "failed" or flags == ["--split"]  # the optional part does not decide it
    first = "\n".join(lines[:5])  # the test's own first lines: the title, the part, then the failures
    assert says in first and f"see README, Task {task}, step {step}." in first, "\n".join(lines[:30])
    print("\n".join(lines[:5]))  # the closing note quotes them


@needs_solution(6)
def test_task6_a_step_that_passes_the_python_length_is_told_so_by_the_graph(tmp_path):
    """cache.length (a Python int) where the kernels need cache.lengths: right launched from Python, wrong (or
    not capturable, where the int form reads key_start back) replayed from a CUDA graph. Step 5 is optional: the
    graph's cases fail with the reason, the score holds."""
    text = bad_variant(6, "attention.py", "cache.k, cache.v, cache.lengths)", "cache.k, cache.v, cache.length)")
    text = text.replace("cache.lengths + 1, cache.key_start)", "cache.length + 1, cache.key_start)")
    files = {"task6/attention.py": text, **task5_kernel(),
             "task4/kernels/attention.cu": (REPO / "task4/solution/kernels/attention.cu").read_text()}
    record = run_test(6, submission(tmp_path, files), tmp_path, "--size", "small")
    graph = [c for c in record["cases"] if c["name"].startswith("graph:")]
    assert graph and not any(c["passed"] for c in graph), graph
    for c in graph:
        assert ("not the Python int cache.length" in c["message"] or "could not be captured" in c["message"]), c
    assert record["status"] == "passed", [c["message"] for c in record["cases"] if not c["passed"]]
    generation = next(c for c in record["cases"] if c["kind"] == "benchmark")
    assert "with the graph is wrong" in generation["message"] or "could not be captured" in generation["message"]


@needs_solution(5)
def test_task5_a_paged_decode_that_skips_the_block_table_is_told_so(tmp_path):
    """Step 5's page lookup taken as the logical page number: the rows come from other sequences' pages (or the
    NaN around them), so the paged decode differs from the contiguous one on the same rows, and says where."""
    record = run_test(5, submission(tmp_path, task5_kernel(T5_PAGED_WITHOUT_TABLE)), tmp_path, "--paged")
    failed = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert failed and all("block_table[b, p / page_size]" in m for m in failed), failed
    assert any("differs from the contiguous one on the same rows" in m for m in failed), failed


# Every edit above, by the reference file it changes: tests/test_known_bad_edits.py checks on the CPU that each
# still applies, so a rename in a reference is caught by CI, not by the next GPU run.
EDITS_BY_REFERENCE = {
    "task2/solution/kernels/attention.cu": [NO_ROW_GUARD_2, NO_SYNC_2, NO_STORE_GUARD_2, GRID_ROUNDED_DOWN_2,
                                            *PRINTF_2, *CUBLAS_2],
    "task4/solution/kernels/attention.cu": [NO_ROW_GUARD_4, NO_WAIT_FOR_V_4, B4_LSE_NOT_WRITTEN],
    "task5/solution/kernels/decode.cu": [T5_NO_BARRIER, T5_WRITE_PAST, *T5_READ_PAST_LENGTH, T5_PAGED_WITHOUT_TABLE],
    HALF_REFERENCE: [H4_O_NOT_RESCALED, H4_DIAGONAL_MASKED, H4_ONE_TILE_SHORT, H4_V_WITHOUT_TRANS, H4_NO_ROW_GUARD],
    BACKWARD_REFERENCE: [B4_NO_DELTA, B4_CAUSAL_START_LATE, B4_DQ_TAIL_UNMASKED, B4_NO_BARRIER, B4_DS_WITHOUT_P,
                         B4_DK_UNSCALED, B4_DQ_UNSCALED, B4_ONE_HEAD_OF_THE_GROUP],
    HALF5_REFERENCE: [H5_V_READ_AS_K, H5_ROWS_PAST_THE_END_SCORED, H5_UPDATE_ONE_ROW_LATE],
}
