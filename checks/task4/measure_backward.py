"""Task 4's backward parts timed: your backward kernels (float32, steps 12-16; bf16, steps 27-30), the reference's
and SDPA's own backward pass, on one clock (harness/bench.py), every request's gradients checked (BackwardSets);
reported, never scored. Used by the test (python -m task4.test --backward, --backward-half) and the tuner.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import bench
from harness.checks import GUARD_ELEMENTS, Guarded, bit_sum, compare, exact_float32, guard_damage
from harness.attention_math import attention_flops, attention_gradients, causal_mask, fp32_peak_tflops
from checks.task4.measure import ATOL, HALF_EPS, HALF_ERROR_FACTOR, REPS, RTOL, TimedCase


# The backward part (steps 12-16): timed against SDPA's own backward pass in float32, reported, never scored.
BACKWARD_BENCHMARKS = [(8, 32, 4096, 64), (8, 32, 4096, 128)]  # (batch, heads, seq, head_dim): causal and not
# A backward pass does five products the size of the forward's two (S, dP, dV, dK, dQ): 2.5x its flops. A kernel
# that computes S and dP twice (dK and dV, then dQ) does more, but is credited with these only.
BACKWARD_FLOPS = 2.5


# The 16-bit backward part (steps 27-30), in bf16: timed against SDPA's flash backward (FlashAttention-2's), at the
# sizes issue 58 names; (batch, heads, seq, head_dim), causal and not.
BACKWARD_HALF_BENCHMARKS = [(4, 32, 2048, 64), (4, 32, 2048, 128), (2, 16, 4096, 64), (2, 16, 4096, 128)]

ESTIMATE_BACKWARD_TFLOPS = 20.0  # what float32 backward kernels reach: sizes a request, nothing else
ESTIMATE_BACKWARD_HALF_TFLOPS = 120.0  # the same for the bf16/fp16 ones


def backward_cases(half: bool = False) -> list[TimedCase]:
    prefix = "bf16 backward pass time" if half else "backward pass time"
    return [TimedCase(f"{prefix}: batch {b} heads {h} seq {s} head_dim {d}{' causal' if c else ''}", b, h, s, d, c)
            for b, h, s, d in (BACKWARD_HALF_BENCHMARKS if half else BACKWARD_BENCHMARKS) for c in (False, True)]


def sdpa_gradient_errors(q, k, v, d_out, causal, scale, expected) -> list[float]:
    """SDPA's own 16-bit backward on the same inputs: each gradient's largest error against float64 (`expected`),
    the yardstick of what the type allows. A causal mask with seq_q != seq_k (aligned to the end, which SDPA's
    is_causal is not) goes as an explicit mask."""
    group = q.shape[1] // k.shape[1]
    qs, ks, vs = (t.detach().cuda().requires_grad_() for t in (q, k, v))
    seq_q, seq_k = q.shape[2], k.shape[2]
    explicit = causal and seq_q != seq_k
    mask = ~causal_mask(seq_q, seq_k, "cuda") if explicit else None
    with torch.enable_grad():
        out = F.scaled_dot_product_attention(qs, ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1),
                                             attn_mask=mask, is_causal=causal and not explicit, scale=scale)
        grads = torch.autograd.grad(out, (qs, ks, vs), d_out.cuda())
    return [float((g.double() - e.to(g.device)).abs().max()) for g, e in zip(grads, expected)]


def gradient_allowance(sdpa_error: float, expected, dtype) -> float:
    """How far a 16-bit gradient may be from float64: HALF_ERROR_FACTOR x SDPA's own error, or half a unit in the
    last place of its largest |expected| where that is more (the forward's rule, steps 8-11), and at least the
    float32 part's ATOL: a gradient whose every expected value is 0 (one key: dS = P (dP - D) with dP = D) comes
    from float32 sums that need not cancel exactly, as SDPA's did on the H100 (checked there: 0 and 0)."""
    return max(HALF_ERROR_FACTOR * sdpa_error, HALF_EPS[dtype] * float(expected.abs().max()), ATOL)


def backward_sets_count(batch, heads, seq, head_dim, causal, dtype=torch.float32) -> int:
    """How many distinct input sets a timed request runs (bench.sets_for): enough that the worker's round trip (about
    0.5 ms) is small next to the request. A set is eight tensors of `dtype` and lse in float32, each between bands."""
    elements = batch * heads * seq * head_dim
    set_bytes = 8 * (elements + 2 * GUARD_ELEMENTS) * dtype.itemsize + 4 * (batch * heads * seq + 2 * GUARD_ELEMENTS)
    tflops = ESTIMATE_BACKWARD_TFLOPS if dtype == torch.float32 else ESTIMATE_BACKWARD_HALF_TFLOPS
    estimate_ms = BACKWARD_FLOPS * attention_flops(batch, heads, seq, seq, head_dim, causal) / (tflops * 1e9)
    return bench.sets_for(set_bytes, estimate_ms)


class BackwardSets:
    """Distinct input sets for the backward kernels (backward_sets_count of them), made here: q, k, v at random, out
    and lse computed from them in float32 (TF32 off; out then rounded to `dtype`), dout fresh and dq, dk, dv NaN
    before every timed request. One head of every set, picked at random after the values are written, is copied here
    and its gradients checked against float64 after the request (a 16-bit one within gradient_allowance); every
    tensor sits between guard bands, and each input's bit sum is taken before the request."""

    def __init__(self, batch, heads, seq, head_dim, causal, scale, dtype=torch.float32):
        shape = (batch, heads, seq, head_dim)
        self.dtype = dtype
        self.count = backward_sets_count(batch, heads, seq, head_dim, causal, dtype)
        self.guarded = []  # (inputs, outputs) of every set
        for _ in range(self.count):
            inputs = [Guarded(name, shape, dtype=dtype) for name in ("q", "k", "v", "out", "dout")] + \
                [Guarded("lse", shape[:3])]
            outputs = [Guarded(name, shape, dtype=dtype) for name in ("dq", "dk", "dv")]
            q, k, v, out, _, lse = (g.tensor for g in inputs)
            for t in (q, k, v):
                t.normal_()
            with torch.no_grad(), exact_float32():
                for b in range(batch):  # one sequence's scores at a time: (heads, seq, seq)
                    scores = (q[b].float() @ k[b].float().transpose(-2, -1)) * scale
                    if causal:
                        scores.masked_fill_(causal_mask(seq, seq, q.device), -math.inf)
                    lse[b] = torch.logsumexp(scores, dim=-1)
                    out[b] = torch.softmax(scores, dim=-1) @ v[b].float()
                    del scores
            self.guarded.append((inputs, outputs))
        # each set: q, k, v, out, dout, lse, dq, dk, dv
        self.sets = [tuple(g.tensor for g in inputs + outputs) for inputs, outputs in self.guarded]
        self.picked: list = []
        self.bit_sums: list = []
        self.rng = random.Random()

    def refresh(self):
        self.picked = []
        for inputs, outputs in self.guarded:
            q, k, v, _, dout, _ = (g.tensor for g in inputs)
            dout.normal_()
            for g in outputs:
                g.tensor.fill_(math.nan)
            b, h = self.rng.randrange(q.shape[0]), self.rng.randrange(q.shape[1])
            head = [t[b, h][None, None].clone() for t in (q, k, v, dout)]  # not the worker's memory
            self.picked.append((b, h, *head))
        self.bit_sums = [[bit_sum(g.tensor) for g in inputs] for inputs, _ in self.guarded]
        torch.cuda.synchronize()

    def check(self, causal, scale):
        """Every set of the request just timed: raises AssertionError with the first thing wrong."""
        for i, ((inputs, outputs), prints) in enumerate(zip(self.guarded, self.bit_sums)):
            where = f"in set {i + 1} of {self.count} of a timed run" if self.count > 1 else "in a timed run"
            damage = guard_damage(*inputs, *outputs)
            if damage:
                raise AssertionError(f"{damage.message} ({where})")
            for g, before in zip(inputs, prints):
                if bit_sum(g.tensor) != before:
                    raise AssertionError(f"changed its input `{g.name}` ({where}); inputs are read-only")
        half = self.dtype != torch.float32
        for i, ((_, outputs), (b, h, q, k, v, dout)) in enumerate(zip(self.guarded, self.picked)):
            expected = attention_gradients(q, k, v, dout, causal, scale)
            sdpa = sdpa_gradient_errors(q, k, v, dout, causal, scale, expected) if half else (None,) * 3
            for g, want, yardstick in zip(outputs, expected, sdpa):
                atol, rtol = (gradient_allowance(yardstick, want, self.dtype), 0.0) if half else (ATOL, RTOL)
                result = compare(g.tensor[b, h], want[0, 0], atol=atol, rtol=rtol, poisoned=True,
                                 name=f"{g.name} of a timed run, set {i + 1} of {self.count}, head ({b}, {h})")
                if not result.passed:
                    raise AssertionError(result.message)


def time_student_backward(worker, batch, heads, seq, head_dim, causal, dtype=torch.float32):
    """Your backward kernels over distinct sets per request (backward_sets_count), every set checked; (Timing, sets
    a request) or (message, None), as measure.time_student."""
    scale = 1.0 / math.sqrt(head_dim)
    timed = bench.or_out_of_memory(lambda: BackwardSets(batch, heads, seq, head_dim, causal, scale, dtype))
    if isinstance(timed, str):
        return timed, None
    kept = worker.keep("backward sets", timed.sets)
    try:
        timed.refresh()
        worker.call("run_batch_backward", kept, causal, scale)  # warm-up
        return bench.host_clock(lambda: worker.call("run_batch_backward", kept, causal, scale), reps=REPS,
                                per_request=timed.count, before=timed.refresh,
                                after=lambda: timed.check(causal, scale)), timed.count
    except AssertionError as err:
        return str(err), None
    finally:
        worker.drop("backward sets")


def time_backward_here(backward, batch, heads, seq, head_dim, causal, dtype=torch.float32):
    """A trusted backward pass timed the same way: backward(q, k, v, out, dout, lse, dq, dk, dv) over the same
    number of sets."""
    scale = 1.0 / math.sqrt(head_dim)

    def measure():
        timed = BackwardSets(batch, heads, seq, head_dim, causal, scale, dtype)
        run = lambda: bench.run_here(lambda *t: backward(*t, causal, scale), timed.sets)  # noqa: E731
        run()
        return bench.host_clock(run, reps=REPS, per_request=timed.count, before=timed.refresh)
    result = bench.or_out_of_memory(measure)
    torch.cuda.empty_cache()
    return result


def time_sdpa_backward(batch, heads, seq, head_dim, causal, dtype=torch.float32):
    """torch.autograd.grad through scaled_dot_product_attention's efficient backend in float32 (TF32 off), or its
    flash backend (FlashAttention-2's) in 16 bits: the backward pass alone, its forward run once before the clock."""
    scale = 1.0 / math.sqrt(head_dim)
    backend = SDPBackend.EFFICIENT_ATTENTION if dtype == torch.float32 else SDPBackend.FLASH_ATTENTION

    def measure():
        q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                   for _ in range(3))
        with sdpa_kernel(backend), exact_float32():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        dout = torch.randn_like(out)

        def request():
            with exact_float32():
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            torch.cuda.synchronize()
        request()
        return bench.host_clock(request, reps=REPS, per_request=1)
    result = bench.or_out_of_memory(measure)
    torch.cuda.empty_cache()
    return result


def backward_result(timing, count, reference, batch, heads, seq, head_dim, causal, dtype=torch.float32):
    """A line of the backward kernels (time_student_backward's timing and sets a request) against SDPA's backward
    pass, and the reference's: reported, never scored."""
    if count is None:
        return False, timing, {}
    flops = BACKWARD_FLOPS * attention_flops(batch, heads, seq, seq, head_dim, causal)
    tflops = flops / (timing.median_ms * 1e-3) / 1e12
    metrics = {"kernel_ms": timing.median_ms, "tflops": tflops, "sets_per_request": count}
    message = (f"kernels {timing.median_ms:.3f} ms ({tflops:.1f} TFLOP/s, counting 2.5x the forward pass's flops; "
               f"{count} distinct input set{'s' if count > 1 else ''} per request)")
    try:
        t_sdpa = time_sdpa_backward(batch, heads, seq, head_dim, causal, dtype)
    except RuntimeError as err:  # no efficient (flash) kernel for this GPU: said, the line still counts
        t_sdpa = f"not available here ({str(err).splitlines()[0][:120]})"
    ratio = bench.ratio(t_sdpa, timing)
    metrics |= {"sdpa_backward_ms": getattr(t_sdpa, "median_ms", None), "speedup_vs_sdpa_backward": ratio}
    half = dtype != torch.float32
    said = f"flash backend, {str(dtype)[6:]}" if half else "efficient backend, float32"
    message += (f", SDPA's backward ({said}) {bench.timing_text(t_sdpa)}"
                + (f": {ratio:.2f}x its speed" if ratio else ""))
    if reference is not None and getattr(reference, "has_backward_half" if half else "has_backward", lambda: False)():
        t_ref = time_backward_here(reference.backward, batch, heads, seq, head_dim, causal, dtype)
        if not isinstance(t_ref, str):
            metrics["reference_ms"] = t_ref.median_ms
            ref_ratio = bench.ratio(t_sdpa, t_ref)
            message += (f"; reference kernels {t_ref.median_ms:.3f} ms"
                        + (f" ({ref_ratio:.2f}x SDPA's backward)" if ref_ratio else ""))
    message += "; not scored"
    if not half and tflops > fp32_peak_tflops():
        return False, message + ": faster than float32 FFMA can run on this GPU, so work was skipped", metrics
    return True, message, metrics


def run_backward_benchmarks(report, worker, cases, dtype=torch.float32):
    """The backward kernels timed in the worker, the worker ended, then SDPA's backward and the reference here."""
    student = {c.name: time_student_backward(worker, c.batch, c.heads, c.seq, c.head_dim, c.causal, dtype)
               for c in cases}
    worker.stop()
    reference = bench.load_reference(report, 4)
    for c in cases:
        report.run(c.name, lambda: backward_result(*student[c.name], reference, c.batch, c.heads, c.seq, c.head_dim,
                                                   c.causal, dtype), kind="optional")
