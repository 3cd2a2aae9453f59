"""Task 5 without a GPU: the cached layer's prefill/decode bookkeeping with PyTorch in place of the kernels.

The kernels are checked on the GPU (python -m task5.test); here a plain PyTorch stand-in
plays them, so positions, cache growth, a one-token prompt, a full cache and the errors
around it are tested on any machine. The stand-in checks the same things the binding
does, so a layer that asks it for a write past the cache fails here too.
"""


import pytest
import torch
from torch import nn

from common.layer import mha_weights
from harness.records import Report
from harness.attention_math import causal_mask
from common.torch_kernels import PyTorchKernels
from grader.rubric import score
from task5.attention import CachedMultiHeadAttention


class TorchKernels(PyTorchKernels):
    """The kernels' PyTorch stand-in (common/torch_kernels.py, which refuses what the binding refuses), recording calls."""

    def __init__(self):
        self.calls = []

    def update_cache(self, k_new, v_new, k_cache, v_cache, pos):
        super().update_cache(k_new, v_new, k_cache, v_cache, pos)
        self.calls.append(("update", pos, k_new.shape[2]))

    def decode(self, q, k_cache, v_cache, length):
        self.calls.append(("decode", length))
        return super().decode(q, k_cache, v_cache, length)


def layer_and_reference(hidden=32, heads=4, max_seq=12, seed=0):
    torch.manual_seed(seed)
    reference = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True, dtype=torch.float64)
    kernels = TorchKernels()
    layer = CachedMultiHeadAttention(hidden, heads, max_seq, kernels=kernels).double()
    layer.load_weights(*mha_weights(reference))
    return layer, reference, kernels


@pytest.mark.parametrize("prompt_len, steps", [(5, 7), (1, 11), (12, 0), (11, 1)])
def test_prefill_then_steps_match_attention_over_the_whole_sequence(prompt_len, steps):
    layer, reference, kernels = layer_and_reference()
    x = torch.randn(2, prompt_len + steps, 32, dtype=torch.float64)
    outputs = [layer.prefill(x[:, :prompt_len])]
    outputs += [layer.step(x[:, t:t + 1]) for t in range(prompt_len, prompt_len + steps)]
    seq = prompt_len + steps
    expected, _ = reference(x, x, x, attn_mask=causal_mask(seq, seq), need_weights=False)
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected)
    assert layer.length == seq
    assert kernels.calls == [("update", 0, prompt_len)] + [c for t in range(prompt_len, seq)
                                                           for c in (("update", t, 1), ("decode", t + 1))]


def test_a_new_prefill_starts_over():
    layer, reference, _ = layer_and_reference()
    layer.prefill(torch.randn(2, 9, 32, dtype=torch.float64))
    x = torch.randn(3, 4, 32, dtype=torch.float64)  # another batch size: a new cache
    out = torch.cat([layer.prefill(x[:, :3]), layer.step(x[:, 3:])], dim=1)
    expected, _ = reference(x, x, x, attn_mask=causal_mask(4, 4), need_weights=False)
    torch.testing.assert_close(out, expected)
    assert layer.k_cache.shape == (3, 4, 12, 8) and layer.length == 4


def test_the_cache_is_batch_heads_positions_head_dim():
    layer, _, _ = layer_and_reference(hidden=32, heads=4, max_seq=12)
    x = torch.randn(2, 3, 32, dtype=torch.float64)
    layer.prefill(x)
    k = layer.split_heads(layer.k_proj(x))
    torch.testing.assert_close(layer.k_cache[:, :, :3], k)
    assert layer.k_cache.is_contiguous() and (layer.k_cache[:, :, 3:] == 0).all()


@pytest.mark.parametrize("action, words", [
    (lambda layer: layer.prefill(torch.zeros(1, 13, 32, dtype=torch.float64)), "holds max_seq = 12"),
    (lambda layer: layer.step(torch.zeros(1, 1, 32, dtype=torch.float64)), "before prefill"),
    (lambda layer: [layer.prefill(torch.zeros(1, 12, 32, dtype=torch.float64)),
                    layer.step(torch.zeros(1, 1, 32, dtype=torch.float64))], "the cache is full"),
    (lambda layer: [layer.prefill(torch.zeros(2, 3, 32, dtype=torch.float64)),
                    layer.step(torch.zeros(2, 2, 32, dtype=torch.float64))], "(batch, 1, hidden)"),
    (lambda layer: [layer.prefill(torch.zeros(2, 3, 32, dtype=torch.float64)),
                    layer.step(torch.zeros(1, 1, 32, dtype=torch.float64))], "the prompt's batch 2"),
    (lambda layer: layer.prefill(torch.zeros(2, 3, 31, dtype=torch.float64)), "hidden = 32"),
    (lambda layer: layer(torch.zeros(1, 2, 32), None, None), "call prefill(prompt), then step(token)"),
], ids=["prompt_longer_than_the_cache", "step_before_prefill", "step_past_a_full_cache", "two_tokens_in_a_step",
        "another_batch_in_a_step", "wrong_hidden", "forward"])
def test_bad_use_raises_a_clear_error(action, words):
    layer, _, _ = layer_and_reference()
    with pytest.raises((ValueError, RuntimeError, TypeError)) as err:
        action(layer)
    assert words in str(err.value), str(err.value)


def test_max_seq_must_be_a_positive_int():
    with pytest.raises(ValueError, match="max_seq must be a positive int"):
        CachedMultiHeadAttention(32, 4, 0)


def test_an_optional_part_is_reported_but_neither_scored_nor_deciding_the_status():
    report = Report(5, False, "test")
    report.begin_part("decode", (2,))
    report.run("a", lambda: (True, "fine", {}))
    report.end_part("decode")
    report.begin_part("split", (3,), optional=True)
    report.run("b", lambda: (False, "wrong", {}))
    report.end_part("split")
    record = {"status": report.status(), "cases": [c.__dict__ for c in report.cases]}
    assert record["status"] == "passed" and [c["kind"] for c in record["cases"]] == ["check", "optional"]
    points, why = score(5, record)
    assert points == 3 and "0/1 of the optional part, not scored" in why


def test_new_rows_that_landed_shifted_are_told_from_other_wrong_rows():
    """The update's shift diagnosis (checks/task5/cache_decode.py): rows one late, flat over the heads as a kernel's
    index runs; rows written in reverse, or one row alone, are not a shift unless the guard band says rows went
    outside the cache."""
    from checks.task5.cache_decode import landed_off, rows_in_place

    cache, new = torch.randn(1, 1, 10, 4), torch.randn(1, 1, 3, 4)
    late = cache.clone()
    late[:, :, 6:9] = new  # pos 5, one row late
    assert landed_off(late, new, 5) == 1 and not rows_in_place(late, new, 5)
    right = cache.clone()
    right[:, :, 5:8] = new
    assert rows_in_place(right, new, 5)
    reversed_rows = cache.clone()
    reversed_rows[:, :, 7:10] = new.flip(2)  # pos 7: row 1 in place, rows 0 and 2 swapped
    assert landed_off(reversed_rows, new, 7) is None
    assert landed_off(reversed_rows, new, 7, outside_ok=True) == 2  # only with rows written outside the cache
    heads, one = torch.randn(2, 2, 6, 4), torch.randn(2, 2, 1, 4)
    pushed = heads.clone()
    flat, rows = pushed.view(-1, 4), one.reshape(-1, 4)
    for bh in range(3):  # pos 5, one row late: each head's row lands in the next head's row 0, the last's outside
        flat[bh * 6 + 6] = rows[bh]
    assert landed_off(pushed, one, 5) is None and landed_off(pushed, one, 5, outside_ok=True) == 1
    assert landed_off(pushed, one, [5, 5], outside_ok=True) == 1
    assert landed_off(pushed, one, [5, 9]) == 1  # sequence 1 does not fit: its rows are not asked for, all inside
