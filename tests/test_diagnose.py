"""harness.diagnose: each common mistake, made in the reference by one change, is named with its step.

The known-bad functions run here directly (they are ours, made from the reference), on the
tasks' own shapes; two of them also go through the task's test and its worker, as a student's would.
"""

import importlib.util
import math

import pytest
import torch

from harness.checks import compare, random_tensor
from harness.diagnose import diagnose
from harness.attention_math import attention_float64
from tests.conftest import bad_variant, needs_solution, run_test, submission

ATOL, RTOL = 2e-5, 1e-4


def load(tmp_path, task: int, old: str, new: str):
    path = tmp_path / f"task{task}_variant.py"
    path.write_text(bad_variant(task, "attention.py", old, new))
    spec = importlib.util.spec_from_file_location(f"task{task}_variant", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(batch, heads, seq_q, seq_k, head_dim, seed=5):
    return (random_tensor((batch, heads, seq_q, head_dim), seed), random_tensor((batch, heads, seq_k, head_dim), seed + 1),
            random_tensor((batch, heads, seq_k, head_dim), seed + 2))


TASK1 = [  # (old, new, causal, what the message says, step)
    ("return (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])", "return q @ k.transpose(-2, -1)", False,
     "without the 1/sqrt(head_dim) scale", 2),
    ("/ math.sqrt(q.shape[-1])", "/ q.shape[-1]", True, "scaled by 1/head_dim", 2),
    ("    return scores.masked_fill(future, float(\"-inf\"))", "    return scores", True, "no causal mask at all", 3),
    ("triu(diagonal=1 + seq_k - seq_q)", "triu(diagonal=1)", True, "aligned to the first key", 3),
    ("triu(diagonal=1 + seq_k - seq_q)", "triu(diagonal=2 + seq_k - seq_q)", True, "one future key", 3),
    ("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)", False, "softmax over the queries", 4),
]


@needs_solution(1)
@pytest.mark.parametrize("old, new, causal, says, step", TASK1)
def test_task1_mistakes_are_named_with_their_step(tmp_path, old, new, causal, says, step):
    student = load(tmp_path, 1, old, new)
    q, k, v = inputs(2, 4, 5, 33, 16)  # seq_q != seq_k: a mask aligned to the wrong end shows
    out = student.attention(q, k, v, causal=causal)
    result = diagnose(1, compare(out, attention_float64(q, k, v, causal)[0], atol=ATOL, rtol=RTOL), out,
                      q, k, v, causal, atol=ATOL, rtol=RTOL)
    assert not result.passed and result.message.startswith("looks like") and says in result.message
    assert f"see README, Task 1, step {step}." in result.message


class Direct:
    """A worker stand-in that calls a module's functions here: the checks' own code, without a process."""

    def __init__(self, module):
        self.module = module

    def call(self, name, *args):
        if name == "attention":
            return self.module.attention(*args[:3], causal=args[3])
        return getattr(self.module, name)(*args)


MASK = "triu(diagonal=1 + seq_k - seq_q)"
TASK1_STEPS = [  # (old, new, check, what the message says, step)
    ("return x.view(batch, seq, num_heads, hidden // num_heads).transpose(1, 2)",
     "return x.view(batch, num_heads, seq, hidden // num_heads)", "check_split", "without the transpose", 1),
    ("return (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])", "return q @ k.transpose(-2, -1)", "check_scores",
     "without the 1/sqrt(head_dim) scale", 2),
    ("/ math.sqrt(q.shape[-1])", "/ q.shape[-1]", "check_scores", "scaled by 1/head_dim", 2),
    ("    return scores.masked_fill(future, float(\"-inf\"))", "    return scores", "check_mask", "no causal mask", 3),
    (MASK, "triu(diagonal=1)", "check_mask", "aligned to the first key", 3),
    (MASK, "triu(diagonal=2 + seq_k - seq_q)", "check_mask", "one future key", 3),
    (MASK, "triu(diagonal=seq_k - seq_q)", "check_mask", "own key too", 3),
    (MASK, "tril(diagonal=seq_k - seq_q)", "check_mask", "turned around", 3),
    ("return x.transpose(1, 2).reshape(batch, seq, heads * head_dim)", "return x.reshape(batch, seq, heads * head_dim)",
     "check_merge", "without the transpose", 5),
]


@needs_solution(1)
@pytest.mark.parametrize("old, new, check, says, step", TASK1_STEPS)
def test_task1_steps_are_checked_one_by_one_and_their_mistakes_named(tmp_path, old, new, check, says, step):
    from harness.cli import Case
    from checks.task1 import test as task1_test

    case = Case("steps", task1_test.STEP_CASES[1], check == "check_mask", 7, "cpu", "cpu cross")  # 5 queries, 12 keys
    right = getattr(task1_test, check)(Direct(importlib.import_module("task1.solution.attention")), case, [])
    assert right.passed, right.message
    result = getattr(task1_test, check)(Direct(load(tmp_path, 1, old, new)), case, [])
    assert not result.passed and result.message.startswith("looks like") and says in result.message
    assert f"see README, Task 1, step {step}." in result.message


TASK3 = [  # (old, new, causal, what the message says, step, of)
    ("cap_scores((q_i @ k_j.transpose(-2, -1)) * scale, softcap)", "cap_scores(q_i @ k_j.transpose(-2, -1), softcap)",
     True, "without the 1/sqrt(head_dim) scale", 3, "out"),
    ("s = s.masked_fill(cols > rows + offset, -math.inf)", "pass", True, "no causal mask at all", 3, "out"),
    ("acc = correction[..., None] * acc + p_ij @ v_j", "acc = acc + p_ij @ v_j", False, "acc not rescaled", 4, "out"),
    ("l_i = correction * l_i + p_ij.sum(dim=-1)", "l_i = l_i + p_ij.sum(dim=-1)", True, "l_i not rescaled", 4, "out"),
    ("if causal else seq_k\n", "if causal else seq_k // block_cols * block_cols\n", False, "partial key tile", 2,
     "out"),
    ("lse[:, :, row_start:row_end] = m_i + torch.log(l_i)", "lse[:, :, row_start:row_end] = torch.log(l_i)", False,
     "without m_i", 5, "lse"),
]


@needs_solution(3)
@pytest.mark.parametrize("old, new, causal, says, step, of", TASK3)
def test_task3_mistakes_are_named_with_their_step(tmp_path, old, new, causal, says, step, of):
    student = load(tmp_path, 3, old, new)
    q, k, v = inputs(1, 2, 100, 300, 32)  # 300 keys: 4 full tiles of 64 and a partial one
    got = student.flash_attention(q, k, v, causal=causal, block_rows=64, block_cols=64, return_lse=True)
    want = attention_float64(q, k, v, causal)
    which = 1 if of == "lse" else 0
    result = diagnose(3, compare(got[which], want[which], atol=ATOL, rtol=RTOL), got[which], q, k, v, causal,
                      atol=ATOL, rtol=RTOL, tiles=(64, 64), of=of)
    assert not result.passed and result.message.startswith("looks like") and says in result.message
    assert f"see README, Task 3, step {step}." in result.message


def test_a_right_output_and_an_unrelated_error_get_no_diagnosis():
    q, k, v = inputs(1, 2, 9, 9, 8)
    right = attention_float64(q, k, v, True)[0]
    assert diagnose(1, compare(right, right, atol=ATOL, rtol=RTOL), right, q, k, v, True, atol=ATOL,
                    rtol=RTOL).message == "exact"  # no diagnosis
    noise = right + 0.01 * random_tensor(right.shape, 9, dtype=right.dtype)
    result = diagnose(1, compare(noise, right, atol=ATOL, rtol=RTOL), noise, q, k, v, True, atol=ATOL, rtol=RTOL)
    assert not result.passed and "looks like" not in result.message


@needs_solution(1)
def test_a_student_without_the_scale_is_told_so_by_the_task_test(tmp_path):
    sub = submission(tmp_path, {"task1/attention.py": bad_variant(1, "attention.py", *TASK1[0][:2])})
    record = run_test(1, sub, tmp_path)
    core = [c for c in record["cases"] if "attention core" in c["name"] and not c["passed"]]
    assert core and all("see README, Task 1, step 2" in c["message"] for c in core)


@needs_solution(3)
def test_a_student_without_the_rescale_is_told_so_by_the_task_test(tmp_path):
    sub = submission(tmp_path, {"task3/attention.py": bad_variant(3, "attention.py", *TASK3[2][:2])})
    record = run_test(3, sub, tmp_path)
    failed = [c for c in record["cases"] if c["kind"] == "check" and not c["passed"]]
    memory = [c for c in failed if "full score matrix" in c["name"]]  # its rows sampled: it points to the cases
    assert memory and "the value cases name a mistake they match" in memory[0]["message"]
    failed = [c for c in failed if c not in memory]
    assert failed and all("acc not rescaled" in c["message"] and "Task 3, step 4" in c["message"] for c in failed)


# -- the kernel tasks (2, 4, 5): what a kernel's slip does, simulated here one key at a time ---------------

def online_softmax(q, k, v, causal, rows_of, *, slip=None, scale=None, score=None):
    """Attention the way a kernel does it, in a plain loop independent of harness.diagnose: for every query,
    each state (a row's tiles, a decode block's groups, a split) folds in its keys one step at a time with
    a running maximum, then the states are merged exactly. rows_of(seq_k) -> [[keys of step 0, of step 1,
    ...] for each state]. slip "acc" or "l": that sum not rescaled when the maximum grows. score(i, j, s):
    the score a kernel computes for query i and key j (s: the right one), -inf when it masks the pair."""
    b, h, seq_q, d = q.shape
    seq_k = k.shape[-2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.empty(b, h, seq_q, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(seq_q):
                def s_of(j):
                    s = float(q[bi, hi, i].double() @ k[bi, hi, j].double()) * scale
                    if score is not None:
                        return score(i, j, s)
                    return -math.inf if causal and j > i + seq_k - seq_q else s
                merged = []
                for steps in rows_of(seq_k):
                    m, l, acc = -math.inf, 0.0, torch.zeros(d, dtype=torch.float64)
                    for keys in steps:
                        s = torch.tensor([s_of(j) for j in keys], dtype=torch.float64)
                        m_new = max(m, float(s.max()))
                        if m_new == -math.inf:
                            continue
                        alpha, p = math.exp(m - m_new), torch.exp(s - m_new)
                        l = (l if slip == "l" else l * alpha) + float(p.sum())
                        acc = (acc if slip == "acc" else acc * alpha) + p @ v[bi, hi, list(keys)].double()
                        m = m_new
                    merged.append((m, l, acc))
                top = max(m for m, _, _ in merged)
                if top == -math.inf:  # every key masked: 0/0, as a kernel computes it
                    out[bi, hi, i] = math.nan
                    continue
                out[bi, hi, i] = (sum(math.exp(m - top) * acc for m, _, acc in merged if m > -math.inf)
                                  / sum(math.exp(m - top) * l for m, l, _ in merged if m > -math.inf))
    return out.float()


def tiles(width):
    return lambda seq_k: [[range(t, min(seq_k, t + width)) for t in range(0, seq_k, width)]]


def groups(count, per_round, splits=1):
    """Task 5's layout: in each split, group g takes keys g, g + count, ..., per_round of them a step."""
    def rows_of(seq_k):
        size = -(-seq_k // splits)
        states = []
        for start in range(0, seq_k, size):
            for g in range(count):
                mine = list(range(start + g, min(seq_k, start + size), count))
                states.append([mine[r:r + per_round] for r in range(0, len(mine), per_round)] or [])
        return [s for s in states if s]
    return rows_of


def diagnosed(task, got, q, k, v, causal, **how):
    from harness.diagnose import diagnose
    right = attention_float64(q, k, v, causal, how.get("scale"))[0]
    result = diagnose(task, compare(got, right, atol=ATOL, rtol=RTOL, poisoned=True), got, q, k, v, causal,
                      atol=ATOL, rtol=RTOL, **how)
    assert not result.passed
    return result.message


@pytest.mark.parametrize("slip, says", [("acc", "acc not rescaled"), ("l", "l_i not rescaled")])
@pytest.mark.parametrize("causal", [False, True])
def test_task4_a_slip_in_the_online_softmax_is_named_under_the_kernels_tile_width(slip, says, causal):
    from harness.diagnose import tile_schedules
    q, k, v = inputs(1, 2, 40, 100, 16)
    got = online_softmax(q, k, v, causal, tiles(32), slip=slip)
    assert f"looks like {says}" in diagnosed(4, got, q, k, v, causal, schedules=tile_schedules(32))
    assert "step 4." in diagnosed(4, got, q, k, v, causal, schedules=tile_schedules(32))
    if slip == "l":  # under a tile width it was not given, l's slip is still seen: a factor per row
        said = diagnosed(4, got, q, k, v, causal, schedules=tile_schedules(48)[:1])
        assert "l (the row sum) wrong while acc is right" in said and "Task 4, step 4." in said
    else:
        assert "looks like" not in diagnosed(4, got, q, k, v, causal, schedules=tile_schedules(48)[:1])


def test_task4_the_last_partial_tile_unmasked_or_left_out_is_named():
    from harness.diagnose import tile_schedules
    q, k, v = inputs(1, 2, 30, 70, 8)  # 70 keys: a tile of 64 and one of 6
    padded = torch.cat([k, torch.zeros(1, 2, 58, 8)], dim=-2), torch.cat([v, torch.zeros(1, 2, 58, 8)], dim=-2)
    # the kernel's tile of 64 reads zeros past the end and scores them 0: one more state of 128 keys
    got = online_softmax(q, *padded, False, tiles(64), score=lambda i, j, s: 0.0 if j >= 70 else s)
    said = diagnosed(4, got, q, k, v, False, schedules=tile_schedules(64))
    assert "keys past seq_k in the last, partial tile not masked" in said and "Task 4, step 3." in said
    got = online_softmax(q, k, v, False, lambda seq_k: [[range(0, 64)]])
    said = diagnosed(4, got, q, k, v, False, schedules=tile_schedules(64))
    assert "the last, partial key tile left out" in said and "Task 4, step 1." in said
    q, k, v = q[..., :50, :], k[..., :50, :], v[..., :50, :]  # a single tile, partial: the same slip
    got = online_softmax(q, torch.cat([k, torch.zeros(1, 2, 14, 8)], dim=-2), torch.cat([v, torch.zeros(1, 2, 14, 8)],
                         dim=-2), False, tiles(64), score=lambda i, j, s: 0.0 if j >= 50 else s)
    assert "keys past seq_k in the last, partial tile" in diagnosed(4, got, q, k, v, False, schedules=tile_schedules(64))


@pytest.mark.parametrize("diagonal, says", [(0, "hides each query's own key too"), (2, "one future key")])
def test_task4_a_mask_off_by_one_is_named_and_its_computed_nan_rows_are_not_unwritten(diagonal, says):
    from harness.diagnose import tile_schedules
    q, k, v = inputs(2, 2, 50, 50, 16)
    # the kernel's own comparison: col > row + offset - 1 + diagonal hides the pair
    got = online_softmax(q, k, v, True, tiles(16), score=lambda i, j, s: -math.inf if j >= i + diagonal else s)
    said = diagnosed(4, got, q, k, v, True, schedules=tile_schedules(16))
    assert said.startswith(f"looks like a causal mask that {'lets' if diagonal else 'hides'}") and says in said
    assert "Task 4, step 3." in said
    if diagonal == 0:  # row 0 sees no key: 0/0
        assert "The rows that see no key at all come out NaN (0/0)" in said and "never written" not in said


@pytest.mark.parametrize("applied, says", [  # the scale a kernel really applied, from the 0.3 it was given
    (lambda s: s / math.log(2), "exp() over scores already scaled for exp2"),
    (lambda s: math.log(2), "exp2f() over scores that were never scaled"),
    (lambda s: s * s, "scaled by 1/head_dim"), (lambda s: 1.0, "without the 1/sqrt(head_dim) scale")])
def test_task4_a_scale_applied_wrong_is_named(applied, says):
    q, k, v = inputs(1, 2, 20, 20, 32)
    got = attention_float64(q * (applied(0.3) / 0.3), k, v, True, 0.3)[0].float()
    said = diagnosed(4, got, q, k, v, True, scale=0.3)
    assert says in said and "Task 4, step 3." in said


@pytest.mark.parametrize("slip, says", [("acc", "acc not rescaled"), ("l", "l_i not rescaled")])
@pytest.mark.parametrize("head_dim, splits", [(128, 1), (12, 1), (64, 3)])
def test_task5_a_slip_in_the_decode_is_named_under_its_warps_and_unroll(slip, says, head_dim, splits):
    from harness.diagnose import decode_schedules
    q, k, v = inputs(2, 2, 1, 300, head_dim)
    # DECODE_WARPS 2, UNROLL 2: a row read by G = head_dim / 4 lanes (rounded up to a power of two)
    per_warp = 32 // (1 << (head_dim // 4 - 1).bit_length())
    got = online_softmax(q, k, v, False, groups(2 * per_warp, 2, splits), slip=slip)
    schedules = decode_schedules({"DECODE_WARPS": 2, "UNROLL": 2}, head_dim, 300, splits)
    said = diagnosed(5, got, q, k, v, False, schedules=schedules, splits=splits)
    assert f"looks like {says}" in said and "Task 5, step 2." in said


def test_task5_a_decode_one_short_and_splits_without_their_weights_are_named():
    from harness.diagnose import decode_schedules
    q, k, v = inputs(1, 3, 1, 77, 16)
    short = attention_float64(q, k[:, :, :76], v[:, :, :76], False)[0]
    said = diagnosed(5, short, q, k, v, False, schedules=decode_schedules({}, 16, 77, 1))
    assert "decode over one position too few" in said and "Task 5, step 2." in said
    splits, size = 4, 20  # 77 keys: 20, 20, 20, 17
    parts = [attention_float64(q, k[:, :, s:s + size], v[:, :, s:s + size], False) for s in range(0, 77, size)]
    mean = sum(out for out, _ in parts) / splits
    said = diagnosed(5, mean, q, k, v, False, splits=splits)
    assert "averaged without their log-sum-exp weights" in said and "Task 5, step 3." in said
    top = torch.stack([lse for _, lse in parts]).amax(dim=0)
    unnormalised = sum(out * torch.exp(lse - top)[..., None] for out, lse in parts)
    said = diagnosed(5, unnormalised, q, k, v, False, splits=splits)
    assert "not divided by the weights' sum" in said and "Task 5, step 3." in said


def test_task2_attention_without_scale_and_mask_is_named():
    q, k, v = inputs(1, 2, 9, 12, 8)
    got = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
    for causal in (False, True):
        said = diagnosed(2, got, q, k, v, causal)
        assert "neither scaled nor masked" in said and "Task 2, step 5." in said


def test_a_noisy_or_unrelated_kernel_output_gets_no_kernel_diagnosis():
    from harness.diagnose import decode_schedules, tile_schedules
    q, k, v = inputs(1, 2, 40, 100, 16)
    right = attention_float64(q, k, v, True)[0]
    noise = right + 0.01 * random_tensor(right.shape, 9, dtype=right.dtype)
    assert "looks like" not in diagnosed(4, noise, q, k, v, True, schedules=tile_schedules(64))
    q1 = q[:, :, :1]
    right = attention_float64(q1, k, v, False)[0]
    other = right.flip(-1)
    assert "looks like" not in diagnosed(5, other, q1, k, v, False, splits=3,
                                         schedules=decode_schedules({}, 16, 100, 3))


def test_zeros_a_flipped_sign_or_noise_are_not_called_a_wrong_row_sum():
    q, k, v = inputs(1, 2, 20, 40, 16)
    right = attention_float64(q, k, v, False)[0]
    for wrong in (torch.zeros_like(right), -right, right * 1e-6):
        assert "looks like" not in diagnosed(4, wrong, q, k, v, False)
    rows = torch.rand(*right.shape[:-1], 1, dtype=right.dtype) * 0.5 + 0.25  # each row scaled: l is off
    assert "l (the row sum) wrong while acc is right" in diagnosed(4, right * rows, q, k, v, False)


@pytest.mark.parametrize("causal", [False, True])
def test_task4_a_slip_in_a_padded_batch_is_named_in_the_sequence_that_shows_it(causal):
    """Left padding: each sequence is its own problem (its keys tiled from its first real one), so the slip is
    modelled there, and the sequence is named."""
    from harness.diagnose import diagnose_sequences, tile_schedules
    from checks.task4.forward import padded_spans

    q, k, v = inputs(2, 2, 40, 100, 16)
    starts = [0, 75]  # sequence 1: 25 real keys
    got = torch.zeros(2, 2, 40, 16)
    for b, (row, first, end) in enumerate(padded_spans(starts, 40, 100)):
        got[b:b + 1, :, row:] = online_softmax(q[b:b + 1, :, row:], k[b:b + 1, :, first:end],
                                               v[b:b + 1, :, first:end], causal, tiles(8), slip="acc")
    key_start = torch.tensor(starts, dtype=torch.int32)
    right = attention_float64(q, k, v, causal, None, key_start)[0]
    result = diagnose_sequences(4, compare(got, right, atol=ATOL, rtol=RTOL), got, q, k, v, causal,
                                padded_spans(starts, 40, 100), atol=ATOL, rtol=RTOL,
                                schedules_for=lambda keys: tile_schedules(8))
    assert result.message.startswith("looks like acc not rescaled") and "Task 4, step 4." in result.message
    assert "(sequence 0, whose keys are 0 .. 99)" in result.message, result.message
    # the first sequence right: the second is the one diagnosed, over its own 25 keys
    got[0] = right[0]
    result = diagnose_sequences(4, compare(got, right, atol=ATOL, rtol=RTOL), got, q, k, v, causal,
                                padded_spans(starts, 40, 100), atol=ATOL, rtol=RTOL,
                                schedules_for=lambda keys: tile_schedules(8), step=10)
    # its first 15 queries would see only padding (75 - (100 - 40)): zeros, causal or not
    assert "(sequence 1, whose keys are 75 .. 99 and queries 15 on)" in result.message, result.message
    assert "acc not rescaled" in result.message and "Task 4, step 10." in result.message  # an optional part's step


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_right_16_bit_output_that_just_misses_its_allowance_gets_no_diagnosis(dtype):
    """A mistake that does not show on the inputs (acc not rescaled over one tile of 128 keys) must not be named for
    a right output that misses the tolerance by a hair (found by a review: 0.9 ulp was called 'acc not rescaled')."""
    from harness.diagnose import tile_schedules
    q, k, v = (t.to(dtype) for t in inputs(2, 4, 100, 100, 64))
    right = attention_float64(q, k, v, False)[0]
    eps = torch.finfo(dtype).eps
    got = right * (1 + 0.9 * eps * torch.sign(torch.randn_like(right)))
    allowed = 0.1 * eps  # an allowance the output misses
    result = diagnose(4, compare(got, right, atol=allowed, rtol=0.0), got, q, k, v, False, atol=allowed, rtol=eps,
                      schedules=tile_schedules(128), step=10)
    assert not result.passed and "looks like" not in result.message, result.message
