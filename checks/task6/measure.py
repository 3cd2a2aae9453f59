"""Task 6's measuring: the handout's generation run, timed (imported by checks/task6/test.py).

Your model generates in the worker (TTFT and TBT on the host clock around each request, REPS
generations after a warm-up; a grading leaves the run out: no point depends on it), with its decode steps launched
from Python and again replayed
from one step captured as a CUDA graph; then, with the worker ended, every timed generation is
checked against the model with PyTorch's attention, the TBT is set against its floor (the bytes
one decode step must read at the copy bandwidth measured in the same run) and the TTFT against
its own (the prompt's multiply-adds at the float32 matrix-product rate measured in the same run).
Beside it: SDPA over the same cache (with and without the graph), the model recomputing the
sequence without one, and the reference kernels, timed the same way (the grader leaves out the
first and the last: no point depends on them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from common import impl
from common.torch_kernels import PyTorchKernels
from harness import bench
from harness.checks import compare_logits, exact_float32, half_logits_atol
from harness.sandbox import WorkerDied, WorkerError
from harness.timing import summarize
from task6.model import Attention, Config, Decoder, SmallLM

HINTS = (" (prefill: steps 1 and 3)", " (decode: steps 1, 2 and 4)")
REPS = 3  # timed generations
BUILD_TIMEOUT_S = 900  # the first GPU model builds your Task 4 and Task 5 kernels
FASTEST_VS_FLOOR = 1.25  # a decode step this much under the TBT floor skipped work


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
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(self.merge_heads(out))


class SdpaCachedAttention(Attention):
    """PyTorch's SDPA over the same KV cache: the baseline with a cache. Capturable as a CUDA graph, as yours:
    a decode step writes each sequence's row at cache.lengths and attends over the whole cache with a mask
    of each sequence's written positions (the prefill, never captured, attends over the prompt alone)."""

    def forward(self, x, cache):
        if cache.key_start is not None:
            raise ValueError("the SDPA baseline runs batches without padding only (cache.key_start is set)")
        q, k, v = self.project(x)
        n = x.shape[1]
        positions = cache.lengths[:, None] + torch.arange(n, device=x.device)
        q, k = self.rope(q, positions), self.rope(k, positions)
        enable_gqa = self.kv_heads != self.heads
        if cache.length == 0:
            cache.k[:, :, :n], cache.v[:, :, :n] = k, v
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)
        else:
            sequences = torch.arange(x.shape[0], device=x.device)
            cache.k[sequences, :, cache.lengths], cache.v[sequences, :, cache.lengths] = k[:, :, 0], v[:, :, 0]
            written = torch.arange(cache.max_seq, device=x.device) <= cache.lengths[:, None]  # the new row too
            out = F.scaled_dot_product_attention(q, cache.k, cache.v, attn_mask=written[:, None, None, :],
                                                 enable_gqa=enable_gqa)
        cache.length += n
        return self.o_proj(self.merge_heads(out))


def random_tokens(shape, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))



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
    reps: int = REPS  # timed generations, each way (launched from Python, replayed as a CUDA graph)

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

    def sequence(self) -> torch.Tensor:
        return torch.cat((self.prompt, self.tokens), dim=1)

    def validate(self, vocab: int):
        """The tokens are ids of the vocabulary, each the argmax of the logits before it (before any model reads
        them: an id outside the embedding would stop the GPU)."""
        if (self.tokens < 0).any() or (self.tokens >= vocab).any():
            raise AssertionError("the generated tokens are not all valid token ids: not every step ran")
        if not torch.equal(self.tokens, self.logits[:, :-1].argmax(dim=-1)):
            raise AssertionError("the generated tokens are not the argmax of the logits before them")

    def check(self, model: SmallLM, same_type=None, dtype=None):
        """The logits against `model` (float32, PyTorch attention) teacher-forced on the same tokens. A 16-bit
        model's (dtype): within what the type allows, measured by `same_type`, the logits of the same 16-bit model
        with PyTorch's attention on the same tokens."""
        self.validate(model.config.vocab)
        prompt_len = self.prompt.shape[1]
        with torch.no_grad(), exact_float32():
            expected = model(self.sequence())[:, prompt_len - 1:].double()
        atol, said = None, ""
        if same_type is not None:
            yardstick = float((same_type.to(expected.device).double() - expected).abs().max())
            atol, said = half_logits_atol(yardstick, expected, dtype)
        passed, message, _ = compare_logits(self.logits.double(), expected, prompt_len, first=prompt_len - 1,
                                            hints=HINTS, atol=atol)
        if not passed:
            raise AssertionError(f"the timed generation's outputs are wrong: {message}{said}")


def time_student(worker, config: Config, run: Run, seed: int, graph: bool = False, make: bool = True,
                 dtype=torch.float32):
    """TTFT and TBT of your model in the worker, host clock around each request; (ttft, tbt, generations).
    graph: the decode steps replayed from a CUDA graph (captured in the untimed warm-up generation).
    dtype: the model's (bfloat16 or float16: the optional 16-bit part)."""
    if make:
        worker.call("make_model", config.as_dict(), seed, run.device, str(dtype)[6:], timeout=BUILD_TIMEOUT_S)
    warm = Generation(run, config.vocab, seed)
    worker.call("prefill", warm.prompt, warm.logits, graph)
    worker.call("steps", warm.tokens[:, :2], warm.logits[:, :3])
    ttft, tbt, generations = [], [], []
    for rep in range(run.reps):
        gen, replies = Generation(run, config.vocab, seed + 1 + rep), []
        ttft.append(bench.host_clock(lambda: replies.append(worker.call("prefill", gen.prompt, gen.logits, graph)),
                                     reps=1, per_request=1, device=run.device))
        gen.take(replies.pop(), gen.logits)
        tbt.append(bench.host_clock(lambda: replies.append(worker.call("steps", gen.tokens, gen.logits)),
                                    reps=1, per_request=run.steps, device=run.device))
        gen.take(replies.pop(), gen.tokens, gen.logits)
        generations.append(gen)
    return median(ttft), median(tbt), generations


def median(timings):
    return summarize([t.median_ms for t in timings])


def time_here(model: SmallLM, reference: SmallLM, run: Run, seed: int, graph: bool = False):
    """TTFT and TBT of a model with a cache in this process, timed as the worker's run is (a warm-up of a
    prefill and two steps, then run.reps generations of the same length), the last generation checked."""
    decoder = Decoder(model, graph)

    def prefill(gen):
        gen.logits[:, 0] = decoder.prefill(gen.prompt)[:, 0]
        run.sync()

    def steps(gen, count):
        for i in range(count):
            token = gen.logits[:, i].argmax(dim=-1, keepdim=True)
            gen.tokens[:, i:i + 1] = token
            gen.logits[:, i + 1] = decoder.step(token)[:, 0]
        run.sync()

    ttft, tbt = [], []
    with torch.no_grad(), exact_float32():
        warm = Generation(run, model.config.vocab, seed)
        prefill(warm)
        steps(warm, 2)
        for rep in range(run.reps):
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


def floor_ms(config: Config, run: Run, copy_gbs: float, value_bytes: int = 4) -> tuple[float, float]:
    """(bytes, ms): what one decode step must read, every weight once and the cache at its mean length, each
    value `value_bytes` (4: float32; 2: a 16-bit model).

    The embedding table is left out: a step reads only its tokens' rows of it.
    """
    mean_length = run.prompt + (run.steps + 1) / 2
    cache = 2 * config.layers * run.batch * config.key_value_heads * config.head_dim * mean_length * value_bytes
    nbytes = (config.parameters() - config.vocab * config.hidden) * value_bytes + cache
    return nbytes, nbytes / (copy_gbs * 1e9) * 1e3


def ttft_floor_ms(config: Config, run: Run, tflops: float) -> tuple[float, float]:
    """(FLOPs, ms): the prefill's multiply-adds at `tflops`: every layer's products for each prompt token,
    the causal attention's two (its half of the score matrix), and the LM head for the last position."""
    per_token = config.layer_matrix_parameters()  # each a multiply-add per token
    tokens = run.batch * run.prompt
    attention = 2 * run.batch * config.hidden * run.prompt * (run.prompt + 1)  # q.k and p.v, causal half
    flops = 2 * tokens * per_token * config.layers + attention * config.layers + 2 * run.batch * config.hidden * config.vocab
    return flops, flops / (tflops * 1e12) * 1e3


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


def same_type_logits(config: Config, seed: int, device: str, dtype, generations) -> list[torch.Tensor]:
    """What a 16-bit type allows: the logits of the same model in `dtype` with PyTorch's attention (the weights
    drawn from `seed` as the worker's), teacher-forced on each generation's tokens, in float32 on the CPU (its
    memory is given back before the float32 model is made)."""
    model = SmallLM(config, FullAttention, device=device, dtype=dtype, seed=seed)
    with torch.no_grad():
        logits = [model(gen.sequence())[:, gen.prompt.shape[1] - 1:].float().cpu() for gen in generations]
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return logits


def run_generation(report, worker, name: str, config: Config, run: Run, seed: int, copy_gbs=None,
                   baselines: bool = True, dtype=torch.float32, float32_run: dict | None = None):
    """Your model's generation in the worker, then, with the worker ended, the checks and the baselines here.

    copy_gbs: the copy bandwidth, measured here when None (on the GPU). baselines: also time SDPA and the
    reference kernels over the same cache (the grader leaves them out: no point depends on them).
    dtype: the model's; bfloat16 or float16 is the optional 16-bit part: its floor counts 2 bytes a value, its
    outputs are checked within what the type allows, no baseline runs, and its TBTs are set against
    float32_run's, the float32 generation's metrics, when given.
    """
    if config.max_seq < run.prompt + run.steps:
        raise ValueError(f"{name}: max_seq {config.max_seq} is shorter than the run")
    half = dtype != torch.float32
    in_type = f" in {str(dtype)[6:]}" if half else ""
    title = f"generation ({name}){in_type}: time to first token, time between tokens, TBT floor"
    # Measured before and after the worker's run, the higher counts: right after the worker
    # ends the GPU may still be freeing its memory, and a low bandwidth would lower the floor.
    try:
        copy_before = copy_gbs or bench.copy_bandwidth_gbs()
    except RuntimeError:  # no room beside the worker's model, say: the measurement after its run decides
        copy_before = 0.0
    try:
        ttft, tbt, generations = time_student(worker, config, run, seed, dtype=dtype)
    except (WorkerError, WorkerDied, AssertionError) as err:
        report.add(title, False, f"your model's generation run failed: {err}", kind="benchmark",
                   cause=getattr(err, "cause", None))
        return
    graphed = None  # the decode step as a CUDA graph: (tbt, generations), or why not
    if run.device == "cuda":
        try:
            _, graph_tbt, graph_generations = time_student(worker, config, run, seed, graph=True, make=False,
                                                           dtype=dtype)
            graphed = graph_tbt, graph_generations
        except (WorkerError, WorkerDied, AssertionError) as err:
            graphed = not_capturable(err)
    worker.stop()  # its memory is free, and the GPU is ours alone now

    def result():
        measured_gbs = copy_gbs or max(copy_before, bench.copy_bandwidth_gbs())
        nonlocal graphed
        for i, gen in enumerate(generations + (graphed[1] if isinstance(graphed, tuple) else [])):
            try:
                gen.validate(config.vocab)
            except AssertionError as err:
                if i < len(generations):
                    return False, f"timed generation {i + 1} of {len(generations)}: {err}", {}
                graphed = f"replayed, but timed generation {i + 1 - len(generations)} with the graph is wrong ({err})"
                break
        checked = generations + (graphed[1] if isinstance(graphed, tuple) else [])
        same_type = same_type_logits(config, seed, run.device, dtype, checked) if half else [None] * len(checked)
        graph_type = same_type[len(generations):]  # the graph's generations' own
        model = SmallLM(config, FullAttention, device=run.device, seed=seed)
        if half:  # the float32 model of the 16-bit model's weights, exactly
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(dtype))
        for i, gen in enumerate(generations):
            try:
                gen.check(model, same_type[i], dtype)
            except AssertionError as err:
                return False, f"timed generation {i + 1} of {len(generations)}: {err}", {}
        generations.clear()
        if isinstance(graphed, tuple):  # reported, not scored: a wrong replay is said, the run still counts
            for i, gen in enumerate(graphed[1]):
                try:
                    gen.check(model, graph_type[i], dtype)
                except AssertionError as err:
                    graphed = (f"replayed, but timed generation {i + 1} with the graph is wrong ({err}): the kernels "
                               "and RoPE must read cache.lengths, not the Python int cache.length, which a graph "
                               "keeps at the value of the step it was captured at (README, Task 6, step 5)")
                    break
            else:
                graphed[1].clear()
        same_type.clear()
        nbytes, floor = floor_ms(config, run, measured_gbs, dtype.itemsize)
        runs = [("", tbt)] + ([(" with the decode step as a CUDA graph", graphed[0])] if isinstance(graphed, tuple)
                              else [])
        for how, t in runs:
            if t.median_ms < floor / FASTEST_VS_FLOOR:
                return False, (f"TBT{how} {t.median_ms:.2f} ms is under the floor of {floor:.2f} ms divided by "
                               f"{FASTEST_VS_FLOOR}: faster than the GPU can read the weights, so work was skipped"), {}
        metrics = {"ttft_ms": ttft.median_ms, "tbt_ms": tbt.median_ms, "tbt_floor_ms": floor,
                   "tbt_over_floor": tbt.median_ms / floor, "copy_gbs": measured_gbs, "bytes_per_step": nbytes}
        message = (f"batch {run.batch}, prompt {run.prompt}, {run.steps} steps, hidden {config.hidden}, "
                   f"{config.layers} layers ({config.parameters() * dtype.itemsize / 1e9:.1f} GB of weights{in_type}): "
                   f"TTFT {ttft.median_ms:.1f} ms, TBT {tbt.median_ms:.2f} ms = {tbt.median_ms / floor:.2f}x the floor "
                   f"of {floor:.2f} ms ({nbytes / 1e9:.1f} GB per step at the {measured_gbs:.0f} GB/s copy bandwidth)")
        if isinstance(graphed, tuple):
            metrics |= {"tbt_graph_ms": graphed[0].median_ms, "tbt_graph_over_floor": graphed[0].median_ms / floor}
            message += (f"; with the decode step as a CUDA graph: TBT {graphed[0].median_ms:.2f} ms = "
                        f"{graphed[0].median_ms / floor:.2f}x the floor")
        elif graphed:
            message += f"; the decode step as a CUDA graph: {graphed}"
        if float32_run:  # a 16-bit step reads half the bytes: how much of that each way of launching it gets
            ways = [("", "tbt_ms", "launched from Python"), ("_graph", "tbt_graph_ms", "as a CUDA graph")]
            said = []
            for key, metric, how in ways:
                if metric in metrics and metric in float32_run:
                    metrics[f"tbt{key}_over_float32"] = metrics[metric] / float32_run[metric]
                    said.append(f"{metrics[metric] / float32_run[metric]:.2f}x ({how}, float32 "
                                f"{float32_run[metric]:.2f} ms)")
            message += f"; against the float32 model's TBT: {', '.join(said)}" if said else ""
        if run.device == "cuda":
            tflops = bench.matmul_tflops(run.batch * run.prompt, config.mlp, config.hidden, dtype=dtype)
            flops, ttft_floor = ttft_floor_ms(config, run, tflops)
            metrics |= {"ttft_floor_ms": ttft_floor, "ttft_over_floor": ttft.median_ms / ttft_floor,
                        "matmul_tflops": tflops}
            message += (f"; TTFT = {ttft.median_ms / ttft_floor:.2f}x its floor of {ttft_floor:.1f} ms ({flops / 1e12:.1f} "
                        f"TFLOP at the {tflops:.1f} TFLOP/s of a {str(dtype)[6:]} product measured here)")
        if half:  # the baselines are float32's (the float32 run reports them)
            return True, message, metrics
        reference = reference_attention(report) if run.device == "cuda" and baselines else None
        sdpa = SmallLM(config, SdpaCachedAttention, device="meta").share_weights(model)
        if reference is not None:  # the same products as your model's: the given kernel, from the reference's build
            sdpa.set_linear(reference[1].linear, reference[1].linear_max_rows())
        products = ("" if reference is not None or run.device != "cuda" else
                    " (its products by F.linear, slower than the given kernel your model uses: that kernel is "
                    "built into your Task 5 extension, which this process does not load)")
        ways = (False, True) if run.device == "cuda" else (False,)  # CUDA graphs: on the GPU only
        for graph in ways if baselines else ():
            t = bench.or_out_of_memory(lambda: time_here(sdpa, model, run, seed, graph=graph))
            if isinstance(t, str):
                continue
            key = "_graph" if graph else ""
            metrics |= {f"ttft_sdpa{key}_ms": t[0].median_ms, f"tbt_sdpa{key}_ms": t[1].median_ms}
            message += (f"; SDPA over the same cache{' as a CUDA graph' if graph else products}: "
                        f"{'' if graph else f'TTFT {t[0].median_ms:.1f} ms, '}TBT {t[1].median_ms:.2f} ms "
                        f"({t[1].median_ms / floor:.2f}x the floor)")
        recompute = bench.or_out_of_memory(lambda: time_recompute(model, run, seed))
        if not isinstance(recompute, str):
            metrics |= {"tbt_recompute_ms": recompute, "tbt_speedup_vs_recompute": recompute / tbt.median_ms}
            message += f"; no cache, recomputing the sequence: {recompute:.1f} ms per token (at its middle length)"
        if reference is not None:
            attention, kernels = reference
            ours = SmallLM(config, attention, device="meta").share_weights(model).set_kernels(kernels)
            ours.set_linear(kernels.linear, kernels.linear_max_rows())
            for graph in (False, True):
                t = bench.or_out_of_memory(lambda: time_here(ours, model, run, seed, graph=graph))
                if isinstance(t, str):
                    continue
                key = "_graph" if graph else ""
                metrics |= {f"ttft_reference{key}_ms": t[0].median_ms, f"tbt_reference{key}_ms": t[1].median_ms,
                            f"reference{key}_tbt_over_floor": t[1].median_ms / floor}
                message += (f"; reference kernels{' as a CUDA graph' if graph else ''}: "
                            f"{'' if graph else f'TTFT {t[0].median_ms:.1f} ms, '}TBT {t[1].median_ms:.2f} ms "
                            f"({t[1].median_ms / floor:.2f}x the floor)")
        return True, message, metrics

    report.run(title, result, kind="benchmark")


def not_capturable(err) -> str:
    """What to tell a student whose decode step did not capture as a CUDA graph (reported, not scored)."""
    text = str(getattr(err, "message", err)).splitlines()[0][:300]
    return (f"could not be captured ({text}): a captured step may not read a GPU value on the host (.item(), "
            "int(t), .tolist(), print(t), an if on a tensor) nor launch work on another stream (README, Task 6, "
            "step 5)")
