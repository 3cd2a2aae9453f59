"""Task 4's steps 12-16 (optional): forward_lse and the backward kernels against float64 autograd, the training check
(the copy model trained through them against SDPA), and the given binding's errors for them; run in a process of its
own by checks/task4/test.py.
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import contextmanager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import cli, gpu_share
from harness.checks import compare, exact_float32, expect_errors, guard_damage, guarded_input, guarded_output, random_tensor
from harness.attention_math import attention_gradients, attention_float64
from harness.diagnose_backward import diagnose_gradient
from checks.task4.measure import ATOL, RTOL
from checks.task4.cases import BACKWARD_CASES, BACKWARD_NEGATIVE, NEGATIVE_TOLERANCE
from checks.task4.forward import grouped_text, make_inputs

BACKWARD_CALL_TIMEOUT_S = 60  # a call of the backward part: small cases, so a hang costs a minute, not five


def backward_text(shape) -> str:
    b, h, kvh, sq, sk, d = shape
    return f"backward {grouped_text((b, h, kvh, sq, sk, d, None))}" if kvh < h else \
        f"backward batch {b} heads {h} seq {sq}x{sk} head_dim {d}"


def check_backward_case(worker, shape, causal, seed, shift=0.0, tiles=(64, 64)):
    """Step 12 (out and L from forward_lse) against float64, then steps 13-16 (dq, dk, dv from backward, given the
    float64 reference's out and L in float32, so a slip in step 12 is told there and not in the gradients) against
    float64 autograd. Outputs poisoned, guard bands around every tensor. shift: added to q and taken from k (the
    tolerance is then NEGATIVE_TOLERANCE of each tensor's largest |expected|, or twice plain float32 PyTorch's own
    largest error on these inputs where that is more: a kernel is not held to better than float32 itself). A wrong
    gradient is compared with the common mistakes (harness/diagnose_backward.py) under the student's tiles
    (BLOCK_ROWS, BLOCK_COLS)."""
    def tolerance(expected, pytorch=None):
        if not shift:
            return ATOL, RTOL
        own = 0.0 if pytorch is None else float((pytorch.double() - expected).abs().max())
        return max(NEGATIVE_TOLERANCE * float(expected.abs().max()), 2 * own), 0.0

    b, h, kvh, sq, sk, d = shape
    q, k, v = make_inputs((b, h, kvh, sq, sk, d, None), seed)
    q, k = q + shift, k - shift
    d_out = random_tensor(q.shape, seed + 3)
    scale = 1.0 / math.sqrt(d)
    expected_out, expected_lse = attention_float64(q, k, v, causal, scale)

    inputs = [guarded_input(name, t) for name, t in zip("qkv", (q, k, v))]
    out, lse = guarded_output("out", q.shape), guarded_output("lse", q.shape[:3])
    worker.call("forward_lse", *(t.tensor for t in inputs), out.tensor, lse.tensor, causal, scale,
                timeout=BACKWARD_CALL_TIMEOUT_S)
    damage = guard_damage(*inputs, out, lse)
    if damage:
        return damage
    said = []
    for name, got, expected in (("lse", lse, expected_lse), ("out", out, expected_out)):
        atol, rtol = tolerance(expected)
        result = compare(got.tensor, expected, atol=atol, rtol=rtol, name=name, poisoned=True)
        if not result.passed:
            return dataclasses.replace(result, message=f"forward_lse's {result.message} (README, Task 4, step 12)")
        said.append(f"{name} {result.message}")

    saved = (q, k, v, expected_out.float(), d_out, expected_lse.float())
    inputs = [guarded_input(name, t) for name, t in zip(("q", "k", "v", "out", "dout", "lse"), saved)]
    grads = [guarded_output(name, t.shape) for name, t in zip(("dq", "dk", "dv"), (q, k, v))]
    worker.call("backward", *(t.tensor for t in inputs + grads), causal, scale, timeout=BACKWARD_CALL_TIMEOUT_S)
    damage = guard_damage(*inputs, *grads)
    if damage:
        return damage
    steps = {"dq": "steps 13 and 16", "dk": "steps 13-15", "dv": "steps 14-15"}
    pytorch = attention_gradients(q, k, v, d_out, causal, scale, dtype=torch.float32) if shift else (None,) * 3
    for got, expected, own in zip(grads, attention_gradients(q, k, v, d_out, causal, scale), pytorch):
        atol, rtol = tolerance(expected, own)
        result = compare(got.tensor, expected, atol=atol, rtol=rtol, name=got.name, poisoned=True)
        if not result.passed:
            beside = (f"; plain float32 PyTorch's largest error on these inputs: "
                      f"{float((own.double() - expected).abs().max()):.2g}") if shift else ""
            diagnosed = diagnose_gradient(dataclasses.replace(result, message=f"{result.message}{beside}"), got.name,
                                          got.tensor, q, k, v, d_out, causal, scale, atol=atol, rtol=rtol, tiles=tiles)
            if diagnosed.message.startswith("looks like"):
                return diagnosed
            return dataclasses.replace(result, message=f"{result.message}{beside} (README, Task 4, {steps[got.name]})")
        said.append(f"{got.name} {result.message}")
    return True, "; ".join(said), {}


# The training check (task4/train.py): the model trained with your kernels and with SDPA, same weights and batches.
# Two float32 runs whose attention sums in another order drift apart most where the loss falls fastest. Measured on
# an H200 (300 steps, the loss falling 2.9 -> 0.005), the reference kernels against SDPA differed by at most 3.6e-6 at
# a step; on the CPU, PyTorch's naive attention against SDPA by 4.8e-7. The bound below is far wider, so another
# correct order of sums never fails it; a wrong gradient is caught by the backward cases, and this check shows the
# model trains. Each step's losses may differ by TRAINING_RTOL of SDPA's plus TRAINING_ATOL; both must end below
# LEARNED x the chance loss, or the comparison says nothing.
TRAINING_RTOL, TRAINING_ATOL = 0.05, 0.01
LEARNED = 0.5
TRAINING_CALL_TIMEOUT_S = 120  # the reference takes seconds; a hang costs two minutes of the task's time
TRAINING_TAIL = 10  # steps averaged for the final loss
TRAINING_WARMUP = 5  # steps each side runs first, outside the clock (cuBLAS, Adam and the caches set up)
# In bf16 (steps 27-30) two correct runs drift further apart: every product rounds to 8 bits, and a gradient's
# rounding changes with the order of its sums. Where a step falls outside the band above, how far is measured on
# the spot, as the largest gap between SDPA's default backend and its math backend over the same training, and the
# band widens by HALF_TRAINING_FACTOR x that gap (measured on an H100: 8.4e-3, the reference's largest gap 5.3e-3).
HALF_TRAINING_FACTOR = 2.0


def training_name(dtype=torch.float32) -> str:
    return "a model trained through your kernels learns as with SDPA" + (
        "" if dtype == torch.float32 else f" (in {str(dtype)[6:]}, through the 16-bit kernels)")


def check_training(worker, hidden, write_curves=False, timed=True, dtype=torch.float32):
    """task4/train.py's copy model trained through your forward_lse and backward, against the same training with
    SDPA: the loss curves agree step by step, and both learned. timed: each run is also timed on this process's
    clock, after a few warm-up steps of its own, with nothing else on the GPU (reported, never scored; a grading
    leaves the timing out, and the check then runs beside the other tests' checks). dtype bfloat16: both trained
    under autocast (steps 27-30's kernels); where a step falls outside the band, the band widens by how far two of
    SDPA's backends drift apart on the same training (HALF_TRAINING_FACTOR)."""
    from task4 import train

    config, seed = train.TRAINING, cli.seed(23, hidden)
    half, type_name = dtype != torch.float32, str(dtype)[6:]
    steps_text = "steps 27-30" if half else "steps 12-16"
    step_ms = {}

    @contextmanager
    def clocked(who, warm_up):
        """The block, and (timed) its milliseconds per training step in step_ms[who], with the GPU to itself after
        warm_up(steps)."""
        if not timed:
            yield
            return
        with gpu_share.alone(worker):
            warm_up(TRAINING_WARMUP)
            torch.cuda.synchronize()
            start = time.perf_counter()
            yield
            step_ms[who] = (time.perf_counter() - start) * 1e3 / config.steps

    kernels = lambda steps=None: worker.call("train_with_kernels", seed, steps, type_name,  # noqa: E731
                                             timeout=TRAINING_CALL_TIMEOUT_S)
    with clocked("kernel_step_ms", kernels):
        got = kernels()
    if not (isinstance(got, list) and len(got) == config.steps and all(isinstance(x, float) for x in got)):
        return False, f"the training call returned something else than {config.steps} losses (floats)", {}
    sdpa = lambda steps=None: train.train(train.sdpa_attention, config, seed, "cuda", steps, dtype)  # noqa: E731
    with exact_float32(), clocked("sdpa_step_ms", sdpa):
        expected = sdpa()
    metrics = dict(step_ms)
    tail = lambda losses: sum(losses[-TRAINING_TAIL:]) / TRAINING_TAIL  # noqa: E731
    said = (f"copy task, {config.steps} steps{f' in {type_name}' if half else ''}: loss {got[0]:.3f} -> "
            f"{tail(got):.3f} with your kernels, {expected[0]:.3f} -> {tail(expected):.3f} with SDPA (chance "
            f"{train.chance_loss(config):.2f}); " +
            (f"{step_ms['kernel_step_ms']:.1f} ms per training step with your kernels, {step_ms['sdpa_step_ms']:.1f} "
             "with SDPA" if timed else f"not timed in a grading (python -m task4.test "
                                       f"--backward{'-half' if half else ''} times it)"))
    if write_curves:
        path = f"task4-training{f'-{type_name}' if half else ''}.csv"
        said += "; wrote " + " and ".join(train.write_curves({"your kernels": got, "SDPA": expected}, path, dtype))
    if not all(math.isfinite(x) for x in got):
        step = next(i for i, x in enumerate(got) if not math.isfinite(x))
        return False, f"{said}: the loss is {got[step]} at step {step} (README, Task 4, {steps_text})", metrics
    if not all(math.isfinite(x) for x in expected) or tail(expected) > LEARNED * train.chance_loss(config):
        return False, f"{said}: SDPA's run did not learn the task, so the curves say nothing (the kit's problem)", metrics
    outside = lambda widened: [abs(a - b) - (TRAINING_ATOL + TRAINING_RTOL * b + widened)  # noqa: E731
                               for a, b in zip(got, expected)]
    excess, band = outside(0.0), f"{TRAINING_RTOL:.0%} + {TRAINING_ATOL}"
    if half and max(excess) > 0:  # only then is the third training worth its time (every grading runs this check)
        with exact_float32(), sdpa_kernel(SDPBackend.MATH):
            other = sdpa()
        if not all(math.isfinite(x) for x in other):
            return False, f"{said}: SDPA's math backend's loss is not finite in {type_name} (the kit's problem)", metrics
        spread = max(abs(a - b) for a, b in zip(other, expected))
        metrics["sdpa_backends_gap"] = spread
        excess = outside(HALF_TRAINING_FACTOR * spread)
        band += f" + {HALF_TRAINING_FACTOR:g}x {spread:.1e} (SDPA's default and math backends' largest gap in {type_name})"
    worst = max(range(config.steps), key=lambda i: excess[i])
    widest = max(range(config.steps), key=lambda i: abs(got[i] - expected[i]))
    gap = abs(got[widest] - expected[widest])
    metrics["largest_loss_gap"] = gap
    if excess[worst] > 0:
        return False, (f"{said}: at step {worst} the loss is {got[worst]:.4f} with your kernels and "
                       f"{expected[worst]:.4f} with SDPA, more apart than {band}: the gradients your kernels give "
                       f"drive the model elsewhere (README, Task 4, {steps_text})"), metrics
    return True, (f"{said}; the curves agree step by step (largest gap {gap:.1e}, at step {widest}; within {band})"), \
        metrics


def check_backward_errors(worker):
    """The given binding's errors for the backward part (not the student's work: reported, not scored)."""
    q = torch.randn(1, 2, 8, 64, device="cuda")
    k, v, out, dout = (q.clone() for _ in range(4))
    lse = torch.randn(1, 2, 8, device="cuda")
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    short = q[:, :, :4].contiguous()  # k and v of 4 keys
    calls = [
        ("lse of the wrong shape", "forward_lse", (q, k, v, torch.empty_like(q), lse[:, :, :4].contiguous()),
         "lse must be (batch, heads, seq_q)"),
        ("lse in float64", "forward_lse", (q, k, v, torch.empty_like(q), lse.double()), "float32"),
        ("lse inside out", "forward_lse", (q, k, v, out, out.view(-1)[:16].view(1, 2, 8)), "must not share memory"),
        ("dk of q's shape where k has fewer keys", "backward",
         (q, short, short.clone(), out, dout, lse, dq, dk, torch.empty_like(short)), "dk must have k's shape"),
        ("dk is dv", "backward", (q, k, v, out, dout, lse, dq, dk, dk), "must not share memory"),
        ("dq is dout", "backward", (q, k, v, out, dout, lse, dout, dk, dv), "must not share memory"),
        ("dout in float64", "backward", (q, k, v, out, dout.double(), lse, dq, dk, dv), "float32"),
        ("lse on the CPU", "backward", (q, k, v, out, dout, lse.cpu(), dq, dk, dv), "must be a CUDA tensor"),
    ]
    return expect_errors(lambda entry, *args: worker.call(entry, *args),
                         [(what, (entry, *args, False, 0.125), words) for what, entry, args, words in calls])


def backward_part(report, worker, hidden_cases, constants=None) -> bool:
    """Steps 12-16 (optional): forward_lse and the backward kernels; whether every case passed. The first case whose
    process crashed or hung ends the part. constants: the student's attention_backward.cu's (its tiles)."""
    tiles = tuple((constants or {}).get(name, 64) for name in ("BLOCK_ROWS", "BLOCK_COLS"))
    report.begin_part("backward", (12, 13, 14, 15, 16), optional=True)
    for case in cli.cases(4, "backward", BACKWARD_CASES, hidden_cases, backward_text,
                          causal_ok=lambda s: s[3] <= s[4]):
        before = len(report.cases)
        report.run(case.name, lambda: check_backward_case(worker, case.shape, case.causal, case.seed, tiles=tiles))
        if report.process_died_since(before, "the backward part"):
            return report.end_part("backward")
    shape, shift = BACKWARD_NEGATIVE
    for causal in (False, True):
        before = len(report.cases)
        report.run(f"{backward_text(shape)}{' causal' if causal else ''}, every score very negative (q + {shift:g}, "
                   f"k - {shift:g})",
                   lambda: check_backward_case(worker, shape, causal, cli.seed(29 + causal, hidden_cases), shift,
                                               tiles))
        if report.process_died_since(before, "the backward part"):
            break
    return report.end_part("backward")
