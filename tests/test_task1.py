"""Task 1: the reference passes its own test, the skeleton fails cleanly, bad input is named."""

import pytest
import torch

from checks.task1 import test as task1_test
from tests.conftest import bad_variant, needs_solution, run_test, submission

pytestmark = needs_solution(1)


def test_reference_passes(tmp_path):
    import json

    assert task1_test.main(["--solution", "--json", str(tmp_path / "r.json"), "--scratch", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "passed" and record["implementation"] == "reference solution"
    assert any("hidden 4096 heads 32" in c["name"] for c in record["cases"])


def test_skeleton_reports_the_first_missing_step(capsys, tmp_path):
    assert task1_test.main(["--scratch", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "not implemented yet: see README, Task 1, step 1" in out
    assert "Traceback" not in out


@pytest.fixture
def layer():
    from task1.solution.attention import MultiHeadAttention

    return MultiHeadAttention(64, 4)


@pytest.mark.parametrize("make_args, error, words", [
    (lambda: (torch.randn(2, 5, 64), torch.randn(2, 5, 64)), TypeError, "value must be a torch.Tensor"),
    (lambda: (torch.randn(5, 64),) * 3, ValueError, "query must have 3 dimensions"),
    (lambda: (torch.randn(2, 5, 32),) * 3, ValueError, "hidden_size is 64"),
    (lambda: (torch.randn(2, 5, 64), torch.randn(3, 5, 64), torch.randn(3, 5, 64)), ValueError, "dimension 0: 2 vs 3"),
    (lambda: (torch.randn(2, 5, 64), torch.randn(2, 6, 64), torch.randn(2, 7, 64)), ValueError, "key and value"),
    (lambda: (torch.randn(2, 5, 64), torch.randn(2, 5, 64).double(), torch.randn(2, 5, 64)), ValueError, "dtype"),
    (lambda: (torch.randint(0, 3, (2, 5, 64)),) * 3, TypeError, "floating-point"),
    (lambda: (torch.randn(2, 5, 64), torch.randn(2, 5, 64, device="meta"), torch.randn(2, 5, 64)), ValueError, "device"),
])
def test_bad_input_names_the_argument(layer, make_args, error, words):
    args = make_args()
    if len(args) == 2:
        args = (*args, None)
    with pytest.raises(error, match=words):
        layer(*args)


def test_causal_needs_seq_q_at_most_seq_k(layer):
    with pytest.raises(ValueError, match="seq_q <= seq_k"):
        layer(torch.randn(1, 6, 64), torch.randn(1, 5, 64), torch.randn(1, 5, 64), causal=True)


def test_hidden_not_divisible_by_heads():
    from task1.solution.attention import MultiHeadAttention

    with pytest.raises(ValueError, match="hidden_size 100 is not divisible by num_heads 3"):
        MultiHeadAttention(100, 3)


def test_pytorch_attention_reached_through_torch_ops_is_caught(tmp_path):
    sub = submission(tmp_path, {"task1/attention.py": bad_variant(
        1, "attention.py", "    return torch.softmax(scores, dim=-1) @ v\n",
        "    return getattr(torch.ops.aten, '_scaled_dot_product_' + 'flash_attention_for_cpu')(q, k, v)[0]\n")})
    record = run_test(1, sub, tmp_path)
    rule = [c for c in record["cases"] if c["kind"] == "rule"]
    assert not rule[0]["passed"] and "scaled_dot_product" in rule[0]["message"]
