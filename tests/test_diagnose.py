"""harness.diagnose: each common mistake, made in the reference by one change, is named with its step.

The known-bad functions run here directly (they are ours, made from the reference), on the
tasks' own shapes; two of them also go through the task's test and its worker, as a student's would.
"""

import importlib.util

import pytest

from harness.checks import compare, random_tensor
from harness.diagnose import diagnose
from harness.reference import attention_reference
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
    result = diagnose(1, compare(out, attention_reference(q, k, v, causal)[0], atol=ATOL, rtol=RTOL), out,
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
    from task1 import test as task1_test

    case = Case("steps", task1_test.STEP_CASES[1], check == "check_mask", 7, "cpu", "cpu cross")  # 5 queries, 12 keys
    right = getattr(task1_test, check)(Direct(importlib.import_module("task1.solution.attention")), case, [])
    assert right.passed, right.message
    result = getattr(task1_test, check)(Direct(load(tmp_path, 1, old, new)), case, [])
    assert not result.passed and result.message.startswith("looks like") and says in result.message
    assert f"see README, Task 1, step {step}." in result.message


TASK3 = [  # (old, new, causal, what the message says, step, of)
    ("s_ij = (q_i @ k_j.transpose(-2, -1)) * scale", "s_ij = q_i @ k_j.transpose(-2, -1)", True,
     "without the 1/sqrt(head_dim) scale", 3, "out"),
    ("s_ij = s_ij.masked_fill(cols > rows + offset, -math.inf)", "pass", True, "no causal mask at all", 3, "out"),
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
    want = attention_reference(q, k, v, causal)
    which = 1 if of == "lse" else 0
    result = diagnose(3, compare(got[which], want[which], atol=ATOL, rtol=RTOL), got[which], q, k, v, causal,
                      atol=ATOL, rtol=RTOL, tiles=(64, 64), of=of)
    assert not result.passed and result.message.startswith("looks like") and says in result.message
    assert f"see README, Task 3, step {step}." in result.message


def test_a_right_output_and_an_unrelated_error_get_no_diagnosis():
    q, k, v = inputs(1, 2, 9, 9, 8)
    right = attention_reference(q, k, v, True)[0]
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
    assert failed and all("acc not rescaled" in c["message"] and "Task 3, step 4" in c["message"] for c in failed)
