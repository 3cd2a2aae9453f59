"""Task 3: the reference passes; known-bad versions (full matrix, the paper's erratum, no mask skip) fail."""

import importlib.util
import json

import pytest

from task3 import test as task3_test
from tests.conftest import bad_variant, needs_solution

pytestmark = needs_solution(3)


def test_reference_passes(tmp_path):
    assert task3_test.main(["--solution", "--json", str(tmp_path / "r.json")]) == 0
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "passed"
    assert any(c["kind"] == "benchmark" and "task 1" in c["message"] for c in record["cases"])


def test_skeleton_reports_the_first_missing_step(capsys):
    assert task3_test.main([]) == 1
    assert "not implemented yet: see README, Task 3, step 1" in capsys.readouterr().out


def load_variant(tmp_path, old, new):
    path = tmp_path / "attention.py"
    path.write_text(bad_variant(3, "attention.py", old, new))
    spec = importlib.util.spec_from_file_location("bad_task3", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_full_matrix_is_detected(tmp_path):
    # one query tile and one key tile covering everything: correct values, but the whole matrix at once
    bad = load_variant(tmp_path, "    seq_q, seq_k, head_dim = q.shape[2], k.shape[2], q.shape[3]\n",
                       "    seq_q, seq_k, head_dim = q.shape[2], k.shape[2], q.shape[3]\n"
                       "    block_rows, block_cols = seq_q, seq_k\n")
    passed, message, _ = task3_test.check_no_full_matrix(bad, "cpu", 0)
    assert not passed and "full score matrix" in message


def test_the_papers_erratum_gives_wrong_values(tmp_path):
    bad = load_variant(tmp_path, "correction = torch.exp(m_i - m_new)", "correction = 1 / torch.exp(m_i - m_new)")
    result = task3_test.check_values(bad, (1, 2, 129, 129, 32, 32, 32), False, "cpu", 0)
    assert not result.passed


def test_wrong_causal_alignment_fails(tmp_path):
    bad = load_variant(tmp_path, "offset = seq_k - seq_q", "offset = 0")
    assert task3_test.check_values(bad, (1, 2, 100, 300, 64, 64, 64), False, "cpu", 0).passed  # no mask: fine
    assert not task3_test.check_values(bad, (1, 2, 100, 300, 64, 64, 64), True, "cpu", 0).passed


@pytest.mark.parametrize("kwargs, words", [({"block_rows": 0}, "block_rows"), ({"causal": True}, "seq_q <= seq_k")])
def test_bad_arguments(kwargs, words):
    import torch

    from task3.solution.attention import flash_attention

    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 3, 8)
    with pytest.raises(ValueError, match=words):
        flash_attention(q, k, k, **kwargs)


def test_causal_without_skipping_tiles_fails(tmp_path):
    bad = load_variant(tmp_path, "col_stop = min(seq_k, row_end + offset) if causal else seq_k", "col_stop = seq_k")
    assert task3_test.check_values(bad, (1, 2, 129, 129, 32, 32, 32), True, "cpu", 0).passed  # values are right
    passed, message, _ = task3_test.check_causal_skips_tiles(bad, "cpu", 0)
    assert not passed and "step 2" in message


def test_always_returning_a_tuple_fails(tmp_path):
    bad = load_variant(tmp_path, "    return (out, lse) if return_lse else out", "    return (out, lse)")
    passed, message, _ = task3_test.check_values(bad, (1, 1, 9, 9, 8, 4, 4), False, "cpu", 0)
    assert not passed and "without return_lse" in message
