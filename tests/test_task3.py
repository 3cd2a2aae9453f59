"""Task 3: the reference passes; known-bad versions (full matrix, the paper's erratum, no mask skip) fail."""

import pytest

from checks.task3 import test as task3_test
from tests.conftest import REPO, bad_variant, needs_solution, run_test, submission

REPO_SOLUTION = REPO / "task3/solution"

pytestmark = needs_solution(3)


def test_reference_passes(tmp_path):
    import json

    assert task3_test.main(["--solution", "--json", str(tmp_path / "r.json"), "--scratch", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "passed"
    assert any(c["kind"] == "benchmark" and "task 1" in c["message"] for c in record["cases"])
    assert any(c["kind"] == "rule" and "full score matrix" in c["name"] and c["passed"] for c in record["cases"])
    from harness.cli import devices

    optional = [c for c in record["cases"] if c["kind"] == "optional"]
    backward = [c for c in optional if c["name"].startswith("backward")]  # the backward pass, steps 6-8
    assert len(backward) == 12 * len(devices()) + 3, [c["name"] for c in backward]  # 6 shapes x causal, 3 checks
    from checks.task3.masks import MASK_BACKWARD_CASES, MASK_CASES

    masks = [c for c in optional if c["name"].startswith("masks:")]  # steps 9-11: the cases, 2 skips, the memory case
    assert len(masks) == len(MASK_CASES) * len(devices()) + 3, [c["name"] for c in masks]
    masks_backward = [c for c in optional if c["name"].startswith("masks backward")]  # step 12: cases, the same 3
    assert len(masks_backward) == len(MASK_BACKWARD_CASES) * len(devices()) + 3, [c["name"] for c in masks_backward]
    assert len(optional) == len(backward) + len(masks) + len(masks_backward)
    assert all(c["passed"] for c in optional), [c["message"] for c in optional if not c["passed"]]


def test_skeleton_reports_the_first_missing_step(capsys, tmp_path):
    assert task3_test.main(["--scratch", str(tmp_path)]) == 1
    assert "not implemented yet: see README, Task 3, step 1" in capsys.readouterr().out


def variant_record(tmp_path, old, new):
    return run_test(3, submission(tmp_path, {"task3/attention.py": bad_variant(3, "attention.py", old, new)}), tmp_path)


def case(record, words):
    return next(c for c in record["cases"] if words in c["name"])


@pytest.mark.parametrize("old, new", [
    # one query tile and one key tile covering everything: right values, but the whole matrix at once
    ("    seq_q, seq_k, head_dim = q.shape[2], k.shape[2], q.shape[3]\n",
     "    seq_q, seq_k, head_dim = q.shape[2], k.shape[2], q.shape[3]\n    block_rows, block_cols = seq_q, seq_k\n"),
    # the same in numpy, out of sight of any PyTorch watch
    ("    seq_q, seq_k, head_dim = q.shape[2], k.shape[2], q.shape[3]\n",
     "    seq_q, seq_k, head_dim = q.shape[2], k.shape[2], q.shape[3]\n"
     "    import numpy\n    numpy.matmul(q.detach().cpu().numpy(), k.detach().cpu().numpy().swapaxes(-1, -2))\n"),
])
def test_full_matrix_breaks_the_rule(tmp_path, old, new):
    record = variant_record(tmp_path, old, new)
    rule = case(record, "full score matrix")
    assert rule["kind"] == "rule" and not rule["passed"] and "never build it" in rule["message"]


def test_the_papers_erratum_gives_wrong_values(tmp_path):
    record = variant_record(tmp_path, "correction = torch.exp(m_i - m_sub)", "correction = 1 / torch.exp(m_i - m_sub)")
    assert not case(record, "seq 129x129")["passed"]


def test_wrong_causal_alignment_fails(tmp_path):
    record = variant_record(tmp_path, "offset = seq_k - seq_q", "offset = 0")
    assert case(record, "cpu batch 1 heads 2 seq 100x300 head_dim 64 tiles 64x64")["passed"]  # no mask: fine
    assert not case(record, "cpu batch 1 heads 2 seq 100x300 head_dim 64 tiles 64x64 causal")["passed"]


def test_causal_without_skipping_tiles_fails(tmp_path):
    record = variant_record(tmp_path, "col_stop = min(seq_k, row_end + offset) if causal else seq_k", "col_stop = seq_k")
    assert case(record, "seq 129x129 head_dim 64 tiles 64x32 causal")["passed"]  # values are right
    skip = case(record, "skips the tiles")
    assert not skip["passed"] and "step 2" in skip["message"]


def test_always_returning_a_tuple_fails(tmp_path):
    record = variant_record(tmp_path, "    return (out, lse) if return_lse else out", "    return (out, lse)")
    assert "without return_lse" in case(record, "seq 1x1")["message"]


@pytest.mark.parametrize("kwargs, words", [({"block_rows": 0}, "block_rows"), ({"causal": True}, "seq_q <= seq_k")])
def test_bad_arguments(kwargs, words):
    import torch

    from task3.solution.attention import flash_attention

    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 3, 8)
    with pytest.raises(ValueError, match=words):
        flash_attention(q, k, k, **kwargs)


# -- the optional backward pass (steps 6-8): each known-bad version loses its optional checks, never the task --------

def backward_record(tmp_path, *edits):
    text = (REPO_SOLUTION / "attention.py").read_text()
    for old, new in edits:
        assert old in text, f"known-bad variant no longer applies: {old!r} not in task3/solution/attention.py"
        text = text.replace(old, new, 1)
    record = run_test(3, submission(tmp_path, {"task3/attention.py": text}), tmp_path, "--backward")
    assert record["status"] == "passed", "an optional part never decides the task"
    return record


def optional(record, words=""):
    return [c for c in record["cases"] if c["kind"] == "optional" and words in c["name"]]


def test_the_skeletons_backward_pass_says_step_6_and_the_task_still_passes(tmp_path):
    # the skeleton's backward pass below a working forward pass (the reference's own: test_reference_passes)
    skeleton = (REPO / "task3/attention.py").read_text()
    forward_done = (REPO_SOLUTION / "attention.py").read_text().split("# -- the backward pass")[0]
    text = forward_done + "# -- the backward pass" + skeleton.split("# -- the backward pass")[1]
    record = run_test(3, submission(tmp_path, {"task3/attention.py": text}), tmp_path, "--backward")
    assert record["status"] == "passed"
    said = [c["message"] for c in optional(record) if not c["passed"]]
    assert len(said) == 1 and "not implemented yet: see README, Task 3, step 6" in said[0], said


def test_a_gradient_without_its_scale_is_wrong(tmp_path):
    record = backward_record(tmp_path, ("dk_j += (ds_ij.transpose(-2, -1) @ q_i) * scale",
                                        "dk_j += ds_ij.transpose(-2, -1) @ q_i"))
    wrong = [c["message"] for c in optional(record, "backward: cpu") if not c["passed"]]
    assert wrong and all("dk" in m and "steps 7-8" in m for m in wrong), wrong[:2]
    assert not [c for c in optional(record, "backward: cpu batch 1 heads 1 seq 1x1") if not c["passed"]]  # dk is 0


def test_saving_p_and_not_skipping_causal_tiles_are_both_named(tmp_path):
    record = backward_record(
        tmp_path,
        ("        ctx.save_for_backward(q, k, v, out, lse)\n",
         "        ctx.save_for_backward(q, k, v, out, lse, torch.softmax(q @ k.transpose(-2, -1), dim=-1))\n"),
        ("row_begin = max(0, col_start - offset) // block_rows * block_rows if causal else 0", "row_begin = 0"))
    values = optional(record, "backward: cpu")
    assert values and all(not c["passed"] and "saved tensors of shapes" in c["message"] for c in values)
    skip = optional(record, "causal skips")[0]
    assert not skip["passed"] and "step 7" in skip["message"]


def test_a_tensor_kept_on_ctx_and_the_full_matrix_in_the_backward_pass_are_both_caught(tmp_path):
    record = backward_record(
        tmp_path,
        ("        ctx.causal, ctx.block_rows, ctx.block_cols, ctx.masks = causal, block_rows, block_cols, masks\n",
         "        ctx.causal, ctx.block_rows, ctx.block_cols, ctx.masks = causal, block_rows, block_cols, masks\n"
         "        import types\n"
         "        ctx.kept = types.SimpleNamespace(p=[lse * 2])  # inside an object: read too\n"),
        ("    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)\n",
         "    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)\n"
         "    block_rows, block_cols = seq_q, seq_k  # one tile: the whole matrix at once\n"))
    values = optional(record, "backward: cpu")
    assert values and all(not c["passed"] and "ctx.kept" in c["message"] for c in values)
    rule = optional(record, "full score matrix")[0]
    assert not rule["passed"] and "never build it" in rule["message"]


def test_autograd_inside_the_backward_pass_is_named(tmp_path):
    record = backward_record(tmp_path, (
        "        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, d_out, ctx.causal, ctx.block_rows, ctx.block_cols,\n"
        "                                              **ctx.masks)\n",
        "        with torch.enable_grad():  # autograd through the tiled forward pass instead of Algorithm 2\n"
        "            leaves = [t.detach().requires_grad_() for t in (q, k, v)]\n"
        "            again = flash_attention(*leaves, ctx.causal, ctx.block_rows, ctx.block_cols)\n"
        "            dq, dk, dv = torch.autograd.grad(again, leaves, d_out)\n"))
    own = optional(record, "its own gradients")[0]
    assert not own["passed"] and "enable_grad" in own["message"] and "steps 7-8" in own["message"]


def test_autograd_the_text_scan_cannot_read_is_caught_at_run_time(tmp_path):
    """Autograd through the forward pass computed again, reached by names built at run time (no line the scan
    reads): given an out and lse that are not the forward pass's, it ignores them, where Algorithm 2 uses them."""
    record = backward_record(tmp_path, (
        '    collects a part from every key tile.\n    """\n',
        '    collects a part from every key tile.\n    """\n'
        '    with getattr(torch, "enable" + "_grad")():  # autograd, under names no scan reads\n'
        '        leaves = [t.detach().requires_grad_() for t in (q, k, v)]\n'
        '        again = flash_attention(*leaves, causal, block_rows, block_cols)\n'
        '        return tuple(getattr(torch.autograd, "gr" + "ad")(again, leaves, d_out))\n'))
    values = optional(record, "backward: cpu")
    assert values and all(c["passed"] for c in values), [c["message"] for c in values if not c["passed"]]
    own = optional(record, "its own gradients")[0]
    assert not own["passed"] and "not the forward pass's" in own["message"], own["message"]
    assert "not by autograd" in own["message"] and "steps 7-8" in own["message"]


def test_an_old_file_without_the_backward_pass_is_told_what_to_copy(tmp_path):
    text = (REPO_SOLUTION / "attention.py").read_text().split("# -- the backward pass")[0]
    record = run_test(3, submission(tmp_path, {"task3/attention.py": text}), tmp_path, "--backward")
    assert record["status"] == "passed"
    said = [c["message"] for c in optional(record) if not c["passed"]]
    assert said and "copy the backward pass's part of the handout's file" in said[0], said
