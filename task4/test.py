"""python -m task4.test [--solution] [--json PATH] [--sweep]

Checks Task 4's fused FlashAttention kernel on the GPU, then measures it:
- correctness against a float64 reference (head_dim 17 to 128, sequence lengths
  around the tile edges, seq_q != seq_k, causal and not, outputs pre-filled with
  NaN), the layer against torch.nn.MultiheadAttention, and the binding's errors;
- the handout's cases (hidden 4096, 32 heads; batch 4 seq 128 and batch 64 seq 4096):
  the layer against nn.MultiheadAttention, the attention alone against the naive
  PyTorch attention and scaled_dot_product_attention, with TFLOP/s and peak memory;
- batch 8, 32 heads, seq 4096, head_dim 128 against the same baselines and the
  reference kernel (the grade's performance part).
Your kernel runs in a worker process (task4/entry.py) on GPU memory this process owns.
Timing (common/bench.py) uses one host clock for your kernel, the reference and PyTorch:
each timed request runs over distinct input sets, and every output it writes is checked
(a sampled head of each, against float64) right after the request. The reference and
PyTorch are timed after your worker has ended, so nothing of yours runs beside them.
--sweep replaces those benchmarks (once the checks pass) by a sweep of the kernel, naive
PyTorch and SDPA over seq 128..8192 into task4-sweep.csv (and a plot when matplotlib
is installed). With --solution (the reference tested) the benchmarks add head_dim 64 and 80,
and the reference's tensor-core kernels (task4/solution/tensor_cores) are timed beside SDPA.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch import nn

from common import bench, calibration, cli, impl, sanitize
from common.checks import (GUARD_ELEMENTS, Guarded, compare, exact_float32, expect_errors, bit_sum,
                           guard_damage, guarded_input, guarded_output, random_tensor)
from common.layer import mha_weights
from common.records import Report
from common.reference import (attention_flops, attention_reference, causal_mask, fp32_peak_tflops,
                              fp32_tensor_core_bound_tflops, naive_attention)

# (batch, heads, seq_q, seq_k, head_dim)
CASES = [
    (1, 1, 1, 1, 32),
    (2, 3, 1, 257, 64),
    (2, 2, 63, 63, 64),
    (1, 2, 64, 64, 64),
    (2, 2, 65, 65, 64),
    (1, 3, 127, 127, 128),
    (1, 2, 128, 128, 128),
    (1, 2, 129, 129, 128),
    (2, 2, 100, 300, 80),
    (1, 2, 300, 520, 64),  # causal: query tiles past the first, each shifted by seq_k - seq_q
    (1, 2, 300, 300, 80),
    (1, 2, 200, 200, 72),
    (1, 2, 150, 150, 88),
    (1, 2, 131, 131, 85),
    (2, 1, 96, 160, 99),
    (1, 1, 77, 77, 17),
    (1, 2, 1000, 1000, 32),
]
ATOL, RTOL = 2e-5, 1e-4
HANDOUT_CASES = [(4, 128), (64, 4096)]  # (batch, seq) of the handout's layer
HANDOUT_LAYER = (4096, 32)  # (hidden, heads)
PERF_CASE = (8, 32, 4096, 128)  # (batch, heads, seq, head_dim)
# The reference's other kernels folder (task4/solution/tensor_cores, not in the handout): the same
# attention with both products on the tensor cores (3xTF32), timed when the reference is tested.
TENSOR_CORES = "tensor_cores"
REPS = 5  # timed requests per benchmark


def shape_text(shape) -> str:
    return "batch {} heads {} seq {}x{} head_dim {}".format(*shape)


def make_inputs(shape, seed, magnitude=1.0):
    b, h, sq, sk, d = shape
    return (random_tensor((b, h, sq, d), seed) * magnitude, random_tensor((b, h, sk, d), seed + 1),
            random_tensor((b, h, sk, d), seed + 2))


def check_case(worker, shape, causal, seed, scale=None, magnitude=1.0):
    q, k, v = make_inputs(shape, seed, magnitude)
    scale = 1.0 / math.sqrt(shape[-1]) if scale is None else scale
    inputs = [guarded_input(name, t) for name, t in zip("qkv", (q, k, v))]
    out = guarded_output("out", q.shape)
    worker.call("forward", *(t.tensor for t in inputs), out.tensor, causal, scale)
    return guard_damage(*inputs, out) or compare(out.tensor, attention_reference(q, k, v, causal, scale)[0],
                                                 atol=ATOL, rtol=RTOL, poisoned=True)


def check_layer(worker, hidden, heads, seq, causal, seed):
    torch.manual_seed(seed)
    reference = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True)
    worker.call("make_layer", hidden, heads, [w.cuda() for w in mha_weights(reference)])
    x = random_tensor((2, seq, hidden), seed + 1)
    out = worker.call("layer", x.cuda(), causal)
    with torch.no_grad(), exact_float32():
        mask = causal_mask(seq, seq) if causal else None
        expected, _ = reference.double()(x.double(), x.double(), x.double(), attn_mask=mask, need_weights=False)
    return compare(out, expected, atol=ATOL * float(expected.abs().max()), rtol=RTOL, name="layer output",
                   device="cuda")


def check_errors(worker):
    """The given binding's errors (not the student's work: reported, not scored)."""
    q = torch.randn(1, 2, 8, 64, device="cuda")
    bad = {
        "CPU tensor": ((q.cpu(), q, q, q), "must be a CUDA tensor"),
        "float64": ((q.double(), q, q, q), "float32"),
        "half": ((q, q.half(), q, q), "float32"),
        "non-contiguous": ((q.transpose(2, 3), q, q, q), "contiguous"),
        "3 dimensions": ((q[0], q[0], q[0], q[0]), "4 dimensions"),
        "k/v mismatch": ((q, q, q[:, :, :4], q), "shape"),
        "head_dim 256": ((torch.randn(1, 1, 4, 256, device="cuda"),) * 4, "head_dim must be at most 128"),
        "wrong out shape": ((q, q, q, q[:, :1]), "out"),
        "out is q": ((q, q.clone(), q.clone(), q), "must not share memory"),
        "causal with seq_q > seq_k": ((q, q[:, :, :4], q[:, :, :4], q.clone()), "seq_q <= seq_k"),
    }
    calls = [(what, (*args, what.startswith("causal"), 0.125), words) for what, (args, words) in bad.items()]
    calls += [(f"scale {scale}", (q, q.clone(), q.clone(), torch.empty_like(q), False, scale), "scale must be finite")
              for scale in (math.nan, math.inf)]
    return expect_errors(lambda *args: worker.call("forward", *args), calls)


def sanitizer_calls(hidden: bool) -> list[sanitize.Call]:
    """Small cases at the tile edges, causal and not, seq_q != seq_k, for compute-sanitizer."""
    calls = []
    # one head_dim for each size the reference is compiled for (32, 64, 80, 96, 128)
    for b, h, sq, sk, d in [(1, 2, 65, 65, 64), (1, 1, 100, 300, 80), (2, 1, 129, 129, 128), (1, 1, 1, 257, 17),
                            (1, 1, 70, 70, 88)]:
        for causal in (False, True):
            q, k, v = make_inputs((b, h, sq, sk, d), cli.seed(sq + sk + d, hidden))
            calls.append(sanitize.Call(f"{shape_text((b, h, sq, sk, d))}{' causal' if causal else ''}", "forward",
                                       (q, k, v, torch.empty_like(q), causal, 1 / math.sqrt(d)),
                                       ("q", "k", "v", "out")))
    return calls


def step_of(kernel: str):
    return "Task 4, steps 1-6" if kernel == "flash_attention_kernel" else None


# -- measuring ------------------------------------------------------------------------------

class TimedSets:
    """Distinct input sets on the GPU for one benchmark, refreshed before every timed request.

    Before each request the inputs get fresh values and the outputs NaN; one head of every
    set, picked at random after the values are written, is copied here first, so what the
    worker does to the inputs cannot change what its outputs are checked against. Every
    tensor sits between guard bands (common/checks.py), and each input's bit sum is
    taken before the request: a write past an output or into an input fails the benchmark.
    """

    def __init__(self, batch, heads, seq, head_dim, estimate_ms):
        shape = (batch, heads, seq, head_dim)
        set_bytes = 4 * (batch * heads * seq * head_dim + 2 * GUARD_ELEMENTS) * 4
        self.count = bench.sets_for(set_bytes, estimate_ms)
        self.guarded = [tuple(Guarded(name, shape) for name in ("q", "k", "v", "out"))
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
            self.picked.append((b, h, q[b, h].cpu(), k[b, h].cpu(), v[b, h].cpu()))
        self.bit_sums = [[bit_sum(t) for t in s[:3]] for s in self.sets]
        torch.cuda.synchronize()

    def check(self, causal, scale):
        """Every output of the request just timed: raises AssertionError with the first wrong one."""
        for i, (group, prints) in enumerate(zip(self.guarded, self.bit_sums)):
            where = f"in timed run {i + 1} of {self.count}"
            damage = guard_damage(*group)  # the bands only: inputs are checked by their bit sums
            if damage:
                raise AssertionError(f"{damage} ({where})")
            for g, before in zip(group, prints):
                if bit_sum(g.tensor) != before:
                    raise AssertionError(f"changed its input `{g.name}` ({where}); inputs are read-only")
        for i, ((q, k, v, out), (b, h, q_bh, k_bh, v_bh)) in enumerate(zip(self.sets, self.picked)):
            expected = attention_reference(q_bh, k_bh, v_bh, causal, scale)[0]
            result = compare(out[b, h], expected, atol=ATOL, rtol=RTOL, poisoned=True,
                             name=f"output of timed run {i + 1} of {self.count}, head ({b}, {h})")
            if not result.passed:
                raise AssertionError(result.message)


ESTIMATE_TFLOPS = 40.0  # what the reference kernel reaches: sizes a request, nothing else


def time_student(worker, batch, heads, seq, head_dim, causal):
    """Your kernel over distinct sets per request, every output checked; (Timing, sets used) or (message, None)."""
    estimate_ms = attention_flops(batch, heads, seq, seq, head_dim, causal) / (ESTIMATE_TFLOPS * 1e9)
    timed = TimedSets(batch, heads, seq, head_dim, estimate_ms)
    scale = 1.0 / math.sqrt(head_dim)
    kept = worker.keep("timed sets", timed.sets)
    try:
        timed.refresh()
        worker.call("run_batch", kept, causal, scale)  # warm-up
        timing = bench.host_clock(lambda: worker.call("run_batch", kept, causal, scale), reps=REPS,
                                  per_request=timed.count, before=timed.refresh,
                                  after=lambda: timed.check(causal, scale))
    except AssertionError as err:
        return str(err), None
    finally:
        worker.drop("timed sets")
    return timing, timed.count


def time_here(fn, batch, heads, seq, head_dim, count):
    """A trusted implementation (the reference kernel, naive PyTorch, SDPA) timed the same way."""
    def measure():
        sets = [tuple(torch.randn(batch, heads, seq, head_dim, device="cuda") for _ in range(4)) for _ in range(count)]
        with torch.no_grad(), exact_float32():
            fn(*sets[0])
            return bench.host_clock(lambda: bench.run_here(fn, sets), reps=REPS, per_request=count)
    result = bench.or_out_of_memory(measure)
    torch.cuda.empty_cache()
    return result


# Timed too when the reference itself is tested: the other head sizes it is compiled for.
HEAD_DIM_CASES = [(4, 32, 2048, 64), (32, 32, 512, 80)]  # (batch, heads, seq, head_dim)


def benchmark_cases(solution=False):
    """(name, batch, heads, seq, head_dim, causal, scored) of every timed attention case."""
    cases = []
    for shape in [PERF_CASE] + (HEAD_DIM_CASES if solution else []):
        b, h, s, d = shape
        cases += [(f"attention batch {b} heads {h} seq {s} head_dim {d}{' causal' if c else ''}", b, h, s, d, c,
                   shape == PERF_CASE) for c in (False, True)]
    hidden, heads = HANDOUT_LAYER
    for batch, seq in HANDOUT_CASES:
        for c in (False, True):
            name = f"attention alone batch {batch} seq {seq} hidden {hidden} heads {heads}{' causal' if c else ''}"
            cases.append((name, batch, heads, seq, hidden // heads, c, False))
    return cases


def run_benchmarks(report, worker, cases, layer_cases, with_tensor_cores=False):
    """Time your kernel in the worker for every case, end the worker, then time everything else here.
    with_tensor_cores: time the reference's tensor-core kernels too, beside SDPA (when the reference is tested)."""
    student = {}
    for name, b, h, s, d, causal, _ in cases:
        student[name] = time_student(worker, b, h, s, d, causal)
    layers = {}
    for batch, seq, causal in layer_cases:
        layers[(batch, seq, causal)] = time_student_layer(worker, batch, seq, causal)
    worker.stop()  # its context is gone, and any work it had queued with it: the GPU is ours alone now

    reference = bench.load_reference(report, 4) if any(scored for *_, scored in cases) else None
    tensor_cores = bench.load_reference(report, 4, TENSOR_CORES) if with_tensor_cores else None
    estimate = not impl.has_solution(4)  # the handout: the points are estimated (common/calibration.py)
    for name, b, h, s, d, causal, scored in cases:
        timing, count = student[name]
        report.run(name, lambda: attention_result(timing, count, reference if scored else None, b, h, s, d, causal,
                                                  estimate_for=name if scored and estimate else None,
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
    full = {(b, h, s, d): student[name][0] for name, b, h, s, d, causal, _ in cases if not causal}
    pairs = [(student[name][0], full.get((b, h, s, d)), name) for name, b, h, s, d, causal, _ in cases
             if causal and s >= 1024]
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


def main(argv=None) -> int:
    parser = cli.parser(4, __doc__.splitlines()[2])
    parser.add_argument("--sweep", action="store_true", help="time over seq 128..8192, write task4-sweep.csv")
    args = parser.parse_args(argv)
    report = Report(4, args.solution, "fused FlashAttention kernel", args.student_dir)
    with cli.worker(report, 4, args) as worker:
        if worker is None:
            return report.finish(args.json)
        if args.sanitize:
            sanitize.add_to_report(report, 4, args, sanitizer_calls(args.hidden), step_of)
            return report.finish(args.json)
        for case in cli.cases(4, "attention", CASES, args.hidden, shape_text, causal_ok=lambda s: s[2] <= s[3]):
            report.run(case.name, lambda: check_case(worker, case.shape, case.causal, case.seed))
        seed = cli.seed(7, args.hidden)
        report.run("scale 0.3 and large scores (q x 4)",
                   lambda: check_case(worker, (2, 2, 150, 150, 64), True, seed, scale=0.3, magnitude=4.0))
        for hidden, heads, seq in ((256, 4, 100), (4096, 32, 65)):
            for causal in (False, True):
                report.run(f"layer hidden {hidden} heads {heads} seq {seq}{' causal' if causal else ''} "
                           "vs nn.MultiheadAttention",
                           lambda: check_layer(worker, hidden, heads, seq, causal, cli.seed(11, args.hidden)))
        if any(c.passed and c.kind == "check" for c in report.cases):
            sanitize.add_to_report(report, 4, args, sanitizer_calls(args.hidden), step_of)
        report.run("bad input raises clear errors (the given binding)", lambda: check_errors(worker), kind="given")

        if report.stopped or not all(c.passed for c in report.cases):
            report.note("benchmarks skipped until every check passes")
        elif args.sweep:
            from task4.sweep import sweep

            sweep(report, worker, with_tensor_cores=args.solution)
        else:
            layer_cases = [(batch, seq, causal) for batch, seq in HANDOUT_CASES for causal in (False, True)]
            run_benchmarks(report, worker, benchmark_cases(args.solution), layer_cases,
                           with_tensor_cores=args.solution)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(4, args.solution, args.student_dir, report.attention_ops), kind="rule")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
