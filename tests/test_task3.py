"""Task 3: the reference passes; known-bad versions (full matrix, the paper's erratum, no mask skip) fail."""

import pytest

from task3 import test as task3_test
from tests.conftest import bad_variant, needs_solution, run_test, submission

pytestmark = needs_solution(3)


def test_reference_passes(tmp_path):
    import json

    assert task3_test.main(["--solution", "--json", str(tmp_path / "r.json"), "--scratch", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "passed"
    assert any(c["kind"] == "benchmark" and "task 1" in c["message"] for c in record["cases"])
    assert any(c["kind"] == "rule" and "full score matrix" in c["name"] and c["passed"] for c in record["cases"])


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
    record = variant_record(tmp_path, "correction = torch.exp(m_i - m_new)", "correction = 1 / torch.exp(m_i - m_new)")
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
