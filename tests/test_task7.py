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
from common.torch_kernels import PyTorchKernels
from task7 import gpt2
from checks.task7 import test as task7_test
from tests.conftest import REPO, bad_variant, needs_solution, run_test, submission

pytestmark = needs_solution(7)


class AttentionOf:
    """A plain attention(q, k, v, causal) playing the three kernels (decode slices the cache); no padding."""

    def __init__(self, attention):
        self.plain = attention
        self.calls = []

    def attention(self, q, k, v, causal, key_start=None):
        assert key_start is None, "an unpadded batch must reach the kernels without key_start"
        return self.plain(q, k, v, causal)

    def decode(self, q, k_cache, v_cache, length, key_start=None):
        self.calls.append(("decode", q.shape[2], length))
        return self.attention(q, k_cache[:, :, :length], v_cache[:, :, :length], False, key_start)


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
    ours = gpt2.random_model(config, seed=1)
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


class Recording(PyTorchKernels):
    """PyTorch playing the kernels, keeping each call's key_start."""

    def __init__(self):
        self.starts = []

    def attention(self, q, k, v, causal, key_start=None):
        self.starts.append(("attention", k.shape[1], None if key_start is None else key_start.tolist()))
        return super().attention(q, k, v, causal, key_start)

    def decode(self, q, k_cache, v_cache, length, key_start=None):
        self.starts.append(("decode", k_cache.shape[1], None if key_start is None else key_start.tolist()))
        return PyTorchKernels().decode(q, k_cache, v_cache, length, key_start)  # not through self.attention


@pytest.mark.parametrize("config", [gpt2.SMALL, gpt2.LLAMA_SMALL], ids=["gpt2", "llama"])
def test_a_padded_batch_reaches_the_kernels_as_each_sequences_first_key(config):
    from task7.solution.attention import kernel_attention

    kernels = Recording()
    model = gpt2.use_kernels(gpt2.random_model(config, seed=2), kernel_attention, kernels)
    ids, mask = gpt2.left_pad([torch.arange(1, 4), torch.arange(1, 6)], pad_id=0)  # 3 and 5 tokens
    gpt2.greedy(model, ids, 2, mask)
    kv_heads = config.get("num_key_value_heads", config.get("n_head"))
    assert kernels.starts[0] == ("attention", kv_heads, [2, 0])  # the prompt: two padding tokens before the first
    assert kernels.starts[-1] == ("decode", kv_heads, [2, 0])  # a step: the same first keys
    kernels.starts.clear()
    gpt2.greedy(model, ids[1:], 2)  # one prompt, no padding: no key_start
    assert {s[2] for s in kernels.starts} == {None}


def test_key_start_of_reads_left_padding_and_refuses_other_masks():
    causal = torch.ones(4, 6, dtype=torch.bool).tril(2).expand(2, 1, 4, 6)
    assert gpt2.key_start_of(causal, 4, 6) is None
    assert gpt2.key_start_of(torch.zeros(2, 1, 4, 6).masked_fill(~causal, -torch.inf), 4, 6) is None  # additive
    padded = causal.clone()
    padded[1, :, :, :3] = False  # keys 0-2 of sequence 1 are padding (and so is its first query, at position 2)
    assert gpt2.key_start_of(padded, 4, 6).tolist() == [0, 3]
    assert gpt2.key_start_of(torch.ones(3, 1, 1, 9, dtype=torch.bool), 1, 9) is None
    holed = padded.clone()
    holed[0, :, 3:, 1] = False  # a key in the middle: not left padding
    with pytest.raises(ValueError, match="padded on the left"):
        gpt2.key_start_of(holed, 4, 6)
    future = causal.clone()
    future[0, :, 0, 5] = True  # a query seeing its future
    with pytest.raises(ValueError, match="padded on the left"):
        gpt2.key_start_of(future, 4, 6)


def test_missing_weights_are_one_clear_paragraph(tmp_path, capsys):
    from task7 import inference

    assert inference.main(["--model", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert "no such folder" in err and "Traceback" not in err
    with pytest.raises(gpt2.WeightsMissing, match="python -c"):
        gpt2.pretrained(str(_empty_model_folder(tmp_path)), download=False)


def test_a_checkpoint_not_in_the_cache_is_not_asked_of_the_network(monkeypatch):
    # transformers retries the hub for ~25 s per model where there is no network, even when told
    # local_files_only on some versions: without download, a model not in the cache must not reach it
    import transformers

    def no_network(*args, **kwargs):
        raise AssertionError("from_pretrained was called for a model that is not in the cache")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_network)
    with pytest.raises(gpt2.WeightsMissing, match="not in the Hugging Face cache"):
        gpt2.pretrained(name="nobody/no-such-model", download=False)


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

    model = gpt2.random_model(gpt2.SMALL, seed=3)
    monkeypatch.setattr(gpt2, "pretrained",
                        lambda path=None, download=True, name="gpt2": (copy.deepcopy(model), Tokenizer()))
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
    ("out = kernels.decode(q, k, v, k.shape[2], key_start)", "out = kernels.decode(q, k, v, k.shape[2] - 1, key_start)",
     "small GPT-2: batch 2", "decode step 1"),
    ('bool(getattr(module, "is_causal", True))', "False", "small GPT-2: batch 2", "in the prompt"),
    ("key_start = None if attention_mask is None else key_start_of(attention_mask, q_len, kv_len, window_left)",
     "key_start = None", "small GPT-2, padded", "logits"),
    # Gemma 2's soft-capped scores taken on a new token without a word (the decode does not soft-cap): wrong logits
    ("    if softcap and q_len != kv_len:\n", "    if False:\n", "refuses",
     "soft-capped scores on a new token: no error was raised"),
])
def test_known_bad_functions_fail(tmp_path, old, new, case_words, words):
    text = bad_variant(7, "attention.py", old, new)
    record = run_test(7, submission(tmp_path, {"task7/attention.py": text}), tmp_path)
    assert record["status"] == "failed"
    case = next(c for c in record["cases"] if case_words in c["name"])
    assert not case["passed"] and words in case["message"], case["message"]


@pytest.mark.parametrize("old, new, case_words", [
    # the window one key too wide (sliding_window where window_left is sliding_window - 1): Mistral's logits move
    ("window_left = window - 1 if window", "window_left = window if window", "Mistral-style"),
    # softcap read but never passed on: Gemma 2's scores uncapped
    ('("softcap", softcap or None)', '("softcap", None)', "small Gemma 2 ("),
    # a new token's window not cut out of a cache that holds more: the decode sees every earlier key
    ("        if window_left is not None:  # the new token", "        if False:  # the new token", "over 20 keys"),
])
def test_known_bad_step_4_fails_its_optional_part_only(tmp_path, old, new, case_words):
    """Step 4 (optional) wrong: its model fails with the step named, and the grade does not move."""
    text = bad_variant(7, "attention.py", old, new)
    record = run_test(7, submission(tmp_path, {"task7/attention.py": text}), tmp_path)
    case = next(c for c in record["cases"] if case_words in c["name"])
    assert case["kind"] == "optional" and not case["passed"] and "step 4" in case["message"], case
    assert all(c["passed"] for c in record["cases"] if c["kind"] != "optional"), [
        c["name"] for c in record["cases"] if not c["passed"]]


def test_the_skeletons_step_4_refuses_the_masked_models_as_not_implemented(tmp_path):
    """A student who wrote steps 1-3 alone: the scored part passes, and step 4's models say it is not written."""
    import re

    from harness.skeleton import make_skeleton

    text = (REPO / "task7/solution/attention.py").read_text()
    begin = text.index('    # BEGIN SOLUTION "step 4:')
    end = text.index("    # END SOLUTION\n", begin) + len("    # END SOLUTION\n")
    text = text[:begin] + make_skeleton(text[begin:end], 7, "#") + text[end:]  # step 4 as the skeleton has it
    text = re.sub(r"(?m)^\s*# (BEGIN|END) SOLUTION.*\n", "", text)  # steps 1-3 the reference's
    record = run_test(7, submission(tmp_path, {"task7/attention.py": text}), tmp_path)
    optional = [c for c in record["cases"] if c["kind"] == "optional"]
    assert all(c["passed"] for c in record["cases"] if c["kind"] != "optional"), record["cases"]
    assert optional and all("step 4" in c["message"] for c in optional if not c["passed"]), optional
    assert any("not implemented yet: see README, Task 7, step 4" in c["message"] for c in optional), optional


def test_a_new_tokens_window_is_the_last_keys_when_the_cache_holds_more():
    """transformers' sliding-window caches hand a new token the window's keys alone; a cache that holds more (a
    static one) must give the same: the decode over the last sliding_window keys, padding moved with them."""
    from types import SimpleNamespace

    from task7.solution.attention import kernel_attention

    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, n, 16, generator=generator) for n in (1, 20, 20))
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()  # 2 key/value heads
    module = SimpleNamespace(is_causal=True, scaling=16 ** -0.5, training=False)
    allowed = torch.ones(2, 1, 1, 20, dtype=torch.bool)
    allowed[1, ..., :15] = False  # sequence 1: 15 tokens of padding, 5 real ones inside the window of 8
    allowed[0, ..., :12] = False  # sequence 0: the window's 8 keys alone (12 before it hidden by the window)
    out, _ = kernel_attention(module, q, k, v, allowed, dropout=0.0, kernels=PyTorchKernels(), sliding_window=8)
    for b, first in ((0, 12), (1, 15)):
        want = PyTorchKernels().attention(q[b:b + 1], k[b:b + 1, :, first:].contiguous(),
                                          v[b:b + 1, :, first:].contiguous(), False)
        assert torch.allclose(out[b:b + 1].transpose(1, 2), want, atol=1e-6), b
