"""Task 3's optional masks beyond causal (steps 9-12) and the checks' defences, through the task's test: each
known-bad version is named with its step, and never costs the task."""

import pytest

from tests.conftest import REPO, bad_variant, needs_solution, run_test, submission
from tests.test_task3 import REPO_SOLUTION, case

pytestmark = needs_solution(3)


# -- the optional masks beyond causal (steps 9-12): each known-bad version is named with its step, never costs the task --

def masks_record(tmp_path, *edits, backward=False, hidden=False):
    text = (REPO_SOLUTION / "attention.py").read_text()
    for old, new in edits:
        assert old in text, f"known-bad variant no longer applies: {old!r} not in task3/solution/attention.py"
        text = text.replace(old, new, 1)
    tmp_path.mkdir(parents=True, exist_ok=True)
    record = run_test(3, submission(tmp_path, {"task3/attention.py": text}), tmp_path, "--masks",
                      *(["--backward"] if backward else []), *(["--hidden", str(REPO / "grader/hidden.py")] * hidden))
    assert record["status"] == "passed", "an optional part never decides the task"
    return record


def said(record, words):
    return next(c for c in record["cases"] if c["kind"] == "optional" and words in c["name"])


def skeleton_of_steps(steps) -> str:
    """The reference with only the regions of `steps` turned into the skeleton's TODOs (a student who wrote the rest)."""
    import re

    from harness.skeleton import make_skeleton

    kept, inside = [], None
    for line in (REPO_SOLUTION / "attention.py").read_text().splitlines(keepends=True):
        begin = re.match(r'\s*# BEGIN SOLUTION "step (\d+)', line)
        if begin:
            inside = int(begin[1]) in steps
            skipping = False
        if inside is False:  # a written step: its solution lines, without the markers or the skeleton's
            if begin:
                continue
            if line.strip() == "# SKELETON":
                skipping = True
                continue
            if line.strip() == "# END SOLUTION":
                inside = None
                continue
            if not skipping:
                kept.append(line)
            continue
        if inside and line.strip() == "# END SOLUTION":
            kept.append(line)
            inside = None
            continue
        kept.append(line)
    return make_skeleton("".join(kept), 3, "#")


def test_the_skeletons_masks_say_step_9_and_the_task_still_passes(tmp_path):
    text = skeleton_of_steps({9, 10, 11, 12})
    assert "step 9" in text and "step 3: scores" not in text
    record = run_test(3, submission(tmp_path, {"task3/attention.py": text}), tmp_path, "--masks")
    assert record["status"] == "passed"
    failed = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert len(failed) == 1 and "not implemented yet: see README, Task 3, step 9" in failed[0], failed


def test_the_window_off_by_one_a_document_boundary_crossed_and_the_cap_twice_are_named(tmp_path):
    record = masks_record(
        tmp_path,
        ("s = s.masked_fill(cols < rows + offset - window_left, -math.inf)",
         "s = s.masked_fill(cols <= rows + offset - window_left, -math.inf)"),
        # cu_seqlens read as each document's last position, not the next one's first: every boundary one key late
        ("    doc_ids = None if documents is None else document_ids(documents, q.device)  # each position's document",
         "    if documents is not None:\n"
         "        documents = [0] + [c + 1 for c in documents[1:-1]] + [documents[-1]]\n"
         "    doc_ids = None if documents is None else document_ids(documents, q.device)"),
        ("s_ij = cap_scores((q_i @ k_j.transpose(-2, -1)) * scale, softcap)  # (B, H, Br, Bc)",
         "s_ij = cap_scores(cap_scores((q_i @ k_j.transpose(-2, -1)) * scale, softcap), softcap)"))
    window = said(record, "seq 129x129 head_dim 32 tiles 32x16 causal window 40")
    assert not window["passed"] and "window one key too narrow" in window["message"] and "step 9" in window["message"]
    documents = said(record, "documents 1+40+32+77")
    assert not documents["passed"] and "a document boundary crossed" in documents["message"], documents["message"]
    assert "step 10" in documents["message"]
    cap = said(record, "tiles 64x32 softcap 1")
    assert not cap["passed"] and "the cap applied twice" in cap["message"] and "step 11" in cap["message"]


def test_masked_tiles_computed_not_skipped_are_named(tmp_path):
    record = masks_record(
        tmp_path,
        ("col_begin = max(0, row_start + offset - window_left) // block_cols * block_cols",
         "col_begin = 0"),
        # the documents' stop alone left out: causal's own stop would hide it, so the check runs without causal
        ("            col_stop = min(col_stop, documents[document_of(documents, row_end - 1) + 1])\n", ""),
        # and in the backward pass, the documents' bounds of step 12
        ("            row_begin = max(row_begin, documents[document_of(documents, col_start)] // block_rows * block_rows)\n"
         "            row_stop = min(row_stop, documents[document_of(documents, col_end - 1) + 1])\n", "            pass\n"),
        backward=True)
    values = [c for c in record["cases"] if c["name"].startswith(("masks: cpu", "masks backward: cpu"))]
    assert values and all(c["passed"] for c in values), [c["message"] for c in values if not c["passed"]]
    window, documents = said(record, "masks: the window skips"), said(record, "masks: the documents skip")
    assert not window["passed"] and "step 9" in window["message"]
    assert not documents["passed"] and "step 10" in documents["message"]
    assert said(record, "masks backward: the window skips")["passed"]
    backward = said(record, "masks backward: the documents skip")
    assert not backward["passed"] and "step 12" in backward["message"]


def test_the_loops_bounds_one_key_off_at_a_tile_edge_fail(tmp_path):
    """From a student's try: the key loop begun one key late, and the backward's query loop stopped one row early,
    change nothing unless the window's edge falls a key before a tile's (windows of 17 and 20 on 16-key tiles)."""
    begin = masks_record(tmp_path / "begin", ("col_begin = max(0, row_start + offset - window_left) // block_cols",
                                              "col_begin = max(0, row_start + offset - window_left + 1) // block_cols"))
    failed = [c["name"] for c in begin["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert failed and all("window 17" in name or "window 20" in name for name in failed), failed
    stop = masks_record(tmp_path / "stop", ("row_stop = min(seq_q, col_end - offset + window_left)",
                                            "row_stop = min(seq_q, col_end - 1 - offset + window_left)"), backward=True)
    failed = [c for c in stop["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert failed and all(c["name"].startswith("masks backward: cpu") for c in failed), [c["name"] for c in failed]
    assert all("window 17" in c["name"] or "window 20" in c["name"] for c in failed)
    assert all("step 12" in c["message"] or "steps 8 and 12" in c["message"] for c in failed)


def test_the_full_matrix_built_for_the_documents_alone_is_caught(tmp_path):
    """Each mask has its own memory run: a file that takes one tile of everything only for packed documents of a
    long sequence (past every value case and skip check) runs out of memory in the documents' run."""
    record = masks_record(tmp_path, (
        "    doc_ids = None if documents is None else document_ids(documents, q.device)  # each position's document\n",
        "    doc_ids = None if documents is None else document_ids(documents, q.device)\n"
        "    if documents is not None and seq_q >= 4096:\n"
        "        block_rows, block_cols = seq_q, seq_k  # one tile: the whole score matrix\n"))
    skips = [said(record, "masks: the window skips"), said(record, "masks: the documents skip")]
    assert all(c["passed"] for c in skips), [c["message"] for c in skips]
    memory = said(record, "masks: never builds the full score matrix")
    assert not memory["passed"] and "cu_seqlens (8 documents) ran out of the 1.0 GiB" in memory["message"], memory


def test_the_skip_checks_sizes_public_and_drawn():
    from checks.task3.cases import SKIP_TILE, skip_sizes, tiles_visited

    public = skip_sizes(998, None)
    assert (public.seq, public.window, public.documents) == (2048, 128, (128,) * 16)
    assert tiles_visited(2048, True) == 136 and tiles_visited(2048, True, 128) == 31
    assert tiles_visited(2048, False, None, public.cu_seqlens) == 16
    drawn = [skip_sizes(seed, object()) for seed in range(40)]
    assert skip_sizes(7, object()) == drawn[7] and len({d.seq for d in drawn}) > 20  # the seed's, and varied
    for d in drawn:
        assert 1800 <= d.seq < 2300 and sum(d.documents) == d.seq and d.cu_seqlens[-1] == d.seq
        assert all(96 <= n < 200 for n in d.documents[:-1]) and 1 <= d.documents[-1] < 200
        rows = -(-d.seq // SKIP_TILE)
        assert tiles_visited(d.seq, True, d.window) <= 2 * rows  # two key tiles a row, as the public window's


def test_a_skip_made_at_the_public_shape_alone_fails_with_the_secret_seed(tmp_path):
    """The skip checks' sizes are drawn from the grading's secret seed: a file that skips the window's tiles only at
    the public shape (seq 2048) passes the public check and fails the graded one."""
    edit = ("        if window_left is not None:  # the tile's first query has the earliest window\n",
            "        if window_left is not None and seq_q == 2048:  # skipped where the public check looks\n")
    public = said(masks_record(tmp_path / "public", edit), "masks: the window skips")
    assert public["passed"], public["message"]
    graded = said(masks_record(tmp_path / "graded", edit, hidden=True), "masks: the window skips")
    assert not graded["passed"] and "not skipped (README, Task 3, step 9)" in graded["message"], graded["message"]


def test_a_row_that_has_seen_no_key_yet_is_named_when_it_turns_nan(tmp_path):
    record = masks_record(tmp_path, ("m_sub = m_new.masked_fill(m_new == -math.inf, 0.0)", "m_sub = m_new"))
    assert all(c["passed"] for c in record["cases"] if c["kind"] == "check")  # causal alone never meets such a row
    window = said(record, "seq 129x129 head_dim 32 tiles 32x16 causal window 40")
    assert not window["passed"] and "NaN" in window["message"] and "step 4" in window["message"]


def test_the_cap_left_out_of_the_gradient_is_named(tmp_path):
    record = masks_record(
        tmp_path, ("return ds if softcap is None else ds * (1 - (s / softcap) ** 2)", "return ds"), backward=True)
    assert all(c["passed"] for c in record["cases"] if c["name"].startswith("masks: cpu"))
    cap = said(record, "masks backward: cpu batch 2 heads 2 seq 129x129 head_dim 32 tiles 64x32 softcap 1")
    assert not cap["passed"] and "cap's slope" in cap["message"] and "step 12" in cap["message"], cap["message"]
    window = said(record, "masks backward: cpu batch 2 heads 2 seq 129x129 head_dim 32 tiles 32x16 causal window 40")
    assert window["passed"]


@pytest.mark.parametrize("slope, says", [("1", "dS not multiplied by the cap's slope"),
                                         ("(1 - torch.tanh(s / softcap) ** 2)", "through tanh again")])
def test_each_wrong_cap_slope_is_named(tmp_path, slope, says):
    """The diagnoses of cap_gradient's slope, on a softcap case of step 12 (the variant run here, not in a worker:
    test_the_cap_left_out_of_the_gradient_is_named runs one through the task's test)."""
    from tests.test_diagnose import load
    from checks.task3.cases import ATOL, RTOL, inputs
    from harness.attention_math import attention_gradients
    from harness.checks import compare, random_tensor
    from harness.diagnose_masks import diagnose_masked_gradient

    student = load(tmp_path, 3, "return ds if softcap is None else ds * (1 - (s / softcap) ** 2)",
                   f"return ds if softcap is None else ds * {slope}")
    q, k, v = inputs((2, 2, 129, 129, 32), 5)
    d_out = random_tensor(q.shape, 8)
    out, lse = student.flash_attention(q, k, v, False, 64, 32, return_lse=True, softcap=1.0)
    dq = student.flash_attention_backward(q, k, v, out, lse, d_out, False, 64, 32, softcap=1.0)[0]
    checked = compare(dq, attention_gradients(q, k, v, d_out, False, softcap=1.0)[0], atol=ATOL, rtol=RTOL, name="dq")
    assert not checked.passed
    said = diagnose_masked_gradient(checked.message, "dq", dq, q, k, v, d_out, False, window_left=None,
                                    documents=None, softcap=1.0, atol=ATOL, rtol=RTOL)
    assert says in said and "step 12" in said, said


def test_the_cap_slope_of_a_masked_score_is_named(tmp_path):
    # the masked scores handed to cap_gradient: -inf has no slope, and 0 * -inf is NaN
    record = masks_record(tmp_path, (
        "            p_ij = torch.exp(mask_tile(s_ij, row_start, col_start, offset, causal, window_left, doc_ids)\n"
        "                             - lse_i[..., None])",
        "            s_ij = mask_tile(s_ij, row_start, col_start, offset, causal, window_left, doc_ids)\n"
        "            p_ij = torch.exp(s_ij - lse_i[..., None])"), backward=True)
    assert said(record, "masks backward: cpu batch 2 heads 2 seq 129x129 head_dim 32 tiles 64x32 softcap 1")["passed"]
    capped = said(record, "masks backward: cpu batch 1 heads 2 seq 150x150 head_dim 32 tiles 32x32 causal window 30")
    assert not capped["passed"] and "before mask_tile" in capped["message"] and "step 12" in capped["message"]


def test_a_file_from_before_the_masks_is_told_to_copy_the_signature(tmp_path):
    record = masks_record(tmp_path, (
        "    window_left: int | None = None,\n    cu_seqlens=None,\n    softcap: float | None = None,\n):\n"
        '    """softmax(q k^T',
        '):\n    window_left = cu_seqlens = softcap = None\n    """softmax(q k^T'))
    window = said(record, "causal window 40")
    assert not window["passed"] and "takes no window_left" in window["message"] and "step 9" in window["message"]


@pytest.mark.parametrize("kwargs, words", [
    ({"window_left": 3}, "needs causal=True"), ({"causal": True, "window_left": -1}, "window_left must be"),
    ({"cu_seqlens": [0, 2, 4]}, "seq_q == seq_k"), ({"softcap": 0.0}, "softcap must be"),
])
def test_bad_mask_arguments(kwargs, words):
    import torch

    from task3.solution.attention import flash_attention

    q, k = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=words):
        flash_attention(q, k, k, **kwargs)


@pytest.mark.parametrize("cu_seqlens, words", [([0, 3, 3, 4], "rise from 0"), ([1, 4], "rise from 0"),
                                               ([0.0, 4.0], "list of ints"), ("0,4", "list of ints")])
def test_bad_documents(cu_seqlens, words):
    import torch

    from task3.solution.attention import flash_attention

    q = torch.randn(1, 1, 4, 8)
    with pytest.raises((ValueError, TypeError), match=words):
        flash_attention(q, q, q, cu_seqlens=cu_seqlens)


def test_documents_given_as_a_tensor_are_kept_on_ctx_as_a_list():
    """flash_attention_trainable (given) turns a tensor cu_seqlens into a list, so the forward pass keeps no tensor on
    ctx besides what it saves (the check of step 6 would flag it, in the reference too)."""
    import torch

    from harness.attention_math import attention_gradients
    from task3.entry import saved_by
    from task3.solution.attention import flash_attention_trainable

    q, k, v = (torch.randn(1, 2, 40, 8, requires_grad=True) for _ in range(3))
    out = flash_attention_trainable(q, k, v, True, 16, 16, cu_seqlens=torch.tensor([0, 7, 40]), softcap=2.0)
    saved, others = saved_by(out.grad_fn)
    assert len(saved) == 5 and not others, others
    d_out = torch.randn_like(out)
    out.backward(d_out)
    want = attention_gradients(q, k, v, d_out, True, documents=[0, 7, 40], softcap=2.0)
    assert all(torch.allclose(got.double(), w, atol=1e-5) for got, w in zip((q.grad, k.grad, v.grad), want))


def test_flex_attention_is_pytorchs_attention_too(tmp_path):
    """FlexAttention computes any of the masks of steps 9-12 (mask_mod, score_mod): named like SDPA, it breaks the
    own-work rule, and calling it in the worker raises (common/watch.py)."""
    text = bad_variant(3, "attention.py", "from common.masks import check_masks, document_ids, document_of\n",
                       "from common.masks import check_masks, document_ids, document_of\n"
                       "from torch.nn.attention.flex_attention import flex_attention\n")
    record = run_test(3, submission(tmp_path, {"task3/attention.py": text}), tmp_path, "--masks")
    rule = next(c for c in record["cases"] if c["kind"] == "rule" and "own work" in c["name"])
    assert not rule["passed"] and "flex_attention" in rule["message"], rule["message"]
    assert record["status"] == "failed"  # a rule: the task scores 0


def test_the_workers_block_covers_flex_attention():
    import subprocess
    import sys

    code = ("from common import watch\nwatch.block_pytorch_attention()\n"
            "from torch.nn.attention.flex_attention import flex_attention\n"
            "try:\n    flex_attention(None, None, None)\nexcept RuntimeError as err:\n    print(err)\n")
    said = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "PyTorch's own attention" in said.stdout, said.stdout + said.stderr


def test_a_timed_run_that_computes_something_else_is_caught(tmp_path):
    """The skip checks time calls whose output no value case sees: a file that returns zeros there (fast, and
    without skipping anything) fails on what it returned."""
    record = masks_record(tmp_path, ("    doc_ids = None if documents is None else document_ids(documents, q.device)  # each position's document\n",
                                     "    doc_ids = None if documents is None else document_ids(documents, q.device)\n"
                                     "    if seq_q == 2048 and (window_left is not None or documents is not None):\n"
                                     "        return torch.zeros_like(q)\n"))
    window = said(record, "masks: the window skips")
    assert not window["passed"] and "the timed runs: with the window, run" in window["message"], window["message"]


def test_a_timed_run_that_reuses_an_earlier_output_is_caught(tmp_path):
    """Every timed run has inputs of its own: a file that hands back what it computed for an earlier call of the same
    shape (fast, and right for the first) fails on the runs it did not compute."""
    text = (REPO_SOLUTION / "attention.py").read_text()
    old = "    check_qkv(q, k, v, dims=4, seq_dim=2, causal=causal)\n"
    assert old in text
    text = text.replace(old, old + "    key = (tuple(q.shape), causal)\n"
                                   "    if q.shape[2] == 2048 and key in _REUSED:\n"
                                   "        return _REUSED[key]\n", 1)
    text = text.replace("    return (out, lse) if return_lse else out\n",
                        "    if seq_q == 2048:\n        _REUSED[(tuple(q.shape), causal)] = out\n"
                        "    return (out, lse) if return_lse else out\n", 1)
    text += "\n_REUSED = {}\n"
    record = run_test(3, submission(tmp_path, {"task3/attention.py": text}), tmp_path)
    skip = case(record, "causal skips the tiles")
    assert not skip["passed"] and "the timed runs:" in skip["message"] and "run " in skip["message"], skip["message"]


def test_an_output_made_up_where_the_memory_is_limited_fails(tmp_path):
    """The memory case's outputs are compared on a sample of rows: a file that sees the limit and returns zeros (no
    matrix built, nothing computed) fails that case."""
    text = (REPO_SOLUTION / "attention.py").read_text()
    old = "    check_qkv(q, k, v, dims=4, seq_dim=2, causal=causal)\n"
    text = text.replace(old, old + "    import resource\n"
                                   "    if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:\n"
                                   "        return q.new_zeros(()).expand(q.shape)\n", 1)
    record = run_test(3, submission(tmp_path, {"task3/attention.py": text}), tmp_path)
    memory = case(record, "never builds the full score matrix")
    assert not memory["passed"] and "out (rows" in memory["message"], memory["message"]
