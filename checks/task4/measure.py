"""Task 4's measuring: your kernel, the reference and PyTorch timed on one clock (harness/bench.py).

Used by the test (python -m task4.test), the sweep (--sweep), the tuner and the profiler, so none
of them imports the test command. A benchmark case is a TimedCase; every timed request runs over
distinct input sets, and every output it writes is checked right after it (TimedSets). The backward part's
timings are measure_backward.py's.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import impl

from harness import bench, calibration
from harness.checks import GUARD_ELEMENTS, HALF_TYPES, Guarded, bit_sum, compare, exact_float32, guard_damage
from common.layer import mha_weights
from harness.attention_math import (attention_flops, attention_float64, causal_mask, expand_kv_heads,
                              fp32_peak_tflops, fp32_tensor_core_bound_tflops, half_tensor_core_bound_tflops,
                              naive_attention, padded_queries, padding_mask)

ATOL, RTOL = 2e-5, 1e-4  # what every output is held to, checked (checks/task4/test.py) or timed (here)
HANDOUT_CASES = [(4, 128), (64, 4096)]  # (batch, seq) of the handout's layer
HANDOUT_LAYER = (4096, 32)  # (hidden, heads)
PERF_CASE = (8, 32, 4096, 128)  # (batch, heads, seq, head_dim)
# The reference's other kernels folder (task4/solution/tensor_cores, not in the handout): the same
# attention with both products on the tensor cores (3xTF32), timed when the reference is tested.
TENSOR_CORES = "tensor_cores"
REPS = 5  # timed requests per benchmark

# The optional bf16/fp16 kernel (steps 8-11). How far a 16-bit output may be from float64 on the same 16-bit
# inputs: this many times SDPA's own largest error there (PyTorch's attention in the same type), and at least half
# a unit in the last place of the largest |expected|. Measured on an H100: the reference's largest error equals
# SDPA's on every case of checks/task4/cases.py's HALF_CASES, in both types (the output's rounding to 16 bits dominates).
HALF_ERROR_FACTOR = 2.0
HALF_EPS = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}  # half a unit in the last place, relative
HALF_BENCHMARKS = [(8, 32, 4096, 64), (8, 32, 4096, 128)]  # (batch, heads, seq, head_dim): causal and not, each type


def sdpa_error(q, k, v, causal, scale, key_start, expected) -> float:
    """SDPA's largest error against float64 on the same 16-bit inputs: the yardstick of what the type allows."""
    batch, heads, seq_q, _ = q.shape
    seq_k = k.shape[2]
    q, k, v = q.cuda(), expand_kv_heads(k, heads).cuda(), expand_kv_heads(v, heads).cuda()
    hidden = torch.zeros(batch, 1, seq_q, seq_k, dtype=torch.bool, device="cuda")  # True: a key not seen
    if causal:
        hidden |= causal_mask(seq_q, seq_k, "cuda")
    if key_start is not None:
        hidden |= padding_mask(key_start.cuda(), seq_q, seq_k)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=~hidden, scale=scale).double().nan_to_num(0.0)
    if key_start is not None:  # padded queries see no key: zeros, as the kernels define them
        got = got.masked_fill(padded_queries(key_start.cuda(), seq_q, seq_k), 0.0)
    return float((got - expected.to(got.device)).abs().max())


def half_allowance(q, k, v, causal, scale, key_start, expected) -> tuple[float, str]:
    """(the largest error a 16-bit output of these inputs may have, the words that say why)."""
    yardstick = sdpa_error(q, k, v, causal, scale, key_start, expected)
    allowed = max(HALF_ERROR_FACTOR * yardstick, HALF_EPS[q.dtype] * float(expected.abs().max()))
    return allowed, (f"allowed {allowed:.1e}: the larger of {HALF_ERROR_FACTOR:g}x SDPA's {yardstick:.1e} in "
                     f"{str(q.dtype)[6:]} on these inputs and half a unit in the last place of the largest |expected|")


class TimedSets:
    """Distinct input sets on the GPU for one benchmark, refreshed before every timed request.

    Before each request the inputs get fresh values and the outputs NaN; one head of every
    set, picked at random after the values are written, is copied here first, so what the
    worker does to the inputs cannot change what its outputs are checked against. Every
    tensor sits between guard bands (harness/checks.py), and each input's bit sum is
    taken before the request: a write past an output or into an input fails the benchmark.
    """

    def __init__(self, batch, heads, seq, head_dim, estimate_ms, dtype=torch.float32):
        shape = (batch, heads, seq, head_dim)
        set_bytes = 4 * (batch * heads * seq * head_dim + 2 * GUARD_ELEMENTS) * dtype.itemsize
        self.count = bench.sets_for(set_bytes, estimate_ms)
        self.guarded = [tuple(Guarded(name, shape, dtype=dtype) for name in ("q", "k", "v", "out"))
                        for _ in range(self.count)]
        self.sets = [tuple(g.tensor for g in group) for group in self.guarded]
        self.picked: list = []
        self.bit_sums: list = []
        self.rng = random.Random()

    def refresh(self):
        self.picked = []
        for q, k, v, out in self.sets:
            for t in (q, k, v):
                t.normal_()
            out.fill_(math.nan)
            b, h = self.rng.randrange(q.shape[0]), self.rng.randrange(q.shape[1])
            self.picked.append((b, h, q[b, h].clone(), k[b, h].clone(), v[b, h].clone()))  # not the worker's memory
        self.bit_sums = [[bit_sum(t) for t in s[:3]] for s in self.sets]
        torch.cuda.synchronize()

    def check(self, causal, scale):
        """Every output of the request just timed: raises AssertionError with the first wrong one."""
        for i, (group, prints) in enumerate(zip(self.guarded, self.bit_sums)):
            where = f"in timed run {i + 1} of {self.count}"
            damage = guard_damage(*group)  # the bands only: inputs are checked by their bit sums
            if damage:
                raise AssertionError(f"{damage.message} ({where})")
            for g, before in zip(group, prints):
                if bit_sum(g.tensor) != before:
                    raise AssertionError(f"changed its input `{g.name}` ({where}); inputs are read-only")
        for i, ((q, k, v, out), (b, h, q_bh, k_bh, v_bh)) in enumerate(zip(self.sets, self.picked)):
            expected = attention_float64(q_bh, k_bh, v_bh, causal, scale)[0]
            atol, rtol = ATOL, RTOL
            if q.dtype != torch.float32:  # 16-bit: what the type allows on these inputs (half_allowance)
                atol, rtol = half_allowance(*(t[None, None] for t in (q_bh, k_bh, v_bh)), causal, scale, None,
                                            expected[None, None])[0], 0.0
            result = compare(out[b, h], expected, atol=atol, rtol=rtol, poisoned=True,
                             name=f"output of timed run {i + 1} of {self.count}, head ({b}, {h})")
            if not result.passed:
                raise AssertionError(result.message)


ESTIMATE_TFLOPS = 40.0  # what the reference kernel reaches: sizes a request, nothing else
ESTIMATE_HALF_TFLOPS = 170.0  # the same for the bf16/fp16 reference
ESTIMATE_HOPPER_TFLOPS = 500.0  # and for the Hopper reference (steps 17-22)


def time_student(worker, batch, heads, seq, head_dim, causal, dtype=torch.float32, entry=None):
    """Your kernel over distinct sets per request, every output checked; (Timing, sets used) or (message, None).
    dtype: bfloat16 or float16 times the kernel of steps 8-11 (`entry` "run_batch_hopper": steps 17-22's)."""
    tflops = (ESTIMATE_TFLOPS if dtype == torch.float32 else
              ESTIMATE_HOPPER_TFLOPS if entry == "run_batch_hopper" else ESTIMATE_HALF_TFLOPS)
    estimate_ms = attention_flops(batch, heads, seq, seq, head_dim, causal) / (tflops * 1e9)
    timed = TimedSets(batch, heads, seq, head_dim, estimate_ms, dtype)
    scale = 1.0 / math.sqrt(head_dim)
    entry = entry or ("run_batch" if dtype == torch.float32 else "run_batch_half")
    kept = worker.keep("timed sets", timed.sets)
    try:
        timed.refresh()
        worker.call(entry, kept, causal, scale)  # warm-up
        timing = bench.host_clock(lambda: worker.call(entry, kept, causal, scale), reps=REPS,
                                  per_request=timed.count, before=timed.refresh,
                                  after=lambda: timed.check(causal, scale))
    except AssertionError as err:
        return str(err), None
    finally:
        worker.drop("timed sets")
    return timing, timed.count


def time_here(fn, batch, heads, seq, head_dim, count, dtype=torch.float32):
    """A trusted implementation (the reference kernel, naive PyTorch, SDPA) timed the same way."""
    def measure():
        sets = [tuple(torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype) for _ in range(4))
                for _ in range(count)]
        with torch.no_grad(), exact_float32():
            fn(*sets[0])
            return bench.host_clock(lambda: bench.run_here(fn, sets), reps=REPS, per_request=count)
    result = bench.or_out_of_memory(measure)
    torch.cuda.empty_cache()
    return result


# Timed too when the reference itself is tested: the other head sizes it is compiled for.
HEAD_DIM_CASES = [(4, 32, 2048, 64), (32, 32, 512, 80)]  # (batch, heads, seq, head_dim)


class TimedCase(NamedTuple):
    """One timed attention case; `scored`: its speed against the reference's is the grade's performance part."""
    name: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool
    scored: bool = False


def benchmark_cases(solution=False) -> list[TimedCase]:
    """Every timed attention case: the graded one, the handout's layer's, and the reference's other head sizes."""
    cases = []
    for shape in [PERF_CASE] + (HEAD_DIM_CASES if solution else []):
        b, h, s, d = shape
        cases += [TimedCase(f"attention batch {b} heads {h} seq {s} head_dim {d}{' causal' if c else ''}", b, h, s, d,
                            c, scored=shape == PERF_CASE) for c in (False, True)]
    hidden, heads = HANDOUT_LAYER
    for batch, seq in HANDOUT_CASES:
        for c in (False, True):
            name = f"attention alone batch {batch} seq {seq} hidden {hidden} heads {heads}{' causal' if c else ''}"
            cases.append(TimedCase(name, batch, heads, seq, hidden // heads, c))
    return cases


def layer_cases(grading: bool = False) -> list[tuple[int, int, bool]]:
    """(batch, seq, causal) of the handout's layer, timed against nn.MultiheadAttention; when grading, the
    smallest batch only: the largest takes a second a request, and no point depends on it (the kernel runs
    at that size, its outputs checked, in the timed case "attention alone" of the same shape)."""
    sizes = HANDOUT_CASES[:1] if grading else HANDOUT_CASES
    return [(batch, seq, causal) for batch, seq in sizes for causal in (False, True)]


def half_cases(part: str = "") -> list[TimedCase]:
    """The bf16/fp16 kernel's timed cases (steps 8-11; part "Hopper ": steps 17-22's): reported beside SDPA's flash
    backend, never scored."""
    return [TimedCase(f"{part}{name} attention batch {b} heads {h} seq {s} head_dim {d}{' causal' if c else ''}", b, h, s, d,
                      c) for name in HALF_TYPES for b, h, s, d in HALF_BENCHMARKS for c in (False, True)]


def run_half_benchmarks(report, worker, cases, call="forward_half"):
    """The bf16/fp16 kernel (steps 8-11; `call` "forward_hopper": steps 17-22's) timed in the worker, the worker
    ended, then the reference and SDPA's flash backend here (and its cuDNN backend beside the Hopper kernel); each
    line an optional case: reported, never scored, never the task's status."""
    entry = "run_batch_hopper" if call == "forward_hopper" else None
    student = {c.name: time_student(worker, c.batch, c.heads, c.seq, c.head_dim, c.causal, half_type(c.name), entry)
               for c in cases}
    worker.stop()
    reference = bench.load_reference(report, 4)
    for c in cases:
        report.run(c.name, lambda: half_result(*student[c.name], reference, c.batch, c.heads, c.seq, c.head_dim,
                                               c.causal, half_type(c.name), call), kind="optional")


def run_benchmarks(report, worker, cases, layer_cases, with_tensor_cores=False):
    """Time your kernel in the worker for every case, end the worker, then time everything else here.
    with_tensor_cores: time the reference's tensor-core kernels too, beside SDPA (when the reference is tested)."""
    student = {}
    for c in cases:
        student[c.name] = time_student(worker, c.batch, c.heads, c.seq, c.head_dim, c.causal)
    layers = {}
    for batch, seq, causal in layer_cases:
        layers[(batch, seq, causal)] = time_student_layer(worker, batch, seq, causal)
    worker.stop()  # its context is gone, and any work it had queued with it: the GPU is ours alone now

    reference = bench.load_reference(report, 4) if any(c.scored for c in cases) else None
    tensor_cores = bench.load_reference(report, 4, TENSOR_CORES) if with_tensor_cores else None
    estimate = not impl.has_solution(4)  # the handout: the points are estimated (harness/calibration.py)
    for c in cases:
        timing, count = student[c.name]
        report.run(c.name, lambda: attention_result(timing, count, reference if c.scored else None, c.batch, c.heads,
                                                    c.seq, c.head_dim, c.causal,
                                                    estimate_for=c.name if c.scored and estimate else None,
                                                    tensor_cores=tensor_cores),
                   kind="benchmark")
    report.run("causal runs skip the tiles past the diagonal", lambda: causal_skip(cases, student), kind="benchmark")
    hidden, heads = HANDOUT_LAYER
    for (batch, seq, causal), timing in layers.items():
        report.run(f"layer batch {batch} seq {seq} hidden {hidden} heads {heads}{' causal' if causal else ''}",
                   lambda: layer_result(timing, batch, seq, causal), kind="benchmark")


def time_tensor_cores(module, metrics, t_sdpa, batch, heads, seq, head_dim, causal, count) -> str:
    """The reference's tensor-core kernel timed like the others; a failure is told, never the case's verdict."""
    scale = 1.0 / math.sqrt(head_dim)
    try:
        timing = time_here(lambda q, k, v, o: module.forward(q, k, v, o, causal, scale), batch, heads, seq, head_dim,
                           count)
    except Exception as err:  # noqa: BLE001  not graded: the line says what went wrong
        return f"not timed ({type(err).__name__}: {err})"
    metrics["tensor_core_reference_ms"] = getattr(timing, "median_ms", None)
    ratio = bench.ratio(t_sdpa, timing)
    return bench.timing_text(timing) + (f", {ratio:.2f}x SDPA" if ratio else "")


CAUSAL_MOST = 0.8  # of the full run's time; skipping the tiles past the diagonal gives about 0.5


def causal_skip(cases, student):
    """A causal run does half the work, so it must take clearly less time than the full one."""
    full = {c[1:5]: student[c.name][0] for c in cases if not c.causal}  # by (batch, heads, seq, head_dim)
    pairs = [(student[c.name][0], full.get(c[1:5]), c.name) for c in cases if c.causal and c.seq >= 1024]
    timed = [(c, f, name) for c, f, name in pairs if not isinstance(c, str) and f is not None and not isinstance(f, str)]
    if not timed:
        return True, "not measured (no causal case with its full run was timed)", {}
    worst = max(timed, key=lambda p: p[0].median_ms / p[1].median_ms)
    fraction = worst[0].median_ms / worst[1].median_ms
    message = f"{worst[2]}: {fraction:.2f} of the full run's time"
    if fraction > CAUSAL_MOST:
        return False, (message + f" (more than {CAUSAL_MOST}): K/V tiles entirely past the diagonal should "
                       "not be loaded or computed at all (README, Task 4)"), {"causal_fraction": fraction}
    return True, message, {"causal_fraction": fraction}


def attention_result(timing, count, reference, batch, heads, seq, head_dim, causal, estimate_for=None,
                     tensor_cores=None):
    if count is None:
        return False, timing, {}
    scale = 1.0 / math.sqrt(head_dim)
    flops = attention_flops(batch, heads, seq, seq, head_dim, causal)
    tflops = flops / (timing.median_ms * 1e-3) / 1e12
    metrics = {"kernel_ms": timing.median_ms, "tflops": tflops, "sets_per_request": count}
    sets = f"{count} distinct input set{'s' if count > 1 else ''}"
    message = f"kernel {timing.median_ms:.3f} ms ({tflops:.1f} TFLOP/s; {sets} per request)"
    if reference is not None:
        t_ref = time_here(lambda q, k, v, o: reference.forward(q, k, v, o, causal, scale), batch, heads, seq,
                          head_dim, count)
        if not isinstance(t_ref, str):
            metrics |= {"reference_ms": t_ref.median_ms, bench.VS_REFERENCE: t_ref.median_ms / timing.median_ms}
            message += f", reference kernel {t_ref.median_ms:.3f} ms ({metrics[bench.VS_REFERENCE]:.2f}x its speed)"
    t_naive = time_here(lambda q, k, v, o: naive_attention(q, k, v, causal, scale), batch, heads, seq, head_dim, count)
    t_sdpa = time_here(lambda q, k, v, o: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
                       batch, heads, seq, head_dim, count)
    metrics |= {"naive_ms": getattr(t_naive, "median_ms", None), "sdpa_ms": getattr(t_sdpa, "median_ms", None),
                "speedup_vs_naive": bench.ratio(t_naive, timing), "speedup_vs_sdpa": bench.ratio(t_sdpa, timing)}
    message += f", naive {bench.timing_text(t_naive)}, SDPA {bench.timing_text(t_sdpa)}"
    for key, label in (("naive", "naive"), ("sdpa", "SDPA")):
        if metrics[f"speedup_vs_{key}"]:
            message += f"; {metrics[f'speedup_vs_{key}']:.2f}x {label}"
    # A kernel may run on the CUDA cores (FFMA) or on the tensor cores (3xTF32): its share of each peak.
    metrics["fp32_peak_percent"] = 100 * tflops / fp32_peak_tflops()
    metrics["fp32_tensor_core_percent"] = 100 * tflops / fp32_tensor_core_bound_tflops()
    message += (f"; {metrics['fp32_peak_percent']:.0f}% of the float32 peak on the CUDA cores (FFMA), "
                f"{metrics['fp32_tensor_core_percent']:.0f}% of float32's on the tensor cores (3xTF32)")
    if tensor_cores is not None:  # SDPA's own arithmetic (3xTF32), for comparison
        message += "; the reference on the tensor cores (3xTF32) " + time_tensor_cores(
            tensor_cores, metrics, t_sdpa, batch, heads, seq, head_dim, causal, count)
    if estimate_for:
        metrics[calibration.ESTIMATE], words = calibration.estimate(4, estimate_for, metrics,
                                                                    torch.cuda.get_device_name())
        message += f"; {words}"
    # A kernel may use the tensor cores (close to float32's accuracy, or the checks fail it), so the bound
    # that only skipped work can pass is theirs.
    if tflops > (bound := fp32_tensor_core_bound_tflops()):
        return False, message + (f": faster than float32 can run on this GPU even on the tensor cores ({bound:.0f} "
                                 "TFLOP/s), so work was skipped"), metrics
    return True, message, metrics


def half_type(name: str) -> torch.dtype:
    return HALF_TYPES[name.removeprefix("Hopper ").split()[0]]


def half_result(timing, count, reference, batch, heads, seq, head_dim, causal, dtype, call="forward_half"):
    """A line of the bf16/fp16 kernel (or the Hopper one: `call`) against SDPA's flash backend (FlashAttention-2)
    in the same type, and for the Hopper kernel its cuDNN backend too: reported, never scored (no metric the grade
    reads)."""
    if count is None:
        return False, timing, {}
    scale = 1.0 / math.sqrt(head_dim)
    flops = attention_flops(batch, heads, seq, seq, head_dim, causal)
    tflops = flops / (timing.median_ms * 1e-3) / 1e12
    bound = half_tensor_core_bound_tflops()
    metrics = {"kernel_ms": timing.median_ms, "tflops": tflops, "sets_per_request": count,
               "half_peak_percent": 100 * tflops / bound}
    message = (f"kernel {timing.median_ms:.3f} ms ({tflops:.0f} TFLOP/s, {metrics['half_peak_percent']:.0f}% of the "
               f"{bound:.0f} TFLOP/s bound of 16-bit products on the tensor cores)")

    def sdpa(backend):
        def run(q, k, v, o):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        try:
            return time_here(run, batch, heads, seq, head_dim, count, dtype)
        except RuntimeError as err:  # no such kernel for this GPU or type: said, the line still counts
            return f"not available here ({str(err).splitlines()[0][:120]})"
    t_flash = sdpa(SDPBackend.FLASH_ATTENTION)
    ratio = bench.ratio(t_flash, timing)
    metrics |= {"sdpa_flash_ms": getattr(t_flash, "median_ms", None), "speedup_vs_sdpa_flash": ratio}
    message += f", SDPA's flash backend {bench.timing_text(t_flash)}" + (f": {ratio:.2f}x its speed" if ratio else "")
    if call == "forward_hopper":  # the bar of steps 17-22: cuDNN's Hopper kernel
        t_cudnn = sdpa(SDPBackend.CUDNN_ATTENTION)
        cudnn_ratio = bench.ratio(t_cudnn, timing)
        metrics |= {"sdpa_cudnn_ms": getattr(t_cudnn, "median_ms", None), "speedup_vs_sdpa_cudnn": cudnn_ratio}
        message += f", cuDNN's {bench.timing_text(t_cudnn)}" + (f": {cudnn_ratio:.2f}x its speed" if cudnn_ratio else "")
    if reference is not None:
        t_ref = time_here(lambda q, k, v, o: getattr(reference, call)(q, k, v, o, causal, scale), batch, heads, seq,
                          head_dim, count, dtype)
        if not isinstance(t_ref, str):
            metrics["half_reference_ms"] = t_ref.median_ms
            flash_ratio = bench.ratio(t_flash, t_ref)
            message += (f"; reference kernel {t_ref.median_ms:.3f} ms"
                        + (f" ({flash_ratio:.2f}x SDPA flash)" if flash_ratio else ""))
    message += "; not scored"
    if tflops > bound:
        return False, message + ": faster than 16-bit products can run on this GPU, so work was skipped", metrics
    return True, message, metrics


def time_student_layer(worker, batch, seq, causal):
    hidden, heads = HANDOUT_LAYER
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True)
    worker.call("make_layer", hidden, heads, [w.cuda() for w in mha_weights(mha)])
    count = bench.sets_for(batch * seq * hidden * 4 * 6, estimate_ms=1.0 if seq <= 1024 else 500.0, most=64)
    inputs = [torch.randn(batch, seq, hidden, device="cuda") for _ in range(count)]
    kept = worker.keep("layer inputs", inputs)
    try:
        worker.call("layer_batch", kept, causal)  # warm-up
        return bench.host_clock(lambda: worker.call("layer_batch", kept, causal), reps=3, per_request=count), count
    except torch.cuda.OutOfMemoryError:
        return "out of memory", count
    finally:
        worker.drop("layer inputs")
        del inputs
        torch.cuda.empty_cache()


def layer_result(timing_count, batch, seq, causal):
    hidden, heads = HANDOUT_LAYER
    timing, count = timing_count
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True, device="cuda")
    mask = causal_mask(seq, seq, "cuda") if causal else None

    def measure():
        inputs = [torch.randn(batch, seq, hidden, device="cuda") for _ in range(count)]
        with torch.no_grad(), exact_float32():
            run = lambda: [mha(x, x, x, attn_mask=mask, need_weights=False) for x in inputs]  # noqa: E731
            run()
            torch.cuda.synchronize()
            return bench.host_clock(lambda: (run(), torch.cuda.synchronize()), reps=3, per_request=count)

    t_mha = bench.or_out_of_memory(measure)
    torch.cuda.empty_cache()
    speedup = bench.ratio(t_mha, timing)
    message = f"layer {bench.timing_text(timing)}, nn.MultiheadAttention {bench.timing_text(t_mha)}"
    message += f" ({speedup:.2f}x)" if speedup else ""
    return True, message, {"layer_ms": getattr(timing, "median_ms", None), "mha_ms": getattr(t_mha, "median_ms", None),
                           "speedup_vs_mha": speedup}
