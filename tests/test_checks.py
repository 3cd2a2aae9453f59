"""harness.checks must fail on every kind of wrong output; a check that cannot fail proves nothing."""

import math

import torch

from harness.checks import HALF_TYPES, compare, guarded_output, in_each_type, random_tensor, within
from harness.attention_math import attention_float64, causal_mask


def test_correct_output_passes():
    ref = random_tensor((3, 4), 0)
    assert compare(ref.clone(), ref, atol=1e-6, rtol=1e-6).passed


def test_wrong_value_fails_and_names_the_index():
    ref = random_tensor((3, 4), 0)
    out = ref.clone()
    out[1, 2] += 1.0
    result = compare(out, ref, atol=1e-5, rtol=1e-5)
    assert not result.passed and result.mismatches == 1 and "(1, 2)" in result.message


def test_nan_and_inf_fail_even_when_the_reference_is_close():
    ref = random_tensor((5,), 1)
    for bad in (math.nan, math.inf, -math.inf):
        out = ref.clone()
        out[3] = bad
        result = compare(out, ref, atol=1e9, rtol=1e9)
        assert not result.passed and "(3,)" in result.message


def test_within_gives_compares_verdict_in_one_answer():
    """within is compare's quick path for checks that run many times: it must never pass what compare fails."""
    ref = random_tensor((6, 1, 8), 3)
    rows = torch.tensor([1e-3] * 5 + [1e-9], dtype=torch.float64)[:, None, None]
    cases = [(ref.clone(), 1e-6, True)]
    near = ref.clone()
    near[5, 0, 2] += 1e-6  # over its row's tolerance only
    cases += [(near, 1e-2, True), (near, rows, False)]
    for bad in (math.nan, math.inf):
        out = ref.clone()
        out[2, 0, 1] = bad
        cases.append((out, 1e9, False))
    for out, atol, passes in cases:
        assert within(out, ref, atol=atol, rtol=0.0) is passes
        rows_of = atol if not isinstance(atol, torch.Tensor) else None
        if rows_of is not None:
            assert compare(out, ref, atol=rows_of, rtol=0.0).passed is passes
    assert within(ref.float(), ref, atol=1e-6, rtol=1e-6)  # float32 output against a float64 reference
    assert not within(ref[:5], ref[:5].reshape(5, 8), atol=1, rtol=1)  # another shape never passes


def test_unwritten_output_fails():
    ref = random_tensor((2, 3), 2)
    untouched = guarded_output("out", ref.shape, "cpu").tensor
    assert "entirely NaN" in compare(untouched, ref, atol=1, rtol=1).message
    half = untouched.clone()
    half[0] = ref[0]
    result = compare(half, ref, atol=1, rtol=1)
    assert not result.passed and "3 NaN" in result.message


def test_unwritten_rows_columns_and_matrices_are_named():
    ref = random_tensor((2, 3, 100, 80), 4)
    filled = guarded_output("out", ref.shape, "cpu").tensor  # what an output holds before the kernel runs

    def left(index):
        out = ref.clone()
        out[index] = filled[index]
        result = compare(out, ref, atol=1, rtol=1, poisoned=True)
        assert not result.passed and "never written" in result.message
        return result.message

    assert "rows 96-99 of 100 of every matrix, the last 4: a grid or loop" in left((..., slice(96, None), slice(None)))
    assert "columns 64-79 of 80 of every matrix, the last 16" in left((..., slice(64, None)))
    assert "rows 10-19 of 100 of every matrix: a tile" in left((..., slice(10, 20), slice(None)))
    assert "rows 96-99 of 100 of some matrices" in left((0, 1, slice(96, None)))
    assert "the whole 100 x 80 matrix at (1, 2) (1 of the 6" in left((1, 2))
    assert "row 5 of 100 of every matrix: a tile" in left((..., 5, slice(None)))
    scattered = ref.clone()
    scattered[0, 0, 3, 4] = filled[0, 0, 3, 4]  # no pattern: counted, with no hint
    said = compare(scattered, ref, atol=1, rtol=1, poisoned=True).message
    assert "1 never written (still the NaN it was filled with); first at (0, 0, 3, 4)" in said and "tile" not in said
    computed = ref.clone()
    computed[..., 0, :] = math.nan  # a NaN the code computed (a row that saw no key) is not "never written"
    said = compare(computed, ref, atol=1, rtol=1, poisoned=True).message
    assert "never written" not in said and "unwritten or" not in said
    assert "480 NaN computed by the code (0/0, inf - inf, or an overflow: not left unwritten), in row 0 of 100" in said
    computed[0, 0, 3, 4] = filled[0, 0, 3, 4]  # both kinds: each counted
    said = compare(computed, ref, atol=1, rtol=1, poisoned=True).message
    assert "481 of 48000 elements not finite: 480 NaN computed" in said and "; 1 never written" in said
    everywhere = torch.full_like(ref, math.nan)  # NaN computed everywhere is not a skeleton's untouched output
    result = compare(everywhere, ref, atol=1, rtol=1, poisoned=True)
    assert not result.untouched and "computed by the code" in result.message
    assert compare(filled.clone(), ref, atol=1, rtol=1, poisoned=True).untouched


def test_shape_and_type_mismatch_fail():
    ref = random_tensor((2, 3), 3)
    assert "shape" in compare(ref.T, ref, atol=1, rtol=1).message
    assert "torch.Tensor" in compare([1.0], ref, atol=1, rtol=1).message


def test_causal_mask_is_aligned_to_the_end():
    mask = causal_mask(2, 4)
    # the last query sees every key; the one before it all but the last key
    assert mask.tolist() == [[False, False, False, True], [False, False, False, False]]


def test_reference_matches_a_direct_float64_formula():
    q, k, v = (random_tensor((1, 2, 5, 8), s).double() for s in (1, 2, 3))
    out, lse = attention_float64(q, k, v, causal=True)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    scores = scores + torch.triu(torch.full((5, 5), -math.inf, dtype=torch.float64), 1)
    assert torch.allclose(out, torch.softmax(scores, -1) @ v, atol=1e-12)
    assert torch.allclose(lse, torch.logsumexp(scores, -1), atol=1e-12)
    assert out.dtype == torch.float64


def test_attention_flops_counts_the_visible_pairs():
    from harness.attention_math import attention_flops

    assert attention_flops(1, 1, 4, 4, 1, causal=False) == 4 * 16
    assert attention_flops(1, 1, 4, 4, 1, causal=True) == 4 * int((~causal_mask(4, 4)).sum())
    assert attention_flops(2, 3, 3, 7, 5, causal=True) == 4 * 2 * 3 * 5 * int((~causal_mask(3, 7)).sum())


def test_guard_bands_name_a_write_past_the_end():
    from harness.checks import Guarded, guard_damage

    out = Guarded("out", (2, 3, 5, 4), device="cpu")
    assert torch.isnan(out.tensor).all() and out.tensor.is_contiguous() and guard_damage(out) is None
    out.tensor.fill_(1.0)
    end = out.tensor.numel()
    out.buffer[2 ** 16 + end: 2 ** 16 + end + 9] = 0.0  # 9 elements: three rows of 4, the last partly
    assert guard_damage(out).message.startswith("wrote 3 rows past the end of `out` (2 x 3 x 5 x 4)")


def test_guard_bands_name_a_write_before_the_start_and_a_changed_input():
    from harness.checks import Guarded, guard_damage

    q = Guarded("q", (4, 8), device="cpu", values=torch.randn(4, 8))
    q.buffer[2 ** 16 - 2] = 1.0
    assert "wrote 2 elements before the start of `q`" in guard_damage(q).message
    k = Guarded("k", (4, 8), device="cpu", values=torch.randn(4, 8))
    k.tensor[1, 1] += 1.0
    assert guard_damage(q, k).message.startswith("wrote 2 elements")  # the first damaged tensor is named
    assert "changed its input `k` (4 x 8): 1 element differs" in guard_damage(k).message


def test_a_shifted_tensor_starts_off_the_alignment_and_keeps_both_bands():
    from harness.checks import Guarded, guard_damage

    v = torch.randn(3, 8).to(torch.bfloat16)
    q = Guarded("q", (3, 8), device="cpu", values=v, dtype=torch.bfloat16, shift=1)
    assert q.tensor.data_ptr() % 16 == 2 and torch.equal(q.tensor, v) and guard_damage(q) is None
    q.buffer[2 ** 16] = 0.0  # the element the shift put in the band before
    assert "wrote 1 element before the start of `q`" in guard_damage(q).message
    out = Guarded("out", (3, 8), device="cpu", dtype=torch.bfloat16, shift=1)
    out.tensor.fill_(1.0)
    out.buffer[2 ** 16 + 1 + 24] = 0.0
    assert guard_damage(out).message.startswith("wrote 1 row past the end of `out`")


def test_a_nan_written_into_a_band_is_seen():
    from harness.checks import Guarded, guard_damage

    out = Guarded("out", (3,), device="cpu")
    out.buffer[-1] = float("nan")  # not the guard's own NaN
    assert "past the end of `out`" in guard_damage(out).message


def test_float32_gradients_measure_float32s_own_error_on_very_negative_scores():
    """The very-negative backward case's tolerance (checks/task4/backward.py) is twice this float32 error where that
    is more than 1e-3 of the largest value: the float32 run is a real float32 computation, not float64 cast."""
    from harness.attention_math import attention_gradients

    torch.manual_seed(0)
    q, k, v, d_out = (torch.randn(1, 2, 50, 64) for _ in range(4))
    q, k = q + 4.0, k - 4.0
    exact = attention_gradients(q, k, v, d_out, causal=True)
    single = attention_gradients(q, k, v, d_out, causal=True, dtype=torch.float32)
    for got, expected in zip(single, exact):
        assert got.dtype == torch.float32 and expected.dtype == torch.float64
        error = float((got.double() - expected).abs().max())
        assert 0 < error < 0.05 * float(expected.abs().max())


def test_a_grading_checks_each_16_bit_case_in_one_type_and_each_shape_in_both():
    """in_each_type: a student's run has every case in both types; a grading each case once, a shape checked causal
    and not in one type each, shapes with one case alternating, both types seen."""
    from harness import cli

    shapes = [(1, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    causal_ok = lambda s: s != (4, 5)  # noqa: E731  # one shape without its causal case
    cases_of = lambda name: cli.cases(4, "part", shapes, None, lambda s: f"{name} {s}", causal_ok=causal_ok)  # noqa: E731
    every = in_each_type(cases_of)
    assert len(every) == len(HALF_TYPES) * len(list(cases_of("x")))
    graded = in_each_type(cases_of, grading=True)
    assert len(graded) == len(list(cases_of("x")))
    types = {}
    for case, dtype in graded:
        types.setdefault(case.shape, []).append(dtype)
    assert all(sorted(map(str, t)) == sorted(map(str, HALF_TYPES.values())) for s, t in types.items() if causal_ok(s))
    assert {d for _, d in graded} == set(HALF_TYPES.values())
