"""python -m task7.test [--solution] [--json PATH]

Checks Task 7's attention function inside Hugging Face GPT-2 and a Llama-family model
(transformers' own models, their attention routed through your `kernel_attention`): the model
generates greedily in the worker, and the same weights with the model's own attention, in
float64, are teacher-forced on the tokens it generated; logits must agree at every step, and so
must the greedy token wherever the reference's two best logits are further apart than the
tolerance (Task 6's rule). A batch of prompts of different lengths, padded on the left, must
also give each sequence the tokens it gets generated alone.
- on the CPU, PyTorch plays the kernels: small random GPT-2s and Llamas (grouped-query
  attention), a layer-dependent scale, a one-token prompt, padded batches, and what must be
  refused (a mask that is not left padding, dropout, several new tokens, soft-capping on a new token); then
  (optional, step 4) a small Gemma 2 (sliding-window and global layers, soft-capped scores) teacher-forced and a
  Mistral-style model (a sliding window) generating, each against its own attention in float64;
- on the GPU, your Task 4 and Task 5 kernels: the same, 4 prompts of 5 to 40 tokens padded, a
  Llama with Llama 3.2 1B's attention (32 query heads over 8 key/value heads), and GPT-2 itself
  (124M parameters) with its real weights when they are in the Hugging Face cache (tests never
  download), else random ones; the step 4 models again on your kernels (optional: task 4's float32 masks, steps
  23-24); then (optional, reported) three of the models in bf16 and fp16,
  through your kernels' optional 16-bit parts, each within twice the logit error of the same model in
  that type with PyTorch's attention; last, the time per generated token against the model's own
  attention, and the generated text.
Your code runs in a worker process (task7/entry.py).
"""

from __future__ import annotations

import copy

import torch

from common import impl

from harness import bench, cli, gpu_share
from harness.attention_math import attention_float64
from harness.checks import (HALF_TYPES, HUNG_16BIT, MODEL_16BIT_CALL_TIMEOUT_S, compare, compare_logits, decided,
                            exact_float32, expect_errors, half_logits_atol)
from harness.outcome import Cause
from harness.records import NeedsCuda, Report
from task7 import gpt2

HINTS = (" (a prompt: steps 2 and 3)", " (a new token over the cache: steps 2 and 3)")
# (name, config, batch, prompt_len, new_tokens); prompt_len a tuple: prompts of those lengths, padded on the left
CPU_CASES = [("small GPT-2", gpt2.SMALL, 2, 7, 12),
             ("small GPT-2, scale 1/(sqrt(head_dim) x (layer + 1))", gpt2.SMALL | {"scale_attn_by_inverse_layer_idx": True},
              1, 1, 10),
             ("small GPT-2, padded", gpt2.SMALL, 3, (5, 12, 1), 8),
             ("small Llama (4 query heads over 2 key/value heads)", gpt2.LLAMA_SMALL, 2, 7, 12),
             ("small Llama, padded", gpt2.LLAMA_SMALL, 3, (9, 2, 6), 8)]
GPU_CASES = [("small GPT-2", gpt2.SMALL, 2, 33, 20),
             ("small Llama (4 query heads over 2 key/value heads)", gpt2.LLAMA_SMALL, 2, 33, 20),
             ("small GPT-2, padded", gpt2.SMALL, 4, (5, 17, 40, 28), 12),
             ("Llama with Llama 3.2 1B's attention (32 query heads over 8 key/value heads, head_dim 64), padded",
              gpt2.LLAMA_1B_ATTENTION, 4, (5, 17, 40, 28), 12)]
# The optional 16-bit part: the same models in bf16 and fp16 (your Task 4 kernel's steps 8-11 and Task 5's step 6),
# each held to what its type allows: twice the largest logit error of the same model in the same type with PyTorch's
# own attention (transformers' "sdpa") on the same tokens.
HALF_CASES = [GPU_CASES[0], GPU_CASES[1], GPU_CASES[3]]
# The optional step 4: models whose attention masks more than the future. (name, config, prompt lengths, new tokens):
# a Gemma 2 teacher-forced over whole prompts (new tokens 0: task 5's decode does not soft-cap), a Mistral-style model
# generating (its new tokens decode over the window's keys); lengths past the window of 8, padded on the left.
MASK_CASES = [("small Gemma 2 (a window of 8 keys on every other layer, scores soft-capped at 1.0)", gpt2.GEMMA2_SMALL,
               (24, 24), 0),
              ("small Gemma 2, padded", gpt2.GEMMA2_SMALL, (13, 30, 6), 0),
              ("small Mistral-style model (a window of 8 keys), padded", gpt2.MISTRAL_SMALL, (5, 17, 12), 12)]
MASK_HINTS = (" (step 4: softcap and window_left = sliding_window - 1 to task 4's kernel)",
              " (step 4: a new token's window, the last sliding_window keys, to task 5's decode)")
GPT2_RUN = dict(batch=1, new_tokens=40, random_prompt=16)
REPS = 3
BUILD_TIMEOUT_S = 900  # the first GPU model builds your Task 4 and Task 5 kernels


def reference_of(model, device):
    """The same weights with the model's own attention, in float64."""
    reference = copy.deepcopy(model).to(device=device, dtype=torch.float64)
    reference.set_attn_implementation("eager")
    return reference


def generated(worker, prompt, new_tokens, mask, vocab, timeout=None):
    """The worker's (tokens, logits), or a message when it returned anything else. timeout: the call's, when not the
    default (a 16-bit model's)."""
    reply = worker.call("generate", prompt, new_tokens, mask, **({} if timeout is None else {"timeout": timeout}))
    batch = prompt.shape[0]
    if (not isinstance(reply, list) or len(reply) != 2 or not all(isinstance(t, torch.Tensor) for t in reply)
            or tuple(reply[0].shape) != (batch, new_tokens) or reply[0].dtype != torch.long
            or tuple(reply[1].shape) != (batch, new_tokens, vocab) or reply[1].dtype != torch.float32):
        return ("generate did not return the tokens and logits asked for (does the function return "
                "(output of (batch, q_len, heads, head_dim), None)?)")
    if ((reply[0] < 0) | (reply[0] >= vocab)).any():
        return "the generated token ids are not in the vocabulary"
    return reply


def check_generation(worker, model, config: dict, prompt: torch.Tensor, new_tokens: int, device: str,
                     mask: torch.Tensor | None = None, dtype=torch.float32):
    """The worker's greedy generation against the float64 reference, teacher-forced; (passed, message, metrics).
    mask (batch, prompt_len): prompts padded on the left; then each sequence must also get, generated alone,
    the tokens it got in the batch. dtype: the model's (bf16 or fp16: the optional 16-bit part)."""
    worker.call("make_model", config, model.state_dict(), device, str(dtype)[6:], timeout=BUILD_TIMEOUT_S)
    vocab = model.config.vocab_size
    timeout = None if dtype == torch.float32 else MODEL_16BIT_CALL_TIMEOUT_S
    reply = generated(worker, prompt, new_tokens, mask, vocab, timeout)
    if isinstance(reply, str):
        return False, reply, {}
    tokens, logits = reply
    ids = torch.cat((prompt, tokens), dim=1)
    expected = teacher_forced(reference_of(model, device), ids, mask, new_tokens, device)
    atol, said = None, ""
    if dtype != torch.float32:  # what the type allows: the same model in it, with PyTorch's own attention
        ours = copy.deepcopy(model).to(device=device, dtype=dtype)
        ours.set_attn_implementation("sdpa")
        yardstick = float((teacher_forced(ours, ids, mask, new_tokens, device).double() - expected).abs().max())
        atol, said = half_logits_atol(yardstick, expected, dtype)
    passed, message, metrics = compare_logits(logits, expected, prompt.shape[1], first=prompt.shape[1] - 1,
                                              hints=HINTS, atol=atol)
    message += said
    if passed and mask is not None:
        passed, alone = each_alone(worker, prompt, mask, tokens, expected, vocab, atol, timeout)
        message += f"; {alone}"
    if not passed and device == "cuda":
        message += ("; on the GPU the model runs your Task 4 and Task 5 kernels: if the CPU cases pass, check "
                    "python -m task4.test and python -m task5.test" +
                    (" (with --half: in 16 bits they are their optional parts; on an H100/H200 task 4's is --hopper "
                     "once its steps are all written)" if dtype != torch.float32 else ""))
    return passed, message, metrics


def teacher_forced(model, ids, mask, new_tokens: int, device: str) -> torch.Tensor:
    """The logits `model` gives for each generated token's position, fed the whole sequence ids (batch, n) at once:
    with a mask, each sequence on its own, without its padding (what the padded batch must give)."""
    with torch.no_grad(), exact_float32():
        if mask is None:
            return model(ids.to(device)).logits[:, -new_tokens - 1:-1].cpu()
        keep = torch.cat((mask, torch.ones(mask.shape[0], new_tokens, dtype=mask.dtype)), dim=1) == 1
        return torch.stack([model(ids[b:b + 1, keep[b]].to(device)).logits[0, -new_tokens - 1:-1].cpu()
                            for b in range(ids.shape[0])])


def each_alone(worker, prompt, mask, tokens, expected, vocab, atol=None, timeout=None) -> tuple[bool, str]:
    """Each padded sequence generated alone, without padding, must give the batch's tokens up to the first
    near-tie of the reference's logits (there float32 may pick either, and the two runs part; atol and timeout: a
    16-bit model's tolerance and call time)."""
    new_tokens, settled = tokens.shape[1], decided(expected, atol)
    for b in range(prompt.shape[0]):
        alone = generated(worker, prompt[b:b + 1, mask[b] == 1], new_tokens, None, vocab, timeout)
        if isinstance(alone, str):
            return False, f"sequence {b} generated alone: {alone}"
        differ = (alone[0][0] != tokens[b]).nonzero().flatten()
        if len(differ):
            t = int(differ[0])
            if settled[b, t]:
                padding = int((mask[b] == 0).sum())
                return False, (f"sequence {b} (a prompt of {int(mask[b].sum())} tokens after {padding} "
                               f"of padding) generated alone gives another token at step {t + 1} than in the padded "
                               "batch: the padding took weight (step 1: the mask as each sequence's first real key)")
    return True, f"each of the {prompt.shape[0]} padded sequences gives the same tokens generated alone"


def random_prompt(batch, length, vocab, seed):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def random_prompts(lengths, vocab, seed, pad_id):
    """(ids, mask): prompts of the given lengths, padded on the left with pad_id."""
    generator = torch.Generator().manual_seed(seed)
    return gpt2.left_pad([torch.randint(1, vocab, (n,), generator=generator) for n in lengths], pad_id)


def check_prompt(worker, model, config: dict, prompt: torch.Tensor, mask: torch.Tensor | None, device: str):
    """The model's logits over whole prompts (one forward pass: teacher forcing) against the same weights with its own
    attention in float64, each padded sequence on its own without its padding; (passed, message, metrics)."""
    worker.call("make_model", config, model.state_dict(), device, timeout=BUILD_TIMEOUT_S)
    got = worker.call("logits", prompt, mask)
    batch, n, vocab = *prompt.shape, model.config.vocab_size
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (batch, n, vocab) or got.dtype != torch.float32:
        return False, ("logits did not return (batch, n, vocab) float32 logits (does the function return (output, "
                       "None)?)"), {}
    reference = reference_of(model, device)
    keep = torch.ones_like(prompt, dtype=torch.bool) if mask is None else mask == 1
    said = []
    for b in range(batch):
        with torch.no_grad(), exact_float32():
            expected = reference(prompt[b:b + 1, keep[b]].to(device)).logits.cpu()
        passed, message, metrics = compare_logits(got[b:b + 1, keep[b]], expected, int(keep[b].sum()), hints=MASK_HINTS)
        if not passed:
            return False, f"sequence {b}: {message}", metrics
        said.append((metrics.get("max_abs_err", 0.0), b, message, metrics))
    _, b, message, metrics = max(said)  # the sequence furthest off
    return True, f"each of the {batch} sequences on its own; the furthest off, sequence {b}: {message}", metrics


def check_window_decode(worker, seed: int):
    """A new token over more keys than its window (a cache that keeps every key, where transformers' sliding caches
    hand over the window's alone), without a mask and with one (padding): the decode over the last sliding_window
    keys, padding moved with them (step 4)."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, heads, n, 16, generator=generator) for heads, n in ((4, 1), (2, 20), (2, 20)))
    padded = torch.ones(2, 1, 1, 20, dtype=torch.bool)
    padded[0, ..., :12] = False  # sequence 0: the window of 8 keys alone
    padded[1, ..., :15] = False  # sequence 1: 15 of padding, its 5 real keys inside the window
    said = []
    for mask, firsts, what in ((None, (12, 12), "no mask"), (padded, (12, 15), "padded")):
        got = worker.call("attend", q, k, v, mask, None, 0.0, {"sliding_window": 8})
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (2, 1, 4, 16):
            return False, f"{what}: the function did not return the output as (batch, q_len, heads, head_dim)", {}
        expected = torch.cat([attention_float64(q[b:b + 1], k[b:b + 1, :, first:], v[b:b + 1, :, first:])[0]
                              for b, first in enumerate(firsts)])
        result = compare(got.transpose(1, 2), expected, atol=1e-5, rtol=1e-5, name="output")
        if not result.passed:
            return False, (f"{what}: {result.message} (README, Task 7, step 4: a new token's window is the last "
                           "sliding_window keys)"), result.metrics()
        said.append(f"{what}: {result.message}")
    return True, "; ".join(said), {}


def run_mask_cases(report, worker, first_seed: int, device: str, hidden: cli.Hidden | None) -> None:
    """Step 4 (optional): MASK_CASES on `device`, a part of its own."""
    report.begin_part(f"masks {device}", (4,), optional=True)
    for i, (name, config, lengths, n) in enumerate(MASK_CASES):
        seed = cli.seed(first_seed + i, hidden)
        prompt, mask = random_prompts(lengths, config["vocab_size"], seed, pad_id=0)
        mask = None if len(set(lengths)) == 1 else mask
        what = f"prompts of {', '.join(map(str, lengths))} tokens" + (f", {n} new tokens" if n else ", teacher-forced")
        model = gpt2.random_model(config, seed)
        report.run(f"{'cpu ' if device == 'cpu' else ''}{name}: batch {len(lengths)}, {what}",
                   lambda: check_generation(worker, model, config, prompt, n, device, mask) if n else
                   check_prompt(worker, model, config, prompt, mask, device))
    report.run(f"{'cpu ' if device == 'cpu' else ''}a new token over 20 keys with a window of 8, without a mask and "
               "padded (a cache that keeps every key)",
               lambda: check_window_decode(worker, cli.seed(first_seed + 9, hidden)))
    if device == "cuda" and not all(c.passed for c in report.cases[report.part_start:]):
        report.note("the GPU's masked models run task 4's float32 masks (python -m task4.test --masks)")
    report.end_part(f"masks {device}")


def check_refusals(worker):
    """What the kernels cannot do must raise a clear error, never give a wrong answer."""
    q = torch.randn(2, 4, 5, 16)
    holed = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 1, 5, 5).clone()
    holed[0, :, 2:, 1] = False  # a key in the middle of the first sequence hidden: not left padding
    return expect_errors(lambda *call: worker.call(*call), [
        ("a mask hiding a key in the middle", ("attend", q, q, q, holed, None, 0.0), "padded on the left"),
        ("dropout in training", ("attend", q, q, q, None, None, 0.1), "dropout"),
        ("three new tokens after two cached", ("attend", q[:, :, :3], q, q, None, None, 0.0), "new tokens"),
        # what Gemma 2 passes beside: the decode kernel does not soft-cap, and a new token run without it would give
        # wrong logits, with no error (step 4 passes it to task 4's kernel for a prompt; the skeleton refuses it)
        ("Gemma 2's soft-capped scores on a new token", ("attend", q[:, :, 4:], q, q, None, None, 0.0,
                                                         {"softcap": 50.0}), "softcap"),
    ])


def gpt2_model(report, seed: int):
    """(model, tokenizer or None, what it is): GPT-2's real weights if cached here, else random ones."""
    try:
        model, tokenizer = gpt2.pretrained(download=False)
        return model, tokenizer, "GPT-2 (124M) with its weights"
    except gpt2.WeightsMissing:
        report.note("GPT-2's weights are not in the Hugging Face cache, so GPT-2's size ran with random weights "
                    "(python -m task7.inference says how to fetch them)")
        return gpt2.random_model(gpt2.GPT2_SIZE, seed), None, "GPT-2's size (124M) with random weights"


def llama_model(report, seed: int):
    """(model, tokenizer or None, what it is): a small public Llama-family checkpoint if cached here, else a
    Llama with Llama 3.2 1B's attention and random weights."""
    try:
        model, tokenizer = gpt2.pretrained(name=gpt2.LLAMA_CHECKPOINT, download=False)
        return model, tokenizer, f"{gpt2.LLAMA_CHECKPOINT} with its weights"
    except gpt2.WeightsMissing:
        report.note(f"{gpt2.LLAMA_CHECKPOINT}'s weights are not in the Hugging Face cache, so the Llama-family "
                    "timing ran with Llama 3.2 1B's attention and random weights (python -m task7.inference "
                    f"--llama says how to fetch them)")
        return gpt2.random_model(gpt2.LLAMA_1B_ATTENTION, seed), None, \
            "a Llama with Llama 3.2 1B's attention (32 query heads over 8 key/value heads) and random weights"


def time_yours(worker, model, prompt):
    """Your kernels' generation in the worker: (ms per token, the tokens it generated)."""
    n = GPT2_RUN["new_tokens"]
    worker.call("make_model", model.config.to_dict(), model.state_dict(), "cuda", timeout=BUILD_TIMEOUT_S)
    tokens = worker.call("generate", prompt, n)[0]  # also the warm-up
    return bench.host_clock(lambda: worker.call("generate_only", prompt, n), reps=REPS, per_request=n), tokens


def attempt(fn):
    """fn's result, or the exception it raised (raised again inside the case that reports it)."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001  the case it belongs to reports it
        return err


def time_per_token(yours, model, tokenizer, what: str, prompt):
    """ms per generated token, your attention (`yours`: time_yours's result, measured before) against the model's
    own (here, once no process of yours runs), and the text."""
    if isinstance(yours, Exception):
        raise yours
    ours, tokens = yours
    n = GPT2_RUN["new_tokens"]
    own = model.to("cuda")

    def run():
        gpt2.greedy(own, prompt, n)
        torch.cuda.synchronize()
    run()
    theirs = bench.host_clock(run, reps=REPS, per_request=n)
    model.to("cpu")
    text = (repr(tokenizer.decode(torch.cat((prompt[0], tokens[0])))) if tokenizer is not None else
            f"token ids {tokens[0].tolist()} (random weights: no text to show)")
    metrics = {"ms_per_token": ours.median_ms, "ms_per_token_own_attention": theirs.median_ms,
               "speedup_vs_own_attention": theirs.median_ms / ours.median_ms}
    return True, (f"{what}, batch {prompt.shape[0]}, {n} new tokens: {ours.median_ms:.2f} ms per token with your "
                  f"kernels, {theirs.median_ms:.2f} ms with the model's own attention "
                  f"({model.config._attn_implementation}); generated: {text}"), metrics


def run_cases(report, worker, cases, first_seed: int, device: str, hidden: cli.Hidden | None, dtype=None) -> bool:
    """Random GPT-2s of the cases' configurations, each generating from a random prompt on `device` (dtype: a 16-bit
    type's name, the optional part's: it stops at the first case whose process crashed or hung, and says so).
    Whether every case ran."""
    for i, (name, config, batch, prompt_len, n) in enumerate(cases):
        seed = cli.seed(first_seed + i, hidden)
        prefix = "cpu " if device == "cpu" else f"{dtype} " if dtype else ""
        if isinstance(prompt_len, tuple):  # prompts of different lengths, padded on the left
            prompt, mask = random_prompts(prompt_len, config["vocab_size"], seed, pad_id=0)
            what = f"prompts of {', '.join(map(str, prompt_len))} tokens"
        else:
            prompt, mask, what = random_prompt(batch, prompt_len, config["vocab_size"], seed), None, f"prompt {prompt_len}"
        before = len(report.cases)
        report.run(f"{prefix}{name}: batch {batch}, {what}, {n} new tokens",
                   lambda: check_generation(worker, gpt2.random_model(config, seed), config, prompt, n, device, mask,
                                            HALF_TYPES.get(dtype, torch.float32)))
        if dtype and report.process_died_since(before, "the bf16/fp16 part"):
            if report.cases[-1].cause == Cause.TIMED_OUT:
                report.note(HUNG_16BIT)
            return False
    return True


def run_on_gpu(report, worker, args):
    worker.take_kernels_built_ahead()  # graded: the kernels the grader built while the CPU part ran
    report.begin_part("your Task 4 and Task 5 kernels inside GPT-2 and Llama, on the GPU", (1, 2, 3))
    if report.stopped:  # a step the CPU part found missing: nothing to build GPT-2 for
        report.end_part("gpu")
        return
    run_cases(report, worker, GPU_CASES, 80, "cuda", args.hidden)
    seed = cli.seed(90, args.hidden)
    try:
        model, tokenizer, what = gpt2_model(report, seed)
    except Exception as err:  # noqa: BLE001  the checks' own model: say so, keep the other results
        report.add("GPT-2's size", False, f"the checks could not make GPT-2: {type(err).__name__}: {err}")
        report.end_part("gpu")
        return
    prompt = (tokenizer(gpt2.DEFAULT_PROMPT, return_tensors="pt").input_ids if tokenizer is not None else
              random_prompt(GPT2_RUN["batch"], GPT2_RUN["random_prompt"], model.config.vocab_size, seed))
    report.run(f"{what}: prompt {prompt.shape[1]}, {GPT2_RUN['new_tokens']} new tokens",
               lambda: check_generation(worker, model, model.config.to_dict(), prompt, GPT2_RUN["new_tokens"], "cuda"))
    llama, llama_tokenizer, llama_what = llama_model(report, seed)
    llama_prompt = (llama_tokenizer(gpt2.DEFAULT_PROMPT, return_tensors="pt").input_ids if llama_tokenizer is not None
                    else random_prompt(GPT2_RUN["batch"], GPT2_RUN["random_prompt"], llama.config.vocab_size, seed))
    report.run(f"{llama_what}: prompt {llama_prompt.shape[1]}, {GPT2_RUN['new_tokens']} new tokens",
               lambda: check_generation(worker, llama, llama.config.to_dict(), llama_prompt, GPT2_RUN["new_tokens"],
                                        "cuda"))
    report.end_part("gpu")
    if all(c.passed for c in report.cases if c.kind != "optional"):
        worker.stop_until_next_call()  # a process of its own: a fault in the optional masks costs their part alone
        run_mask_cases(report, worker, 85, "cuda", args.hidden)
    if all(c.passed for c in report.cases if c.kind != "optional"):
        # In a process of its own (the next call starts one): a crash in an optional 16-bit kernel costs its part.
        worker.stop_until_next_call()
        report.begin_part("half", (1, 2, 3), optional=True)
        for i, name in enumerate(HALF_TYPES):
            if not run_cases(report, worker, HALF_CASES, 100 + 10 * i, "cuda", args.hidden, name):
                break
        report.end_part("half")
        # The timing last: in a grading, the other tasks' tests check side by side with this one, and a timed
        # part waits until none of them is in the middle of its checks (harness/gpu_share.py).
        report.heading("timing")
        if cli.grading_leaves_out(report, args, 7, "the generation's time per token against the models' own "
                                                   "attention, and its text"):  # no point depends on it
            return
        runs = [("generation: time per token, and the text", model, tokenizer, what, prompt),
                ("generation with grouped-query attention: time per token, and the text", llama, llama_tokenizer,
                 llama_what, llama_prompt)]
        with gpu_share.alone(worker):
            # one start of the worker for both models (it makes each), then the models' own attention here, once
            # nothing of yours runs beside it
            yours = [attempt(lambda: time_yours(worker, run[1], run[4])) for run in runs]
            worker.stop_until_next_call()
            for (name, *run), timed in zip(runs, yours):
                report.run(name, lambda: time_per_token(timed, *run), kind="benchmark")
    else:
        report.note("the time per token is measured, and the optional bf16/fp16 models run, once every check passes")


def needs_gpu():
    raise NeedsCuda("no CUDA GPU is visible: GPT-2 and Llama with your kernels run on the GPU")


def main(argv=None) -> int:
    args = cli.parser(7, __doc__.splitlines()[2]).parse_args(argv)
    report = Report(7, args.solution, "the kernels inside Hugging Face GPT-2 and Llama", args.student_dir)
    with cli.worker(report, 7, args, cuda=torch.cuda.is_available()) as worker:
        if worker is None:
            return report.finish(args.json)
        report.begin_part("logic on the CPU, PyTorch in place of the kernels", (1, 2, 3))
        run_cases(report, worker, CPU_CASES, 70, "cpu", args.hidden)
        report.run("refuses what the kernels cannot do", lambda: check_refusals(worker))
        report.end_part("cpu")
        if not report.stopped:
            run_mask_cases(report, worker, 75, "cpu", args.hidden)
        if torch.cuda.is_available():
            run_on_gpu(report, worker, args)
        else:
            report.run("GPT-2 and Llama with your kernels", needs_gpu)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(7, args.solution, args.student_dir, report.attention_ops), kind="rule")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
