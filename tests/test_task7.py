"""Task 7 without a GPU: GPT-2's attention routed through the course's function, with PyTorch attentions inside.

The integration (transformers' AttentionInterface, its mask for the registered name, the
prompt and decode phases, `scaling`) is tested here with task 1's and task 3's reference
attentions plugged in where the CUDA kernels go; the task's test runs the student's function
in its worker, and known-bad functions get a checked verdict. Tests never download: the
models are small random GPT-2s built from a config.
"""

import copy

import pytest
import torch

from harness.checks import compare_logits
from task7 import gpt2
from task7 import test as task7_test
from tests.conftest import bad_variant, needs_solution, run_test, submission

pytestmark = needs_solution(7)


class AttentionOf:
    """A plain attention(q, k, v, causal) playing the three kernels (decode slices the cache)."""

    def __init__(self, attention):
        self.attention = attention
        self.calls = []

    def decode(self, q, k_cache, v_cache, length):
        self.calls.append(("decode", q.shape[2], length))
        return self.attention(q, k_cache[:, :, :length], v_cache[:, :, :length], False)


def task1_kernels():
    from task1.solution.attention import attention

    return AttentionOf(attention)


def task3_kernels():
    from task3.solution.attention import flash_attention

    return AttentionOf(lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, block_rows=4, block_cols=3))


@pytest.mark.parametrize("kernels", [task1_kernels, task3_kernels])
@pytest.mark.parametrize("extra", [{}, {"scale_attn_by_inverse_layer_idx": True}])
def test_gpt2_generates_the_same_with_tasks_1_and_3_inside(kernels, extra):
    from task7.solution.attention import kernel_attention

    config = gpt2.SMALL | extra
    ours = gpt2.random_gpt2(config, seed=1)
    reference = task7_test.reference_of(ours, "cpu")
    stand_in = kernels()
    gpt2.use_kernels(ours, kernel_attention, stand_in)
    prompt = torch.randint(0, config["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = ours.generate(prompt, max_new_tokens=9, min_new_tokens=9, do_sample=False, pad_token_id=0,
                            return_dict_in_generate=True, output_logits=True)
        tokens = out.sequences[:, 6:]
        expected = reference(torch.cat((prompt, tokens), dim=1)).logits[:, 5:-1]
    passed, message, _ = compare_logits(torch.stack(out.logits, dim=1), expected, 6, first=5)
    assert passed, message
    decodes = [c for c in stand_in.calls if c[0] == "decode"]
    assert len(decodes) == 8 * config["n_layer"] and decodes[-1] == ("decode", 1, 14)  # one token over 14 cached


def test_a_padded_batch_reaches_the_function_as_a_mask_and_is_refused():
    from task7.solution.attention import kernel_attention

    model = gpt2.use_kernels(gpt2.random_gpt2(gpt2.SMALL, seed=2), kernel_attention, task1_kernels())
    prompt = torch.randint(0, 1000, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, :2] = 0
    with torch.no_grad(), pytest.raises(ValueError, match="padding"):
        model.generate(prompt, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0)
    with torch.no_grad():  # the same batch without padding: no mask, no refusal
        model.generate(prompt, attention_mask=torch.ones_like(mask), max_new_tokens=2, do_sample=False, pad_token_id=0)


def test_hides_only_the_future():
    causal = torch.ones(4, 6, dtype=torch.bool).tril(2).expand(2, 1, 4, 6)
    assert gpt2.hides_only_the_future(causal, 4, 6)
    assert gpt2.hides_only_the_future(torch.zeros(2, 1, 4, 6).masked_fill(~causal, -torch.inf), 4, 6)
    padded = causal.clone()
    padded[1, :, :, 0] = False
    assert not gpt2.hides_only_the_future(padded, 4, 6)
    assert gpt2.hides_only_the_future(torch.ones(3, 1, 1, 9, dtype=torch.bool), 1, 9)


def test_missing_weights_are_one_clear_paragraph(tmp_path, capsys):
    from task7 import inference

    assert inference.main(["--model", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert "no such folder" in err and "Traceback" not in err
    with pytest.raises(gpt2.WeightsMissing, match="python -c"):
        gpt2.pretrained(str(_empty_model_folder(tmp_path)), download=False)


def _empty_model_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    return folder


def test_the_demo_generates_and_times_with_the_function(monkeypatch, capsys):
    from task7 import inference

    class Tokenizer:  # ids in, ids out: no vocabulary files needed
        def __call__(self, text, return_tensors):
            return type("Encoded", (), {"input_ids": torch.tensor([[1, 2, 3]])})

        def decode(self, ids):
            return " ".join(map(str, ids.tolist()))

    model = gpt2.random_gpt2(gpt2.SMALL, seed=3)
    monkeypatch.setattr(gpt2, "pretrained", lambda path=None, download=True: (copy.deepcopy(model), Tokenizer()))
    assert inference.main(["--solution", "--max-new-tokens", "5"]) == 0
    ours = capsys.readouterr().out
    assert "5 tokens" in ours and "ms per token" in ours and "PyTorch in place of the kernels" in ours
    from task7 import inference_ref

    assert inference_ref.main(["--max-new-tokens", "5"]) == 0
    theirs = capsys.readouterr().out
    assert ours.splitlines()[0] == theirs.splitlines()[0]  # the same greedy text either way
    assert inference.main(["--max-new-tokens", "0"]) == 2


def test_reference_passes_and_skeleton_names_step_1(tmp_path, capsys):
    assert task7_test.main(["--solution", "--scratch", str(tmp_path)]) == 0
    assert task7_test.main(["--scratch", str(tmp_path)]) == 1
    assert "not implemented yet: see README, Task 7, step 1" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, case_words, words", [
    ("        query = query * (scaling * head_dim ** 0.5)\n", "        pass\n", "scale", "decode step"),
    ("out = kernels.decode(q, k, v, kv_len)", "out = kernels.decode(q, k, v, kv_len - 1)", "small GPT-2: batch 2",
     "decode step 1"),
    ('bool(getattr(module, "is_causal", True))', "False", "small GPT-2: batch 2", "in the prompt"),
    ("    if attention_mask is not None and not hides_only_the_future(attention_mask, q_len, kv_len):",
     "    if False:", "refuses", "padding"),
])
def test_known_bad_functions_fail(tmp_path, old, new, case_words, words):
    text = bad_variant(7, "attention.py", old, new)
    record = run_test(7, submission(tmp_path, {"task7/attention.py": text}), tmp_path)
    assert record["status"] == "failed"
    case = next(c for c in record["cases"] if case_words in c["name"])
    assert not case["passed"] and words in case["message"], case["message"]
