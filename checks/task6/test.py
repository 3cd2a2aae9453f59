"""python -m task6.test [--solution] [--json PATH] [--size auto|handout|small] [--dtype float32|bfloat16|float16]

Checks Task 6's attention inside the small LLM of task6/model.py, by teacher forcing: the
model with your attention (prefill, then one token at a time through the KV cache) and the
same weights with a float64 attention that recomputes the whole sequence are fed the same
tokens, and their logits must agree at every position, and so must the greedy token
wherever the reference's two best logits are further apart than the tolerance.
- on the CPU, PyTorch plays the kernels (common/torch_kernels.py's PyTorchKernels): the logic of
  steps 1-4, on any machine;
- on the GPU, your Task 4 and Task 5 kernels run inside the model.
Some models are grouped-query (fewer key/value heads than query heads), and some batches hold
prompts of different lengths padded on the left: each such sequence's logits must be those of the
same sequence alone, without its padding.
Then the handout's generation run (batch 4, prompt 1024, 100 new tokens, hidden 4096,
32 heads, 24 layers; `--size small` for a GPU with 16 GB): time to first token and time
between tokens, against the same model with PyTorch's attention (recomputing the sequence
without a cache, and SDPA over the same cache), and the TBT floor: the bytes one decode
step must read at the copy bandwidth measured in the same run.
Optional, reported and not scored (`--dtype` runs one type alone): the same model in bf16 and in fp16,
with your kernels' 16-bit versions (Task 4's optional part, Task 5's step 6), within twice the logit
error of the same 16-bit model with PyTorch's attention; then the generation run in bf16, against
its own floor (half float32's bytes) and the float32 run's TBT.
The generation run is measured in checks/task6/measure.py. Your code runs in a worker process (task6/entry.py).
"""

from __future__ import annotations

import torch

from common import impl
from harness import cli, gpu_share
from harness.checks import (HALF_TYPES, HUNG_16BIT, MODEL_16BIT_CALL_TIMEOUT_S, compare_logits, exact_float32,
                            expect_errors, half_logits_atol)
from harness.outcome import Cause
from harness.records import NeedsCuda, Report
from harness.sandbox import WorkerError
from checks.task6.measure import (BUILD_TIMEOUT_S, HANDOUT, HINTS, FullAttention, choose_size, not_capturable,
                                  random_tokens, run_generation)
from task6.model import SIZES, Config, SmallLM

CPU_VOCAB, GPU_VOCAB = 97, 1000
# (hidden, heads, layers, batch, max_seq, prompt_len, steps[, kv_heads[, padding]]); MLP 4 x hidden. kv_heads
# below heads: grouped-query; padding: each sequence's padding tokens before its prompt (a batch padded on the
# left; a sequence may be all padding). Some end with the cache full.
CPU_CASES = [(32, 4, 2, 2, 24, 5, 7), (32, 4, 2, 2, 24, 1, 10), (32, 4, 2, 1, 24, 24, 0), (32, 4, 2, 3, 24, 23, 1),
             (48, 3, 2, 2, 20, 9, 11), (32, 4, 2, 2, 24, 6, 9, 2), (48, 6, 2, 2, 20, 7, 5, 1),
             (32, 4, 2, 3, 24, 9, 8, 4, (0, 3, 8)), (32, 4, 2, 4, 24, 10, 14, 2, (2, 10, 0, 7))]
# The decode steps replayed from one captured as a CUDA graph (README, step 5; reported, not scored)
GRAPH_CASES = [(256, 4, 2, 2, 200, 130, 20), (1024, 16, 2, 4, 60, 40, 12, 2, (35, 23, 40, 12))]
GPU_CASES = [(256, 4, 2, 2, 200, 130, 20), (512, 4, 3, 2, 120, 77, 16), (96, 3, 2, 3, 48, 33, 15),
             (256, 2, 2, 1, 40, 1, 39), (4096, 32, 1, 1, 80, 65, 15), (256, 4, 2, 2, 60, 30, 10, 1),
             (1024, 16, 2, 4, 60, 40, 12, 2, (35, 23, 40, 12)), (2048, 32, 1, 4, 52, 40, 12, 8, (35, 23, 0, 12))]


# The optional 16-bit part: the model in bf16 and in fp16 with your kernels' 16-bit versions (Task 4's optional
# part, Task 5's step 6), checked within what the type allows; then the generation run in bf16 against its own
# floor, half float32's bytes (reported, not scored; with --dtype float16, in fp16). One case of each kind: heads of 64, heads of 128, and a
# padded grouped-query batch.
HALF_CASES = [GPU_CASES[0], GPU_CASES[4], GPU_CASES[6]]


def unpack(shape):
    """(hidden, heads, layers, batch, max_seq, prompt_len, steps, kv_heads, padding) of a case's shape, which may
    leave out the last two (kv_heads = heads, no padding)."""
    hidden, heads, layers, batch, max_seq, prompt_len, steps, *rest = shape
    kv_heads = rest[0] if rest and rest[0] is not None else heads
    padding = tuple(rest[1]) if len(rest) > 1 and rest[1] is not None else None
    return hidden, heads, layers, batch, max_seq, prompt_len, steps, kv_heads, padding


def shape_text(shape) -> str:
    hidden, heads, layers, batch, max_seq, prompt_len, steps, kv_heads, padding = unpack(shape)
    grouped = f" over {kv_heads} key/value heads" if kv_heads != heads else ""
    prompts = (f"prompts of {', '.join(str(prompt_len - p) for p in padding)} tokens padded to {prompt_len}"
               if padding else f"prompt {prompt_len}")
    return (f"hidden {hidden} heads {heads}{grouped} layers {layers}, cache {max_seq}: batch {batch}, {prompts}, "
            f"{steps} steps")


def config_of(shape, vocab: int) -> Config:
    hidden, heads, layers, _, max_seq, _, _, kv_heads, _ = unpack(shape)
    return Config(vocab=vocab, hidden=hidden, heads=heads, layers=layers, mlp=4 * hidden, max_seq=max_seq,
                  kv_heads=kv_heads)


def reference_model(config: Config, seed: int, device, drawn: SmallLM | None = None) -> SmallLM:
    """The float64 reference with the weights the worker drew from `seed` (drawn in float32, then widened), or
    those of `drawn` (a 16-bit model's, widened)."""
    drawn = drawn or SmallLM(config, FullAttention, device=device, seed=seed)
    reference = SmallLM(config, FullAttention, device=device, dtype=torch.float64, seed=None)
    reference.load_state_dict({name: w.double() for name, w in drawn.state_dict().items()})
    return reference


# -- checks -------------------------------------------------------------------------------------

def check_teacher_forced(worker, case, vocab: int, graph: bool = False, dtype=torch.float32):
    """dtype: the model's; bfloat16 or float16 (the optional part) is held to what the type allows, measured by the
    same 16-bit model with PyTorch's attention on the same tokens."""
    _, _, _, batch, _, prompt_len, steps, _, padding = unpack(case.shape)
    config = config_of(case.shape, vocab)
    tokens = random_tokens((batch, prompt_len + steps), vocab, case.seed + 1)  # random padding: it takes no weight
    key_start = None if padding is None else torch.tensor(padding, dtype=torch.int32)
    worker.call("make_model", config.as_dict(), case.seed, case.device, str(dtype)[6:], timeout=BUILD_TIMEOUT_S)
    try:
        got = worker.call("teacher_force", tokens, prompt_len, key_start, graph,
                          **({} if dtype == torch.float32 else {"timeout": MODEL_16BIT_CALL_TIMEOUT_S}))
    except WorkerError as err:
        if not graph or err.kind == "NotImplementedError":  # a step still to write is said as such
            raise
        return False, f"the decode step {not_capturable(err)}", {}
    want_shape = (batch, prompt_len + steps, vocab)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != want_shape or got.dtype != torch.float32:
        what = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
        return False, f"the model's logits are {what}, expected {want_shape} float32 (does forward return (batch, n, hidden)?)", {}
    same_type = (None if dtype == torch.float32 else
                 SmallLM(config, FullAttention, device=case.device, dtype=dtype, seed=case.seed))
    reference = reference_model(config, case.seed, case.device, same_type)
    if padding is None:
        with torch.no_grad(), exact_float32():
            expected = reference(tokens.to(case.device)).cpu()
        atol, said = tolerance(same_type, tokens, expected)
        passed, message, metrics = compare_logits(got, expected, prompt_len, hints=HINTS, atol=atol)
        message += said
    else:
        passed, message, metrics = compare_padded(got, tokens, padding, prompt_len, reference, case.device, same_type)
    if not passed and graph:
        message += ("; replayed from a CUDA graph: if the model passes the GPU part above, without the graph, the "
                    "kernels and RoPE must read cache.lengths, not the Python int cache.length, which a graph keeps "
                    "at the value of the step it was captured at (README, Task 6, step 5)")
    elif not passed and case.device == "cuda":
        message += ("; on the GPU the model runs your Task 4 and Task 5 kernels: if the CPU cases pass, "
                    "check python -m task4.test and python -m task5.test" +
                    (" (in 16 bits, their optional parts: python -m task4.test --half, or on an H100/H200 --hopper "
                     "once its steps are all written, and python -m task5.test --half)" if same_type is not None
                     else ""))
    return passed, message, metrics


def tolerance(same_type: SmallLM | None, tokens, expected) -> tuple[float | None, str]:
    """(None, ""): float32's. A 16-bit model's (atol, what it is): from `same_type`, the same model in its type with
    PyTorch's attention, on the same tokens."""
    if same_type is None:
        return None, ""
    weight = same_type.embed.weight
    with torch.no_grad():
        yardstick = float((same_type(tokens.to(weight.device)).double().cpu() - expected).abs().max())
    return half_logits_atol(yardstick, expected, weight.dtype)


def compare_padded(got, tokens, padding, prompt_len: int, reference, device, same_type=None):
    """Each sequence of a batch padded on the left against the reference of that sequence alone, without its
    padding (its positions from 0): the padding must change nothing. Returns the worst sequence's numbers.
    same_type: a 16-bit model's yardstick (`tolerance`)."""
    worst = None
    for b, pad in enumerate(padding):
        with torch.no_grad(), exact_float32():
            expected = reference(tokens[b:b + 1, pad:].to(device)).cpu()
        atol, said = tolerance(same_type, tokens[b:b + 1, pad:], expected)
        passed, message, metrics = compare_logits(got[b:b + 1, pad:], expected, prompt_len - pad, hints=HINTS,
                                                  atol=atol)
        message += said
        if not passed:
            return False, (f"sequence {b} (a prompt of {prompt_len - pad} tokens after {pad} of padding), against "
                           f"itself alone, positions counted from its first real token: {message} (a padded batch: steps 3 and 4 pass cache.key_start to the "
                           "kernels, so that no padded key takes weight)"), metrics
        if worst is None or metrics["max_abs_err"] > worst[1]["max_abs_err"]:
            worst = message, metrics
    return True, f"each of the {len(padding)} sequences as alone; the worst: {worst[0]}", worst[1]


def check_errors(worker):
    """The given model's errors around the cache (not the student's work: reported, not scored)."""
    config = SIZES["tiny"]
    worker.call("make_model", config.as_dict(), 0, "cpu")
    tokens = lambda n: torch.zeros(2, n, dtype=torch.long)  # noqa: E731
    return expect_errors(lambda *call: worker.call(*call), [
        ("a prompt that fills the cache, then one more token", ("feed", [tokens(config.max_seq), tokens(1)]),
         "the cache is full"),
        ("a prompt longer than the cache", ("feed", [tokens(config.max_seq + 1)]), "the cache is full"),
        ("two tokens after the prompt", ("feed", [tokens(3), tokens(2)]), "decode one token at a time"),
        ("tokens of float32", ("feed", [torch.zeros(2, 3)]), "torch.long"),
        ("more padding than the prompt holds", ("feed", [tokens(3)], torch.tensor([0, 4])), "the prompt has 3"),
        ("padding of float32", ("feed", [tokens(3)], torch.tensor([0.0, 1.0])), "one int from 0 to max_seq"),
    ])


def needs_gpu():
    raise NeedsCuda("no CUDA GPU is visible: the model with your kernels runs on the GPU")


def check_half(report, worker, args, types: dict) -> bool:
    """The optional 16-bit part: the model in each of `types`, teacher-forced on the GPU; whether every case passed
    (then its generation runs, last). In a process of its own (the next call starts one): a crash in a 16-bit
    kernel costs this part only."""
    worker.stop_until_next_call()
    report.begin_part("the model in bf16 and fp16, your kernels' 16-bit versions", (1, 2, 3, 4), optional=True)
    before = len(report.cases)
    for name, dtype in types.items():
        for case in cli.cases(6, "half", HALF_CASES, args.hidden, shape_text, causal=(False,)):
            report.run(f"{name}: {case.name}", lambda: check_teacher_forced(worker, case, GPU_VOCAB, dtype=dtype))
            if report.process_died_since(before, "the bf16/fp16 part"):
                if report.cases[-1].cause == Cause.TIMED_OUT:
                    report.note(HUNG_16BIT)
                report.end_part("half")
                return False
    passed = report.end_part("half")
    if not passed:
        report.note("the generation run in 16 bits is skipped until its model's checks pass")
    return passed


def generate_half(report, worker, args, dtype, float32_run: dict | None) -> None:
    """The optional part's generation run in `dtype`, the float32 run's TBTs beside it when there was one."""
    size = choose_size(args.size)
    worker.stop_until_next_call()  # the float32 run ended its process: the next call starts one
    with gpu_share.alone(worker):
        run_generation(report, worker, size, SIZES[size], HANDOUT, cli.seed(60, args.hidden), baselines=False,
                       dtype=dtype, float32_run=float32_run)


def main(argv=None) -> int:
    parser = cli.parser(6, __doc__.splitlines()[2])
    parser.add_argument("--size", choices=("auto", "handout", "small"), default="auto",
                        help="the generation run's model: handout (about 34 GB of GPU memory), small (about 5 GB), "
                             "auto (handout on a GPU with 40 GB or more)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="the model's type on the GPU: float32 alone (the scored checks and generation run), or "
                             "bfloat16 or float16 alone (the optional 16-bit part: its checks and generation run in "
                             "that type); without it, float32, then the 16-bit part in both types")
    args = parser.parse_args(argv)
    float32_parts = args.dtype in (None, "float32")
    half_types = ({} if args.dtype == "float32" else HALF_TYPES if args.dtype is None else
                  {k: v for k, v in HALF_TYPES.items() if v == getattr(torch, args.dtype)})
    report = Report(6, args.solution, "prefill and decode inside a small LLM", args.student_dir)
    with cli.worker(report, 6, args, cuda=torch.cuda.is_available()) as worker:
        if worker is None:
            return report.finish(args.json)
        report.begin_part("logic on the CPU, PyTorch in place of the kernels", (1, 2, 3, 4))
        for case in cli.cases(6, "cpu", CPU_CASES, args.hidden, shape_text, devices=("cpu",), causal=(False,)):
            report.run(case.name, lambda: check_teacher_forced(worker, case, CPU_VOCAB))
        report.end_part("cpu")
        logic_works = bool(report.cases) and all(c.passed for c in report.cases)
        if torch.cuda.is_available() and float32_parts:
            worker.take_kernels_built_ahead()  # graded: the kernels the grader built while the CPU part ran
            report.begin_part("your Task 4 and Task 5 kernels inside the model, on the GPU", (1, 2, 3, 4))
            for case in cli.cases(6, "gpu", GPU_CASES, args.hidden, shape_text, causal=(False,)):
                report.run(case.name, lambda: check_teacher_forced(worker, case, GPU_VOCAB))
            report.end_part("gpu")
            report.begin_part("the decode step as a CUDA graph, replayed", (1, 2, 3, 4, 5), optional=True)
            for case in cli.cases(6, "graph", GRAPH_CASES, args.hidden, shape_text, causal=(False,)):
                report.run(f"graph: {case.name}", lambda: check_teacher_forced(worker, case, GPU_VOCAB, graph=True))
            report.end_part("graph")
        elif not torch.cuda.is_available():
            report.run("the model with your kernels", needs_gpu)
        if logic_works:  # they feed a prompt first, so they need steps 1-4
            report.run("a full cache and bad input raise clear errors (the given model)", lambda: check_errors(worker),
                       kind="given")
        all_passed = all(c.passed for c in report.cases if c.kind != "optional")
        half_passed = False
        if torch.cuda.is_available() and half_types:
            if all_passed:
                half_passed = check_half(report, worker, args, half_types)
            else:
                report.note("the optional bf16/fp16 model runs once every check passes")
        # The generation runs last: in a grading, the other tasks' tests check side by side with this one, and a
        # timed part waits until none of them is in the middle of its checks (harness/gpu_share.py).
        if not all_passed:
            report.note("the generation run is skipped until every check passes")
        elif torch.cuda.is_available() and float32_parts:
            report.heading("generation")
            # no point depends on the generation run (its time to first token and between tokens, the CUDA graph's
            # gain): a grading leaves it out, in float32 and in 16 bits, as tasks 4 and 5 their optional timings
            if not cli.grading_leaves_out(report, args, 6, "the generation run, in float32" +
                                          (" and in 16 bits" if half_passed else "")):
                size = choose_size(args.size)
                with gpu_share.alone(worker):  # it also gives back the checks' own reference models' memory
                    run_generation(report, worker, size, SIZES[size], HANDOUT, cli.seed(60, args.hidden))
        if half_passed and not args.grading:
            if not float32_parts:
                report.heading("generation")
            float32_run = next((c.metrics for c in report.cases if "tbt_ms" in c.metrics), None)
            generate_half(report, worker, args, next(iter(half_types.values())), float32_run)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(6, args.solution, args.student_dir, report.attention_ops), kind="rule")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
