"""harness.diagnose_backward: each common mistake of the backward pass, made in the float64 gradients in one place,
is named with its step; right gradients and unrelated errors get no diagnosis."""

import pytest
import torch

from harness.attention_math import attention_gradients
from harness.checks import compare, random_tensor
from harness.diagnose_backward import MISTAKES, diagnose_gradient, gradients_with

ATOL, RTOL = 2e-5, 1e-4  # task 4's float32 tolerance


def inputs(heads=4, kv_heads=2, seq_q=70, seq_k=150, head_dim=16, seed=3):
    return (random_tensor((1, heads, seq_q, head_dim), seed), random_tensor((1, kv_heads, seq_k, head_dim), seed + 1),
            random_tensor((1, kv_heads, seq_k, head_dim), seed + 2), random_tensor((1, heads, seq_q, head_dim), seed + 3))


@pytest.mark.parametrize("causal", [False, True])
def test_the_gradients_written_out_are_autograds(causal):
    q, k, v, d_out = inputs()
    for got, expected in zip(gradients_with(q, k, v, d_out, causal, 0.25), attention_gradients(q, k, v, d_out, causal,
                                                                                                0.25)):
        assert compare(got, expected, atol=1e-12, rtol=1e-10).passed


@pytest.mark.parametrize("mistake", MISTAKES, ids=[f"{m.grad}-{m.how}" for m in MISTAKES])
def test_each_mistake_is_named_with_its_step_in_the_gradient_it_shows_in(mistake):
    q, k, v, d_out = inputs()
    causal, tiles = True, (32, 16)  # the student's own tile sizes
    which = "dq dk dv".split().index(mistake.grad)
    # a mistake in the dK/dV kernel's walk shows in dQ where that kernel adds dQ up too (the 16-bit part)
    fused = mistake.grad == "dq" and mistake.how in ("one head", "no queries", "late")
    for head in (0, -1) if mistake.how == "one head" else (0,):
        got = gradients_with(q, k, v, d_out, causal, 0.25, mistake.how, tiles, head, dq_with_dk=fused)[which].float()
        right = gradients_with(q, k, v, d_out, causal, 0.25)[which]
        result = compare(got, right, atol=ATOL, rtol=RTOL)
        assert not result.passed, "this mistake does not show on these inputs"
        said = diagnose_gradient(result, mistake.grad, got, q, k, v, d_out, causal, 0.25, atol=ATOL, rtol=RTOL,
                                 tiles=tiles, dq_with_dk=fused).message
        assert said.startswith(f"looks like {mistake.says}: see README, Task 4, step {mistake.step}."), said


def test_right_gradients_and_noise_get_no_diagnosis():
    q, k, v, d_out = inputs()
    for which, name in enumerate(("dq", "dk", "dv")):
        right = gradients_with(q, k, v, d_out, False, 0.25)[which]
        noisy = (right + 0.01 * torch.randn_like(right)).float()
        result = compare(noisy, right, atol=ATOL, rtol=RTOL)
        assert not diagnose_gradient(result, name, noisy, q, k, v, d_out, False, 0.25, atol=ATOL,
                                     rtol=RTOL).message.startswith("looks like")


def test_zeros_are_no_query_tile_and_a_mistake_that_does_not_show_names_nothing():
    """A dK/dV of zeros (the skeleton's first_query = seq_q left in) is not 'the causal skip a tile late', though
    with one query tile that model is zeros too; a gradient within a hair of the right one is no mistake."""
    q, k, v, d_out = inputs(seq_q=63, seq_k=63)  # one query tile of 64: the late skip leaves nothing either
    for which, name in ((1, "dk"), (2, "dv")):
        zeros = torch.zeros_like(gradients_with(q, k, v, d_out, True, 0.25)[which]).float()
        result = compare(zeros, gradients_with(q, k, v, d_out, True, 0.25)[which], atol=ATOL, rtol=RTOL)
        said = diagnose_gradient(result, name, zeros, q, k, v, d_out, True, 0.25, atol=ATOL, rtol=RTOL).message
        assert said.startswith(f"looks like {name[0]}{name[1].upper()} of no query tile at all"), said
    right = gradients_with(q, k, v, d_out, False, 0.25)[0]
    close = (right * (1 + 1.5 * RTOL)).float()  # just outside the tolerance
    result = compare(close, right, atol=0.0, rtol=RTOL)
    assert not result.passed
    assert not diagnose_gradient(result, "dq", close, q, k, v, d_out, False, 0.25, atol=0.0,
                                 rtol=RTOL).message.startswith("looks like")


def test_a_mistake_that_makes_the_gradient_larger_is_matched_at_its_own_size():
    """dS without P makes dQ tens of times larger; the 16-bit kernels round dS before its product, so their dQ is
    off the mistake's float64 model by the tolerance's share of that size, not of the right one's: still named."""
    q, k, v, d_out = inputs()
    right, wrong = (gradients_with(q, k, v, d_out, False, 0.25, how, dq_with_dk=True)[0] for how in ("", "no P"))
    growth = float(wrong.abs().max() / right.abs().max())
    assert growth > 4, growth
    atol = 1e-3 * float(right.abs().max())
    rounded = wrong + 0.5 * atol * growth * (2 * torch.rand_like(wrong) - 1)  # within the share, past atol
    assert not compare(rounded, wrong, atol=atol, rtol=0.0).passed
    result = compare(rounded, right, atol=atol, rtol=0.0)
    said = diagnose_gradient(result, "dq", rounded, q, k, v, d_out, False, 0.25, atol=atol, rtol=0.0,
                             dq_with_dk=True).message
    assert said.startswith("looks like dS without P"), said
