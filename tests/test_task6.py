"""Task 6 without a GPU: the small LLM's prefill/decode logic, with PyTorch in place of the kernels.

The model (task6/model.py) with the reference attention runs here at a tiny size; the
task's test runs the student's attention in its worker, and known-bad attentions (wrong
positions, a decode over one position too few, a prefill that never fills the cache, a
cache length never advanced, PyTorch's own attention) get a checked verdict.
"""

import dataclasses

import pytest
import torch

from harness.checks import compare_logits
from common.torch_kernels import PyTorchKernels
from checks.task6 import measure as task6_measure
from checks.task6 import test as task6_test
from task6.model import SIZES, Rope, SmallLM
from tests.conftest import bad_variant, needs_solution, run_test, submission

pytestmark = needs_solution(6)
TINY = SIZES["tiny"]
GROUPED = dataclasses.replace(TINY, kv_heads=2)


def model_and_reference(config=TINY, seed=3):
    from task6.solution.attention import CachedAttention

    model = SmallLM(config, CachedAttention, PyTorchKernels(), seed=seed)
    return model, task6_test.reference_model(config, seed, "cpu")


def teacher_forced(model, tokens, prompt_len):
    with torch.no_grad():
        cache = model.new_cache(tokens.shape[0])
        logits = [model(tokens[:, :prompt_len], cache)]
        logits += [model(tokens[:, i:i + 1], cache) for i in range(prompt_len, tokens.shape[1])]
    return torch.cat(logits, dim=1), cache


@pytest.mark.parametrize("prompt_len, steps", [(5, 7), (1, 23), (24, 0), (23, 1)])
def test_cached_generation_matches_recomputing_the_sequence(prompt_len, steps):
    model, reference = model_and_reference()
    tokens = torch.randint(0, TINY.vocab, (2, prompt_len + steps), generator=torch.Generator().manual_seed(0))
    got, cache = teacher_forced(model, tokens, prompt_len)
    with torch.no_grad():
        expected = reference(tokens)
    passed, message, _ = compare_logits(got, expected, prompt_len)
    assert passed, message
    assert [c.length for c in cache] == [prompt_len + steps] * TINY.layers


def test_rope_turns_each_pair_by_its_angle():
    """The given RoPE against its definition, computed here pair by pair in float64."""
    head_dim, base = 8, 10000.0
    rope = Rope(head_dim, 50, base, dtype=torch.float64)
    x = torch.randn(2, 3, 4, head_dim, dtype=torch.float64)
    positions = torch.tensor([0, 7, 31, 49])
    got = rope(x, positions)
    for i in range(head_dim // 2):
        angle = positions.double() * base ** (-2 * i / head_dim)
        a, b = x[..., i], x[..., i + head_dim // 2]
        torch.testing.assert_close(got[..., i], a * angle.cos() - b * angle.sin())
        torch.testing.assert_close(got[..., i + head_dim // 2], a * angle.sin() + b * angle.cos())
    # what attention relies on: a query-key score depends on their distance only
    q, k = torch.randn(head_dim, dtype=torch.float64), torch.randn(head_dim, dtype=torch.float64)
    at = lambda v, p: rope(v.view(1, 1, 1, -1), torch.tensor([p])).flatten()  # noqa: E731
    assert torch.allclose(at(q, 9) @ at(k, 4), at(q, 30) @ at(k, 25))


def test_generate_is_greedy_over_the_cache():
    model, reference = model_and_reference()
    prompt = torch.randint(0, TINY.vocab, (3, 6), generator=torch.Generator().manual_seed(1))
    new = model.generate(prompt, 10)
    with torch.no_grad():
        logits = reference(torch.cat((prompt, new[:, :-1]), dim=1))[:, prompt.shape[1] - 1:]
    assert new.shape == (3, 10) and torch.equal(new, logits.argmax(dim=-1))


def test_a_padded_grouped_batch_generates_what_each_sequence_generates_alone():
    """Prompts of 6, 2 and 9 tokens padded on the left to 9 (random padding tokens: they take no weight),
    in a model with 4 query heads over 2 key/value heads."""
    model, reference = model_and_reference(GROUPED)
    prompt = torch.randint(0, GROUPED.vocab, (3, 9), generator=torch.Generator().manual_seed(4))
    padding = torch.tensor([3, 7, 0])
    new = model.generate(prompt, 8, key_start=padding)
    for b, pad in enumerate(padding.tolist()):
        alone = torch.cat((prompt[b:b + 1, pad:], new[b:b + 1, :-1]), dim=1)
        with torch.no_grad():
            expected = reference(alone)[0, -8:].argmax(-1)
        assert torch.equal(new[b], expected), b


def test_a_grouped_model_holds_fewer_key_value_weights():
    model, _ = model_and_reference(GROUPED)
    assert sum(p.numel() for p in model.parameters()) == GROUPED.parameters()
    assert model.new_cache(1)[0].k.shape == (1, 2, GROUPED.max_seq, GROUPED.head_dim)
    with pytest.raises(ValueError, match="kv_heads must be a positive int dividing heads = 4, got 3"):
        dataclasses.replace(TINY, kv_heads=3)
    assert dataclasses.replace(TINY, heads=2).key_value_heads == 2  # unset, it follows heads


@pytest.mark.parametrize("key_start", [torch.tensor([True, False]), torch.tensor([2**32 + 1, 0]),
                                       torch.tensor([-1, 0]), torch.tensor([1.0, 0.0]), torch.tensor([1, 2, 3]), [1, 0]])
def test_padding_that_is_not_one_int_in_the_cache_per_sequence_is_refused(key_start):
    model, _ = model_and_reference()
    with pytest.raises(ValueError, match="key_start must hold one int from 0 to max_seq = 24 per sequence"):
        model.new_cache(2, key_start)


def test_a_full_cache_and_bad_tokens_raise_clear_errors():
    model, _ = model_and_reference()
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.zeros(1, TINY.max_seq, dtype=torch.long), cache)  # fills it exactly
        with pytest.raises(ValueError, match="the cache is full: it holds max_seq = 24 positions, 24 written"):
            model(torch.zeros(1, 1, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="decode one token at a time"):
            model(torch.zeros(1, 2, dtype=torch.long), _after_prompt(model))
        with pytest.raises(ValueError, match="torch.long"):
            model(torch.zeros(1, 3), model.new_cache(1))
        with pytest.raises(ValueError, match="the tokens' batch 2"):
            model(torch.zeros(2, 3, dtype=torch.long), model.new_cache(1))


def _after_prompt(model):
    cache = model.new_cache(1)
    model(torch.zeros(1, 3, dtype=torch.long), cache)
    return cache


def test_the_kernels_stand_in_refuses_what_the_bindings_refuse():
    kernels = PyTorchKernels()
    cache = torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match="pos \\+ n_new must be at most max_seq = 8"):
        kernels.update_cache(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4), cache, cache.clone(), 7)
    with pytest.raises(ValueError, match="length must be between 1 and max_seq = 8"):
        kernels.decode(torch.zeros(1, 2, 1, 4), cache, cache, 9)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.attention(torch.zeros(1, 2, 4, 3).transpose(2, 3), cache, cache, True)


def test_a_decode_step_hands_its_rows_to_the_linear_kernel_and_the_prefill_does_not():
    """SmallLM.set_linear: every projection of a decode step (batch rows) goes to the kernel, the prefill's
    many rows to F.linear; the logits are those of F.linear, and a kernel that writes something else shows."""
    model, _ = model_and_reference()
    tokens = torch.randint(0, TINY.vocab, (2, 9), generator=torch.Generator().manual_seed(5))
    expected, _ = teacher_forced(model, tokens, 6)
    calls = []

    def rows_kernel(x, weight, out):
        assert x.is_contiguous() and x.shape == (2, weight.shape[1]) and out.shape == (2, weight.shape[0])
        calls.append(weight.shape)
        torch.mm(x, weight.t(), out=out)
    model.set_linear(rows_kernel, max_rows=2)
    got, _ = teacher_forced(model, tokens, 6)
    projections = 4 * TINY.layers + 1  # qkv, o, gate_up, down per layer, then the LM head
    assert len(calls) == 3 * projections  # the three decode steps, none of the prefill
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)

    model.set_linear(lambda x, weight, out: out.zero_(), max_rows=2)  # a kernel that computes nothing
    wrong, _ = teacher_forced(model, tokens, 6)
    assert torch.allclose(wrong[:, :6], expected[:, :6], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(wrong[:, 6:], expected[:, 6:], atol=1e-3)
    model.set_linear(None, 0)
    assert torch.equal(teacher_forced(model, tokens, 6)[0], expected)


def test_weights_are_the_seeds_and_shared_without_copies():
    a, b = (SmallLM(TINY, task6_measure.FullAttention, seed=5) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    shared = SmallLM(TINY, task6_measure.SdpaCachedAttention, device="meta").share_weights(a)
    assert shared.head.weight.data_ptr() == a.head.weight.data_ptr()
    assert sum(p.numel() for p in a.parameters()) == TINY.parameters()
    assert 25e9 < SIZES["handout"].parameters() * 4 < 27e9  # "about 26 GB of float32 weights"


@pytest.mark.parametrize("config", [TINY, GROUPED], ids=["heads", "grouped"])
def test_the_sdpa_baseline_with_a_cache_matches_the_reference(config):
    model, reference = model_and_reference(config)
    sdpa = SmallLM(config, task6_measure.SdpaCachedAttention, device="meta").share_weights(model)
    tokens = torch.randint(0, config.vocab, (2, 12), generator=torch.Generator().manual_seed(2))
    got, _ = teacher_forced(sdpa, tokens, 7)
    passed, message, _ = compare_logits(got, reference(tokens).detach(), 7)
    assert passed, message


def test_reference_passes_and_skeleton_names_step_1(tmp_path, capsys):
    assert task6_test.main(["--solution", "--json", str(tmp_path / "r.json"), "--scratch", str(tmp_path)]) == 0
    assert task6_test.main(["--scratch", str(tmp_path)]) == 1
    assert "not implemented yet: see README, Task 6, step 1" in capsys.readouterr().out


def variant_record(tmp_path, old, new):
    return run_test(6, submission(tmp_path, {"task6/attention.py": bad_variant(6, "attention.py", old, new)}), tmp_path)


@pytest.mark.parametrize("old, new, words", [
    ("start[:, None] + torch.arange", "0 * start[:, None] + torch.arange", "decode step 1 after a prompt"),
    ("cache.lengths + 1, ", "cache.lengths, ", "decode step 1 after a prompt"),
    ("        self.kernels.update_cache(k, v, cache.k, cache.v, 0)\n", "", "decode step 1 after a prompt"),
    ("        cache.length += x.shape[1]\n", "", "must set cache.length"),
    # a padded batch whose padding takes weight, in the prefill or in the decode
    ("attention(q, k, v, True, cache.key_start)", "attention(q, k, v, True)",
     "sequence 1 (a prompt of 6 tokens after 3 of padding), against itself alone, positions"),
    ("cache.lengths + 1, cache.key_start)", "cache.lengths + 1)", "decode step 1 after a prompt of 6"),
])
def test_known_bad_attention_fails_with_the_step(tmp_path, old, new, words):
    record = variant_record(tmp_path, old, new)
    assert record["status"] == "failed"
    cpu = [c for c in record["cases"] if c["kind"] == "check"]
    assert cpu and not all(c["passed"] for c in cpu)
    assert any(words in c["message"] for c in cpu), [c["message"] for c in cpu]


def test_pytorch_attention_in_the_attention_breaks_the_rule(tmp_path):
    record = variant_record(tmp_path, "        return self.kernels.attention(q, k, v, True, cache.key_start)\n",
                            "        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)\n")
    rule = next(c for c in record["cases"] if c["kind"] == "rule")
    assert not rule["passed"] and "scaled_dot_product_attention" in rule["message"]


@pytest.mark.parametrize("baselines", [True, False])
def test_the_generation_run_checks_and_times_on_the_cpu(tmp_path, baselines):
    """The handout run's code path at a tiny size: the worker's tokens and logits, checked; the baselines
    (which the grader leaves out)."""
    from harness.records import Report
    from harness.sandbox import Worker
    from tests.conftest import REPO

    report = Report(6, True, "generation on the CPU", REPO)
    run = task6_measure.Run(batch=2, prompt=10, steps=8, device="cpu")
    with Worker(6, REPO, solution=True, scratch=tmp_path, cuda=False) as worker:
        worker.start()
        task6_measure.run_generation(report, worker, "tiny", TINY, run, seed=4, copy_gbs=1e12, baselines=baselines)
    (case,) = report.cases
    assert case.kind == "benchmark" and case.passed, case.message
    assert {"ttft_ms", "tbt_ms", "tbt_floor_ms", "tbt_recompute_ms"} <= set(case.metrics)
    assert ("tbt_sdpa_ms" in case.metrics) == baselines and ("SDPA" in case.message) == baselines
    nbytes = (TINY.parameters() - TINY.vocab * TINY.hidden) * 4 + 2 * TINY.layers * 2 * TINY.hidden * (10 + 9 / 2) * 4
    assert case.metrics["bytes_per_step"] == nbytes


def test_a_generation_with_a_wrong_token_fails_its_check():
    model, _ = model_and_reference()
    run = task6_measure.Run(batch=2, prompt=6, steps=5, device="cpu")
    gen = task6_measure.Generation(run, TINY.vocab, seed=1)
    with torch.no_grad():
        cache = model.new_cache(2)
        gen.logits[:, 0] = model(gen.prompt, cache, last=True)[:, 0]
        for i in range(run.steps):
            gen.tokens[:, i] = gen.logits[:, i].argmax(-1)
            gen.logits[:, i + 1] = model(gen.tokens[:, i:i + 1], cache, last=True)[:, 0]
    reference = SmallLM(TINY, task6_measure.FullAttention, device="meta").share_weights(model)
    gen.check(reference)  # right as made
    gen.logits[1, 3] += 1.0  # a step's logits off by one everywhere: the argmax holds, the values do not
    with pytest.raises(AssertionError, match="position 8, decode step 3"):
        gen.check(reference)
    gen.tokens[0, 2] = (gen.tokens[0, 2] + 1) % TINY.vocab
    with pytest.raises(AssertionError, match="not the argmax"):
        gen.check(reference)


def test_a_16_bit_models_weights_are_the_float32_models_rounded_and_its_floor_half():
    """The optional 16-bit part: the checks' model and the worker's draw the same weights in bf16 as in float32,
    rounded; a step of it reads 2 bytes a value, so its TBT floor is half float32's."""
    wide = SmallLM(TINY, task6_measure.FullAttention, seed=5)
    narrow = SmallLM(TINY, task6_measure.FullAttention, dtype=torch.bfloat16, seed=5)
    for (name, w), (_, n) in zip(wide.named_parameters(), narrow.named_parameters()):
        assert n.dtype == torch.bfloat16 and torch.equal(w.to(torch.bfloat16), n), name
    run = task6_measure.Run(batch=2, prompt=10, steps=6, device="cpu")
    full, half = (task6_measure.floor_ms(TINY, run, 1e3, size)[0] for size in (4, 2))
    assert half == full / 2


def test_the_decode_steps_product_goes_to_the_given_kernel_when_its_loads_fit():
    """Linear hands a step's rows to the given kernel only where a row is whole 16-byte loads: 4 float32 values, 8
    bf16 ones."""
    from task6.model import Linear

    calls = []
    for dtype, in_features, taken in ((torch.float32, 12, True), (torch.bfloat16, 12, False),
                                      (torch.bfloat16, 16, True)):
        linear = Linear(in_features, 3, bias=False, dtype=dtype)
        linear.rows_kernel, linear.max_rows = (lambda x, w, out: calls.append(out.fill_(0))), 8
        calls.clear()
        out = linear(torch.ones(2, 1, in_features, dtype=dtype))
        assert bool(calls) == taken and out.shape == (2, 1, 3) and out.dtype == dtype, (dtype, in_features)
