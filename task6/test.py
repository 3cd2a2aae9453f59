"""python -m task6.test [--solution] [--json PATH] [--size auto|handout|small]

Checks Task 6's attention inside the small LLM of task6/model.py, by teacher forcing: the
model with your attention (prefill, then one token at a time through the KV cache) and the
same weights with a float64 attention that recomputes the whole sequence are fed the same
tokens, and their logits must agree at every position, and so must the greedy token
wherever the reference's two best logits are further apart than the tolerance.
- on the CPU, PyTorch plays the kernels (common/torch_kernels.py's PyTorchKernels): the logic of
  steps 1-4, on any machine;
- on the GPU, your Task 4 and Task 5 kernels run inside the model.
Then the handout's generation run (batch 4, prompt 1024, 100 new tokens, hidden 4096,
32 heads, 24 layers; `--size small` for a GPU with 16 GB): time to first token and time
between tokens, against the same model with PyTorch's attention (recomputing the sequence
without a cache, and SDPA over the same cache), and the TBT floor: the bytes one decode
step must read at the copy bandwidth measured in the same run.
Your code runs in a worker process (task6/entry.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from common import impl

from harness import bench, cli, gpu_share
from harness.checks import compare_logits, exact_float32, expect_errors
from harness.records import NeedsCuda, Report
from harness.sandbox import WorkerDied, WorkerError
from harness.timing import summarize
from common.torch_kernels import PyTorchKernels
from task6.model import SIZES, Attention, Config, SmallLM

CPU_VOCAB, GPU_VOCAB = 97, 1000
HINTS = (" (prefill: steps 1 and 3)", " (decode: steps 1, 2 and 4)")
# (hidden, heads, layers, batch, max_seq, prompt_len, steps); MLP 4 x hidden. Some end with the cache full.
CPU_CASES = [(32, 4, 2, 2, 24, 5, 7), (32, 4, 2, 2, 24, 1, 10), (32, 4, 2, 1, 24, 24, 0), (32, 4, 2, 3, 24, 23, 1),
             (48, 3, 2, 2, 20, 9, 11)]
GPU_CASES = [(256, 4, 2, 2, 200, 130, 20), (512, 4, 3, 2, 120, 77, 16), (96, 3, 2, 3, 48, 33, 15),
             (256, 2, 2, 1, 40, 1, 39), (4096, 32, 1, 1, 80, 65, 15)]
REPS = 3  # timed generations
BUILD_TIMEOUT_S = 900  # the first GPU model builds your Task 4 and Task 5 kernels
FASTEST_VS_FLOOR = 1.25  # a decode step this much under the TBT floor skipped work


def shape_text(shape) -> str:
    hidden, heads, layers, batch, max_seq, prompt_len, steps = shape
    return (f"hidden {hidden} heads {heads} layers {layers}, cache {max_seq}: batch {batch}, prompt {prompt_len}, "
            f"{steps} steps")


def config_of(shape, vocab: int) -> Config:
    hidden, heads, layers, _, max_seq, _, _ = shape
    return Config(vocab=vocab, hidden=hidden, heads=heads, layers=layers, mlp=4 * hidden, max_seq=max_seq)


# -- the trusted side's attentions ------------------------------------------------------------

class FullAttention(Attention):
    """No cache: causal attention over the whole sequence, positions 0 .. n - 1 (the reference, and recomputing)."""

    def forward(self, x, cache=None):
        q, k, v = self.project(x)
        positions = torch.arange(x.shape[1], device=x.device)
        q, k = self.rope(q, positions), self.rope(k, positions)
        if x.dtype == torch.float64:
            out = PyTorchKernels().attention(q, k, v, True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(self.merge_heads(out))


class SdpaCachedAttention(Attention):
    """PyTorch's SDPA over the same KV cache: the baseline with a cache."""

    def forward(self, x, cache):
        q, k, v = self.project(x)
        start, n = cache.length, x.shape[1]
        positions = torch.arange(start, start + n, device=x.device)
        q, k = self.rope(q, positions), self.rope(k, positions)
        cache.k[:, :, start:start + n] = k
        cache.v[:, :, start:start + n] = v
        cache.length = start + n
        out = F.scaled_dot_product_attention(q, cache.k[:, :, :start + n], cache.v[:, :, :start + n],
                                             is_causal=start == 0)
        return self.o_proj(self.merge_heads(out))


def reference_model(config: Config, seed: int, device) -> SmallLM:
    """The float64 reference with the weights the worker drew from `seed` (drawn in float32, then widened)."""
    drawn = SmallLM(config, FullAttention, device=device, seed=seed)
    reference = SmallLM(config, FullAttention, device=device, dtype=torch.float64, seed=None)
    reference.load_state_dict({name: w.double() for name, w in drawn.state_dict().items()})
    return reference


def random_tokens(shape, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# -- checks -------------------------------------------------------------------------------------

def check_teacher_forced(worker, case, vocab: int):
    hidden, heads, layers, batch, max_seq, prompt_len, steps = case.shape
    config = config_of(case.shape, vocab)
    tokens = random_tokens((batch, prompt_len + steps), vocab, case.seed + 1)
    worker.call("make_model", config.as_dict(), case.seed, case.device, timeout=BUILD_TIMEOUT_S)
    got = worker.call("teacher_force", tokens, prompt_len)
    want_shape = (batch, prompt_len + steps, vocab)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != want_shape or got.dtype != torch.float32:
        what = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
        return False, f"the model's logits are {what}, expected {want_shape} float32 (does forward return (batch, n, hidden)?)", {}
    with torch.no_grad(), exact_float32():
        expected = reference_model(config, case.seed, case.device)(tokens.to(case.device)).cpu()
    passed, message, metrics = compare_logits(got, expected, prompt_len, hints=HINTS)
    if not passed and case.device == "cuda":
        message += ("; on the GPU the model runs your Task 4 and Task 5 kernels: if the CPU cases pass, "
                    "check python -m task4.test and python -m task5.test")
    return passed, message, metrics


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
    ])


# -- the handout's generation run -----------------------------------------------------------------

def choose_size(size: str) -> str:
    if size != "auto":
        return size
    return "handout" if torch.cuda.get_device_properties(0).total_memory >= 40 * 2**30 else "small"


@dataclass(frozen=True)
class Run:
    """A generation: `steps` greedy decode steps after a prompt, on `device`."""

    batch: int = 4
    prompt: int = 1024
    steps: int = 100
    device: str = "cuda"

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()


HANDOUT = Run()


class Generation:
    """One generation's buffers, owned here: the prompt, and the tokens and logits the worker writes.

    logits[:, 0] are the prompt's last position's; tokens[:, i] is the argmax of logits[:, i],
    and feeding it gives logits[:, i + 1].
    """

    def __init__(self, run: Run, vocab: int, seed: int):
        self.prompt = random_tokens((run.batch, run.prompt), vocab, seed).to(run.device)
        self.tokens = torch.full((run.batch, run.steps), -1, dtype=torch.long, device=run.device)
        self.logits = torch.full((run.batch, run.steps + 1, vocab), math.nan, device=run.device)

    def take(self, reply, *mine):
        """CPU tensors reach the worker as copies, so on the CPU its answer holds what it wrote: take it."""
        if reply is None and mine[0].is_cuda:
            return
        if (not isinstance(reply, list) or len(reply) != len(mine)
                or any(not isinstance(r, torch.Tensor) or r.shape != m.shape or r.dtype != m.dtype
                       for r, m in zip(reply, mine))):
            raise AssertionError("the worker's answer is not the tokens and logits it was given")
        for r, m in zip(reply, mine):
            m.copy_(r)

    def check(self, model: SmallLM):
        """The logits against `model` (float32, PyTorch attention) teacher-forced on the same tokens."""
        if (self.tokens < 0).any() or (self.tokens >= model.config.vocab).any():
            raise AssertionError("the generated tokens are not all valid token ids: not every step ran")
        if not torch.equal(self.tokens, self.logits[:, :-1].argmax(dim=-1)):
            raise AssertionError("the generated tokens are not the argmax of the logits before them")
        prompt_len = self.prompt.shape[1]
        with torch.no_grad(), exact_float32():
            expected = model(torch.cat((self.prompt, self.tokens), dim=1))[:, prompt_len - 1:]
        passed, message, _ = compare_logits(self.logits.double(), expected.double(), prompt_len, first=prompt_len - 1,
                                            hints=HINTS)
        if not passed:
            raise AssertionError(f"the timed generation's outputs are wrong: {message}")


def time_student(worker, config: Config, run: Run, seed: int):
    """TTFT and TBT of your model in the worker, host clock around each request; (ttft, tbt, generations)."""
    worker.call("make_model", config.as_dict(), seed, run.device, timeout=BUILD_TIMEOUT_S)
    warm = Generation(run, config.vocab, seed)
    worker.call("prefill", warm.prompt, warm.logits)
    worker.call("steps", warm.tokens[:, :2], warm.logits[:, :3])
    ttft, tbt, generations = [], [], []
    for rep in range(REPS):
        gen, replies = Generation(run, config.vocab, seed + 1 + rep), []
        ttft.append(bench.host_clock(lambda: replies.append(worker.call("prefill", gen.prompt, gen.logits)),
                                     reps=1, per_request=1, device=run.device))
        gen.take(replies.pop(), gen.logits)
        tbt.append(bench.host_clock(lambda: replies.append(worker.call("steps", gen.tokens, gen.logits)),
                                    reps=1, per_request=run.steps, device=run.device))
        gen.take(replies.pop(), gen.tokens, gen.logits)
        generations.append(gen)
    return median(ttft), median(tbt), generations


def median(timings):
    return summarize([t.median_ms for t in timings])


def time_here(model: SmallLM, reference: SmallLM, run: Run, seed: int):
    """TTFT and TBT of a model with a cache in this process, timed as the worker's run is (a warm-up of a
    prefill and two steps, then REPS generations of the same length), the last generation checked."""
    state = {}

    def prefill(gen):
        state.pop("cache", None)  # the last generation's cache goes before the next is made
        state["cache"] = model.new_cache(run.batch)
        gen.logits[:, 0] = model(gen.prompt, state["cache"], last=True)[:, 0]
        run.sync()

    def steps(gen, count):
        for i in range(count):
            token = gen.logits[:, i].argmax(dim=-1, keepdim=True)
            gen.tokens[:, i:i + 1] = token
            gen.logits[:, i + 1] = model(token, state["cache"], last=True)[:, 0]
        run.sync()

    ttft, tbt = [], []
    with torch.no_grad(), exact_float32():
        warm = Generation(run, model.config.vocab, seed)
        prefill(warm)
        steps(warm, 2)
        for rep in range(REPS):
            gen = Generation(run, model.config.vocab, seed + 1 + rep)
            ttft.append(bench.host_clock(partial(prefill, gen), reps=1, per_request=1, device=run.device))
            tbt.append(bench.host_clock(partial(steps, gen, run.steps), reps=1, per_request=run.steps,
                                        device=run.device))
    gen.check(reference)
    return median(ttft), median(tbt)


def time_recompute(model: SmallLM, run: Run, seed: int) -> float:
    """Without a cache each new token runs the whole sequence again: one such step at the run's middle
    length (the mean of its steps' lengths), after one of the same length as a warm-up."""
    tokens = random_tokens((run.batch, run.prompt + run.steps), model.config.vocab, seed).to(run.device)
    middle = run.prompt + run.steps // 2 + 1
    with torch.no_grad(), exact_float32():
        once = lambda: (model(tokens[:, :middle], last=True), run.sync())  # noqa: E731
        once()
        return bench.host_clock(once, reps=1, per_request=1, device=run.device).median_ms


def floor_ms(config: Config, run: Run, copy_gbs: float) -> tuple[float, float]:
    """(bytes, ms): what one decode step must read, every weight once and the cache at its mean length.

    The embedding table is left out: a step reads only its tokens' rows of it.
    """
    mean_length = run.prompt + (run.steps + 1) / 2
    cache = 2 * config.layers * run.batch * config.hidden * mean_length * 4
    nbytes = (config.parameters() - config.vocab * config.hidden) * 4 + cache
    return nbytes, nbytes / (copy_gbs * 1e9) * 1e3


def reference_attention(report):
    """The reference solution's attention with the reference kernels, or None (the student's handout)."""
    if not impl.has_solution(6):
        return None
    try:
        from task5.attention import built_kernels
        from task6.solution.attention import CachedAttention

        return CachedAttention, built_kernels(solution=True)
    except Exception as err:  # noqa: BLE001  the instructor's build: say so, keep the student's numbers
        report.note(f"the reference kernels could not be built, so the reference run is left out: {err}")
        return None


def run_generation(report, worker, name: str, config: Config, run: Run, seed: int, copy_gbs=None,
                   baselines: bool = True):
    """Your model's generation in the worker, then, with the worker ended, the checks and the baselines here.

    copy_gbs: the copy bandwidth, measured here when None (on the GPU). baselines: also time SDPA and the
    reference kernels over the same cache (the grader leaves them out: no point depends on them).
    """
    if config.max_seq < run.prompt + run.steps:
        raise ValueError(f"{name}: max_seq {config.max_seq} is shorter than the run")
    title = f"generation ({name}): time to first token, time between tokens, TBT floor"
    # Measured before and after the worker's run, the higher counts: right after the worker
    # ends the GPU may still be freeing its memory, and a low bandwidth would lower the floor.
    try:
        copy_before = copy_gbs or bench.copy_bandwidth_gbs()
    except RuntimeError:  # no room beside the worker's model, say: the measurement after its run decides
        copy_before = 0.0
    try:
        ttft, tbt, generations = time_student(worker, config, run, seed)
    except (WorkerError, WorkerDied, AssertionError) as err:
        report.add(title, False, f"your model's generation run failed: {err}", kind="benchmark",
                   cause=getattr(err, "cause", None))
        return
    worker.stop()  # its memory is free, and the GPU is ours alone now

    def result():
        measured_gbs = copy_gbs or max(copy_before, bench.copy_bandwidth_gbs())
        model = SmallLM(config, FullAttention, device=run.device, seed=seed)
        for i, gen in enumerate(generations):
            try:
                gen.check(model)
            except AssertionError as err:
                return False, f"timed generation {i + 1} of {len(generations)}: {err}", {}
        generations.clear()
        nbytes, floor = floor_ms(config, run, measured_gbs)
        if tbt.median_ms < floor / FASTEST_VS_FLOOR:
            return False, (f"TBT {tbt.median_ms:.2f} ms is under the floor of {floor:.2f} ms divided by "
                           f"{FASTEST_VS_FLOOR}: faster than the GPU can read the weights, so work was skipped"), {}
        metrics = {"ttft_ms": ttft.median_ms, "tbt_ms": tbt.median_ms, "tbt_floor_ms": floor,
                   "tbt_over_floor": tbt.median_ms / floor, "copy_gbs": measured_gbs, "bytes_per_step": nbytes}
        message = (f"batch {run.batch}, prompt {run.prompt}, {run.steps} steps, hidden {config.hidden}, "
                   f"{config.layers} layers ({config.parameters() * 4 / 1e9:.1f} GB of weights): "
                   f"TTFT {ttft.median_ms:.1f} ms, TBT {tbt.median_ms:.2f} ms = {tbt.median_ms / floor:.2f}x the floor "
                   f"of {floor:.2f} ms ({nbytes / 1e9:.1f} GB per step at the {measured_gbs:.0f} GB/s copy bandwidth)")
        sdpa = SmallLM(config, SdpaCachedAttention, device="meta").share_weights(model)
        t = bench.or_out_of_memory(lambda: time_here(sdpa, model, run, seed)) if baselines else "left out"
        if not isinstance(t, str):
            metrics |= {"ttft_sdpa_ms": t[0].median_ms, "tbt_sdpa_ms": t[1].median_ms,
                        "tbt_speedup_vs_sdpa": t[1].median_ms / tbt.median_ms}
            message += f"; SDPA over the same cache: TTFT {t[0].median_ms:.1f} ms, TBT {t[1].median_ms:.2f} ms"
        recompute = bench.or_out_of_memory(lambda: time_recompute(model, run, seed))
        if not isinstance(recompute, str):
            metrics |= {"tbt_recompute_ms": recompute, "tbt_speedup_vs_recompute": recompute / tbt.median_ms}
            message += f"; no cache, recomputing the sequence: {recompute:.1f} ms per token (at its middle length)"
        reference = reference_attention(report) if run.device == "cuda" and baselines else None
        if reference is not None:
            attention, kernels = reference
            ours = SmallLM(config, attention, device="meta").share_weights(model).set_kernels(kernels)
            t = bench.or_out_of_memory(lambda: time_here(ours, model, run, seed))
            if not isinstance(t, str):
                metrics |= {"ttft_reference_ms": t[0].median_ms, "tbt_reference_ms": t[1].median_ms,
                            "reference_tbt_over_floor": t[1].median_ms / floor}
                message += (f"; reference kernels: TTFT {t[0].median_ms:.1f} ms, TBT {t[1].median_ms:.2f} ms "
                            f"({t[1].median_ms / floor:.2f}x the floor)")
        return True, message, metrics

    report.run(title, result, kind="benchmark")


def needs_gpu():
    raise NeedsCuda("no CUDA GPU is visible: the model with your kernels runs on the GPU")


def main(argv=None) -> int:
    parser = cli.parser(6, __doc__.splitlines()[2])
    parser.add_argument("--size", choices=("auto", "handout", "small"), default="auto",
                        help="the generation run's model: handout (about 34 GB of GPU memory), small (about 5 GB), "
                             "auto (handout on a GPU with 40 GB or more)")
    args = parser.parse_args(argv)
    report = Report(6, args.solution, "prefill and decode inside a small LLM", args.student_dir)
    with cli.worker(report, 6, args, cuda=torch.cuda.is_available()) as worker:
        if worker is None:
            return report.finish(args.json)
        report.begin_part("logic on the CPU, PyTorch in place of the kernels", (1, 2, 3, 4))
        for case in cli.cases(6, "cpu", CPU_CASES, args.hidden, shape_text, devices=("cpu",), causal=(False,)):
            report.run(case.name, lambda: check_teacher_forced(worker, case, CPU_VOCAB))
        report.end_part("cpu")
        logic_works = bool(report.cases) and all(c.passed for c in report.cases)
        if torch.cuda.is_available():
            worker.take_kernels_built_ahead()  # graded: the kernels the grader built while the CPU part ran
            report.begin_part("your Task 4 and Task 5 kernels inside the model, on the GPU", (1, 2, 3, 4))
            for case in cli.cases(6, "gpu", GPU_CASES, args.hidden, shape_text, causal=(False,)):
                report.run(case.name, lambda: check_teacher_forced(worker, case, GPU_VOCAB))
            report.end_part("gpu")
        else:
            report.run("the model with your kernels", needs_gpu)
        if logic_works:  # they feed a prompt first, so they need steps 1-4
            report.run("a full cache and bad input raise clear errors (the given model)", lambda: check_errors(worker),
                       kind="given")
        if not all(c.passed for c in report.cases):
            report.note("the generation run is skipped until every check passes")
        elif torch.cuda.is_available():
            size = choose_size(args.size)
            if args.grading:
                report.note(cli.GRADING_LEAVES_OUT.format(task=6, what="SDPA and the reference kernels over the "
                                                                      "same cache in the generation run"))
            with gpu_share.alone(worker):  # it also gives back the checks' own reference models' memory
                run_generation(report, worker, size, SIZES[size], HANDOUT, cli.seed(60, args.hidden),
                               baselines=not args.grading)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(6, args.solution, args.student_dir, report.attention_ops), kind="rule")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
