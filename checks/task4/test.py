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
Timing (harness/bench.py) uses one host clock for your kernel, the reference and PyTorch:
each timed request runs over distinct input sets, and every output it writes is checked
(a sampled head of each, against float64) right after the request. The reference and
PyTorch are timed after your worker has ended, so nothing of yours runs beside them.
--attention or --half tests one part alone (steps 1-6, or the optional bf16/fp16 kernel of steps 8-11; the
benchmarks need the first). --sweep replaces those benchmarks (once the checks pass) by a sweep of the kernel, naive
PyTorch and SDPA over seq 128..8192 into task4-sweep.csv (and a plot when matplotlib
is installed). With --solution (the reference tested) the benchmarks add head_dim 64 and 80,
and the reference's tensor-core kernels (task4/solution/tensor_cores) are timed beside SDPA (not in a
grading: the grader times the reference as it times a student's kernel).
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import contextmanager

import torch
from torch import nn

from common import impl

from harness import cli, gpu_share, points, sanitize
from harness.diagnose import diagnose, kernel_constants, tile_schedules
from harness.checks import compare, exact_float32, expect_errors, guard_damage, guarded_input, guarded_output, random_tensor
from common.layer import mha_weights
from harness.records import Report
from harness.reference import attention_gradients, attention_reference, causal_mask, expand_kv_heads
from checks.task4 import measure
from checks.task4.measure import ATOL, HALF_TYPES, RTOL
from checks.task4.cases import (BACKWARD_CASES, BACKWARD_NEGATIVE, CASES, GROUPED_CASES, HALF_CASES, LARGE_SCORES,
                                NEGATIVE_TOLERANCE)

HALF_CALL_TIMEOUT_S = 60  # a call of the bf16/fp16 part: small cases, so a hang costs a minute, not five
BACKWARD_CALL_TIMEOUT_S = 60  # and of the backward part


def shape_text(shape) -> str:
    return "batch {} heads {} seq {}x{} head_dim {}".format(*shape)


def grouped_text(shape) -> str:
    b, h, kvh, sq, sk, d, starts = shape
    group = "MQA" if kvh == 1 else f"{kvh} kv heads"
    padding = f" key_start {','.join(map(str, starts))}" if starts is not None else ""
    return f"batch {b} heads {h} ({group}) seq {sq}x{sk} head_dim {d}{padding}"


def half_text(shape) -> str:
    b, h, kvh, sq, sk, d, starts = shape
    return (grouped_text(shape) if kvh < h or starts is not None
            else f"batch {b} heads {h} seq {sq}x{sk} head_dim {d}")


def grouped(shape):
    """A case as (batch, heads, kv_heads, seq_q, seq_k, head_dim, key_start): a CASES shape has
    kv_heads == heads and no padding."""
    return shape if len(shape) == 7 else (shape[0], shape[1], shape[1], *shape[2:5], None)


def make_inputs(shape, seed, magnitude=1.0):
    b, h, kvh, sq, sk, d, _ = grouped(shape)
    return (random_tensor((b, h, sq, d), seed) * magnitude, random_tensor((b, kvh, sk, d), seed + 1),
            random_tensor((b, kvh, sk, d), seed + 2))


def check_case(worker, shape, causal, seed, scale=None, magnitude=1.0, constants=None):
    """One case, plain or grouped-query and padded (`grouped`); a wrong output is compared with the common
    mistakes (harness/diagnose.py), the online softmax's slips under the student's BLOCK_COLS (`constants`,
    read from their file) and other widths. The mistakes are modelled without padding."""
    heads, starts = grouped(shape)[1], grouped(shape)[6]
    q, k, v = make_inputs(shape, seed, magnitude)
    key_start = None if starts is None else torch.tensor(starts, dtype=torch.int32)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    inputs = [guarded_input(name, t) for name, t in zip("qkv", (q, k, v))]
    out = guarded_output("out", q.shape)
    worker.call("forward", *(t.tensor for t in inputs), out.tensor, causal, scale,
                None if key_start is None else key_start.cuda())
    result = compare(out.tensor, attention_reference(q, k, v, causal, scale, key_start)[0], atol=ATOL, rtol=RTOL,
                     poisoned=True)
    damage = guard_damage(*inputs, out)
    if damage or key_start is not None:
        return damage or result
    k, v = expand_kv_heads(k, heads), expand_kv_heads(v, heads)  # the float64 side only
    return diagnose(4, result, out.tensor, q, k, v, causal, atol=ATOL, rtol=RTOL, scale=scale,
                    schedules=tile_schedules((constants or {}).get("BLOCK_COLS")))


def check_half_case(worker, shape, causal, seed, dtype, magnitude=1.0):
    """One case of the bf16/fp16 kernel against float64 on the same 16-bit inputs, within what SDPA's error says
    the type allows; outputs poisoned, guard bands around every tensor."""
    starts = grouped(shape)[6]
    q, k, v = (t.to(dtype) for t in make_inputs(shape, seed, magnitude))
    key_start = None if starts is None else torch.tensor(starts, dtype=torch.int32)
    scale = 1.0 / math.sqrt(q.shape[-1])
    inputs = [guarded_input(name, t) for name, t in zip("qkv", (q, k, v))]
    out = guarded_output("out", q.shape, dtype=dtype)
    worker.call("forward_half", *(t.tensor for t in inputs), out.tensor, causal, scale,
                None if key_start is None else key_start.cuda(), timeout=HALF_CALL_TIMEOUT_S)
    damage = guard_damage(*inputs, out)
    if damage:
        return damage
    expected = attention_reference(q, k, v, causal, scale, key_start)[0]
    allowed, said = measure.half_allowance(q, k, v, causal, scale, key_start, expected)
    result = compare(out.tensor, expected, atol=allowed, rtol=0.0, poisoned=True)
    return dataclasses.replace(result, message=f"{result.message} ({said})")


def backward_text(shape) -> str:
    b, h, kvh, sq, sk, d = shape
    return f"backward {grouped_text((b, h, kvh, sq, sk, d, None))}" if kvh < h else \
        f"backward batch {b} heads {h} seq {sq}x{sk} head_dim {d}"


def check_backward_case(worker, shape, causal, seed, shift=0.0):
    """Step 12 (out and L from forward_lse) against float64, then steps 13-16 (dq, dk, dv from backward, given the
    float64 reference's out and L in float32, so a slip in step 12 is told there and not in the gradients) against
    float64 autograd. Outputs poisoned, guard bands around every tensor. shift: added to q and taken from k (the
    tolerance is then NEGATIVE_TOLERANCE of each tensor's largest |expected|)."""
    def tolerance(expected):
        return (NEGATIVE_TOLERANCE * float(expected.abs().max()), 0.0) if shift else (ATOL, RTOL)

    b, h, kvh, sq, sk, d = shape
    q, k, v = make_inputs((b, h, kvh, sq, sk, d, None), seed)
    q, k = q + shift, k - shift
    d_out = random_tensor(q.shape, seed + 3)
    scale = 1.0 / math.sqrt(d)
    expected_out, expected_lse = attention_reference(q, k, v, causal, scale)

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
    for got, expected in zip(grads, attention_gradients(q, k, v, d_out, causal, scale)):
        atol, rtol = tolerance(expected)
        result = compare(got.tensor, expected, atol=atol, rtol=rtol, name=got.name, poisoned=True)
        if not result.passed:
            return dataclasses.replace(result, message=f"{result.message} (README, Task 4, {steps[got.name]})")
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


def check_training(worker, hidden, write_curves=False, timed=True):
    """task4/train.py's copy model trained through your forward_lse and backward, against the same training with
    SDPA: the loss curves agree step by step, and both learned. timed: each run is also timed on this process's
    clock, after a few warm-up steps of its own, with nothing else on the GPU (reported, never scored; a grading
    leaves the timing out, and the check then runs beside the other tests' checks)."""
    from task4 import train

    config, seed = train.TRAINING, cli.seed(23, hidden)
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

    with clocked("kernel_step_ms", lambda steps: worker.call("train_with_kernels", seed, steps,
                                                             timeout=TRAINING_CALL_TIMEOUT_S)):
        got = worker.call("train_with_kernels", seed, timeout=TRAINING_CALL_TIMEOUT_S)
    if not (isinstance(got, list) and len(got) == config.steps and all(isinstance(x, float) for x in got)):
        return False, f"the training call returned something else than {config.steps} losses (floats)", {}
    with exact_float32(), clocked("sdpa_step_ms",
                                  lambda steps: train.train(train.sdpa_attention, config, seed, "cuda", steps)):
        expected = train.train(train.sdpa_attention, config, seed, "cuda")
    metrics = dict(step_ms)
    tail = lambda losses: sum(losses[-TRAINING_TAIL:]) / TRAINING_TAIL  # noqa: E731
    said = (f"copy task, {config.steps} steps: loss {got[0]:.3f} -> {tail(got):.3f} with your kernels, "
            f"{expected[0]:.3f} -> {tail(expected):.3f} with SDPA (chance {train.chance_loss(config):.2f}); " +
            (f"{step_ms['kernel_step_ms']:.1f} ms per training step with your kernels, {step_ms['sdpa_step_ms']:.1f} "
             "with SDPA" if timed else "not timed in a grading (python -m task4.test --backward times it)"))
    if write_curves:
        said += "; wrote " + " and ".join(train.write_curves({"your kernels": got, "SDPA": expected}))
    if not all(math.isfinite(x) for x in got):
        step = next(i for i, x in enumerate(got) if not math.isfinite(x))
        return False, f"{said}: the loss is {got[step]} at step {step} (README, Task 4, steps 12-16)", metrics
    if tail(expected) > LEARNED * train.chance_loss(config):
        return False, f"{said}: SDPA's run did not learn the task, so the curves say nothing (the kit's problem)", metrics
    excess = [abs(a - b) - (TRAINING_ATOL + TRAINING_RTOL * b) for a, b in zip(got, expected)]
    worst = max(range(config.steps), key=lambda i: excess[i])
    widest = max(range(config.steps), key=lambda i: abs(got[i] - expected[i]))
    gap = abs(got[widest] - expected[widest])
    metrics["largest_loss_gap"] = gap
    if excess[worst] > 0:
        return False, (f"{said}: at step {worst} the loss is {got[worst]:.4f} with your kernels and "
                       f"{expected[worst]:.4f} with SDPA, more apart than {TRAINING_RTOL:.0%} + {TRAINING_ATOL}: the "
                       "gradients your kernels give drive the model elsewhere (README, Task 4, steps 12-16)"), metrics
    return True, f"{said}; the curves agree step by step (largest gap {gap:.1e}, at step {widest})", metrics


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
        "kv_heads not dividing heads": ((torch.randn(1, 3, 8, 64, device="cuda"), q, q, torch.empty(1, 3, 8, 64,
                                                                                                  device="cuda")),
                                        "must divide q's heads"),
    }
    calls = [(what, (*args, what.startswith("causal"), 0.125), words) for what, (args, words) in bad.items()]
    two = (q, q.clone(), q.clone(), torch.empty_like(q), True, 0.125)
    calls += [(f"key_start {what}", (*two, key_start), words) for what, key_start, words in [
        ("int64", torch.zeros(1, dtype=torch.int64, device="cuda"), "must be int32"),
        ("on the CPU", torch.zeros(1, dtype=torch.int32), "must be a CUDA tensor"),
        ("of two values for a batch of one", torch.zeros(2, dtype=torch.int32, device="cuda"), "must have shape [1]"),
        ("past seq_k", torch.tensor([9], dtype=torch.int32, device="cuda"), "between 0 and seq_k = 8"),
        ("negative", torch.tensor([-1], dtype=torch.int32, device="cuda"), "between 0 and seq_k = 8"),
    ]]
    more_queries = (q, q[:, :, :4].contiguous(), q[:, :, :4].contiguous(), torch.empty_like(q), False, 0.125,
                    torch.zeros(1, dtype=torch.int32, device="cuda"))
    calls.append(("key_start with more queries than keys", more_queries, "key_start needs seq_q <= seq_k"))
    calls += [(f"scale {scale}", (q, q.clone(), q.clone(), torch.empty_like(q), False, scale), "scale must be finite")
              for scale in (math.nan, math.inf)]
    return expect_errors(lambda *args: worker.call("forward", *args), calls)


def check_half_errors(worker):
    """The given binding's errors for the bf16/fp16 kernel (not the student's work: reported, not scored)."""
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=torch.bfloat16)
    bad = {
        "float32 q": ((q.float(), q.float(), q.float(), q.float()), "must be bfloat16 or float16"),
        "k in float16 beside a bfloat16 q": ((q, q.half(), q.clone(), torch.empty_like(q)), "like q"),
        "out in float32": ((q, q.clone(), q.clone(), q.float()), "like q"),
        "CPU tensor": ((q.cpu(), q.cpu(), q.cpu(), q.cpu()), "must be a CUDA tensor"),
        "non-contiguous": ((q.transpose(2, 3), q.clone(), q.clone(), torch.empty_like(q)), "contiguous"),
        "head_dim 256": ((torch.randn(1, 1, 4, 256, device="cuda", dtype=torch.half),) * 4,
                         "head_dim must be at most 128"),
        "out is q": ((q, q.clone(), q.clone(), q), "must not share memory"),
    }
    return expect_errors(lambda *args: worker.call("forward_half", *args),
                         [(what, (*args, False, 0.125), words) for what, (args, words) in bad.items()])


def sanitizer_calls(hidden: cli.Hidden | None) -> list[sanitize.Call]:
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
    # grouped-query attention (MQA, then 3 query heads per key/value head) with padding, causal
    for shape in [(2, 4, 1, 40, 40, 64, (0, 35)), (2, 6, 2, 30, 140, 80, (0, 130))]:
        _, h, _, sq, sk, d, starts = shape
        q, k, v = make_inputs(shape, cli.seed(sq + sk + d + h, hidden))
        calls.append(sanitize.Call(f"{grouped_text(shape)} causal", "forward",
                                   (q, k, v, torch.empty_like(q), True, 1 / math.sqrt(d),
                                    torch.tensor(starts, dtype=torch.int32)), ("q", "k", "v", "out", "key_start")))
    return calls


def half_sanitizer_calls(hidden: cli.Hidden | None) -> list[sanitize.Call]:
    """The bf16/fp16 kernel's pass (steps 8-11): each head_dim tile once (32, 64, 80, 96, 128), an odd head_dim,
    padding and groups, bf16 and fp16 in turn, causal."""
    calls = []
    half_shapes = [(1, 2, 2, 65, 65, 64, None), (1, 1, 1, 100, 300, 80, None), (2, 2, 1, 129, 129, 128, None),
                   (1, 1, 1, 70, 70, 33, None), (2, 4, 2, 30, 140, 96, (0, 130)), (1, 2, 2, 17, 40, 32, None)]
    for i, shape in enumerate(half_shapes):
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        q, k, v = (t.to(dtype) for t in make_inputs(shape, cli.seed(sum(shape[3:6]) + i, hidden)))
        starts = shape[6]
        extra = () if starts is None else (torch.tensor(starts, dtype=torch.int32),)
        calls.append(sanitize.Call(f"{str(dtype)[6:]} {half_text(shape)} causal", "forward_half",
                                   (q, k, v, torch.empty_like(q), True, 1 / math.sqrt(shape[5]), *extra),
                                   ("q", "k", "v", "out") + (("key_start",) if extra else ())))
    return calls


def backward_sanitizer_calls(hidden: cli.Hidden | None) -> list[sanitize.Call]:
    """The backward part's pass (steps 12-16): forward_lse and backward at the tile edges, causal and not, a
    head_dim that is not a tile width, grouped heads."""
    calls = []
    for i, (b, h, kvh, sq, sk, d) in enumerate([(1, 2, 2, 65, 65, 64), (1, 4, 2, 70, 131, 85),
                                                (1, 2, 1, 129, 129, 128)]):
        q, k, v = make_inputs((b, h, kvh, sq, sk, d, None), cli.seed(sq + sk + d + i, hidden))
        d_out = random_tensor(q.shape, cli.seed(sq + d, hidden))
        for causal in (False, True):
            out, lse = (t.float() for t in attention_reference(q, k, v, causal, 1 / math.sqrt(d)))
            label = f"{backward_text((b, h, kvh, sq, sk, d))}{' causal' if causal else ''}"
            calls.append(sanitize.Call(f"forward_lse {label[len('backward '):]}", "forward_lse",
                                       (q, k, v, torch.empty_like(q), torch.empty(b, h, sq), causal, 1 / math.sqrt(d)),
                                       ("q", "k", "v", "out", "lse")))
            calls.append(sanitize.Call(label, "backward", (q, k, v, out, d_out, lse, torch.empty_like(q),
                                                           torch.empty_like(k), torch.empty_like(v), causal,
                                                           1 / math.sqrt(d)),
                                       ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv")))
    return calls


def step_of(kernel: str):
    return {"flash_attention_kernel": "Task 4, steps 1-6 (step 12 for lse)",
            "flash_attention_half_kernel": "Task 4, steps 8-11 (optional)",
            "delta_kernel": "Task 4, step 13 (optional)",
            "flash_attention_dkdv_kernel": "Task 4, steps 14-15 (optional)",
            "flash_attention_dq_kernel": "Task 4, step 16 (optional)"}.get(kernel)



def attention_part(report, worker, hidden_cases, constants):
    """Steps 1-6: the float32 kernel against float64, and the layer against nn.MultiheadAttention."""
    report.begin_part("attention", (1, 2, 3, 4, 5, 6))
    for case in cli.cases(4, "attention", CASES, hidden_cases, shape_text, causal_ok=lambda s: s[2] <= s[3]):
        report.run(case.name, lambda: check_case(worker, case.shape, case.causal, case.seed, constants=constants))
    for case in cli.cases(4, "grouped", GROUPED_CASES, hidden_cases, grouped_text, causal_ok=lambda s: s[3] <= s[4]):
        report.run(case.name, lambda: check_case(worker, case.shape, case.causal, case.seed, constants=constants))
    seed = cli.seed(7, hidden_cases)
    report.run("scale 0.3 and large scores (q x 4)",
               lambda: check_case(worker, (2, 2, 150, 150, 64), True, seed, scale=0.3, magnitude=4.0,
                                  constants=constants))
    for hidden, heads, seq in ((256, 4, 100), (4096, 32, 65)):
        for causal in (False, True):
            report.run(f"layer hidden {hidden} heads {heads} seq {seq}{' causal' if causal else ''} "
                       "vs nn.MultiheadAttention",
                       lambda: check_layer(worker, hidden, heads, seq, causal, cli.seed(11, hidden_cases)))
    report.end_part("attention")


def half_part(report, worker, hidden_cases) -> bool:
    """Steps 8-11 (optional): the bf16/fp16 kernel in both types; whether every case passed. The first case whose
    process crashed or hung ends the part: the rest would wait as long, and it is said once."""
    report.begin_part("half", (8, 9, 10, 11), optional=True)
    runs = [(case, dtype, 1.0) for name, dtype in HALF_TYPES.items()
            for case in cli.cases(4, "half", HALF_CASES, hidden_cases, lambda s: f"{name} {half_text(s)}",
                                  causal_ok=lambda s: s[3] <= s[4])]
    shape, magnitude = LARGE_SCORES
    runs += [(cli.Case("half", shape, True, cli.seed(19, hidden_cases), "cuda",
                       f"{name} large scores (q x {magnitude:g}) {half_text(shape)}"), dtype, magnitude)
             for name, dtype in HALF_TYPES.items()]
    for case, dtype, magnitude in runs:
        before = len(report.cases)
        report.run(case.name, lambda: check_half_case(worker, case.shape, case.causal, case.seed, dtype, magnitude))
        if report.process_died_since(before, "the bf16/fp16 part"):
            break
    return report.end_part("half")


HALF_PASS_NAME = f"{sanitize.PASS_NAME}, the bf16/fp16 kernel (optional)"
BACKWARD_PASS_NAME = f"{sanitize.PASS_NAME}, the backward kernels (optional)"


def backward_part(report, worker, hidden_cases) -> bool:
    """Steps 12-16 (optional): forward_lse and the backward kernels; whether every case passed. The first case whose
    process crashed or hung ends the part."""
    report.begin_part("backward", (12, 13, 14, 15, 16), optional=True)
    for case in cli.cases(4, "backward", BACKWARD_CASES, hidden_cases, backward_text,
                          causal_ok=lambda s: s[3] <= s[4]):
        before = len(report.cases)
        report.run(case.name, lambda: check_backward_case(worker, case.shape, case.causal, case.seed))
        if report.process_died_since(before, "the backward part"):
            return report.end_part("backward")
    shape, shift = BACKWARD_NEGATIVE
    for causal in (False, True):
        before = len(report.cases)
        report.run(f"{backward_text(shape)}{' causal' if causal else ''}, every score very negative (q + {shift:g}, "
                   f"k - {shift:g})",
                   lambda: check_backward_case(worker, shape, causal, cli.seed(29 + causal, hidden_cases), shift))
        if report.process_died_since(before, "the backward part"):
            break
    return report.end_part("backward")


def optional_backward(report, worker, args, passes: list) -> bool:
    """Steps 12-16 (optional): the checks, then bad input while its sanitizer pass runs (added to `passes`); every
    case optional, so nothing here moves a point. Whether the checks passed (its training check and benchmarks
    follow the sanitizer passes)."""
    if not backward_part(report, worker, args.hidden):
        return False
    passes.append(sanitize.start(report, 4, args, backward_sanitizer_calls(args.hidden), step_of,
                                 BACKWARD_PASS_NAME, kind="optional", part="backward"))
    report.run("bad input to the backward part raises clear errors (the given binding)",
               lambda: check_backward_errors(worker), kind="optional")
    return True


def float_part(report, worker, args, passes: list) -> None:
    """Steps 1-7: the float32 kernel's checks, then the binding's errors while its sanitizer pass runs (added to
    `passes`; its benchmarks come last: float_benchmarks)."""
    constants = kernel_constants("task4/kernels/attention.cu", args.student_dir, args.solution)
    attention_part(report, worker, args.hidden, constants)
    if any(c.passed and c.kind == "check" for c in report.cases):
        passes.append(sanitize.start(report, 4, args, sanitizer_calls(args.hidden), step_of))
    report.run("bad input raises clear errors (the given binding)", lambda: check_errors(worker), kind="given")


def float_benchmarks(report, worker, args) -> None:
    """Steps 1-7's benchmarks, once every required check passes: in a fresh process of the float32 kernel (an
    optional part before may have crashed its own), started before the GPU is ours alone."""
    report.heading("benchmarks")
    if report.stopped or not all(c.passed for c in report.cases if c.kind != "optional"):
        report.note("benchmarks skipped until every check passes")
        return
    if args.sweep:
        from checks.task4.sweep import sweep

        with gpu_share.alone_in_a_fresh_process(worker):
            sweep(report, worker, with_tensor_cores=args.solution)
    else:
        if args.grading:
            batch, seq = measure.HANDOUT_CASES[-1]
            report.note(cli.GRADING_LEAVES_OUT.format(task=4, what=f"the layer at batch {batch} seq {seq} "
                                                                  "against nn.MultiheadAttention, the bf16/fp16 "
                                                                  "kernel against SDPA's flash backend, and the "
                                                                  "backward kernels against SDPA's backward"))
        with gpu_share.alone_in_a_fresh_process(worker):
            # the reference's extra timings (other head sizes, its tensor-core kernels) are for a look at the
            # reference; the grader times the reference as it times a student's kernel
            extras = args.solution and not args.grading
            measure.run_benchmarks(report, worker, measure.benchmark_cases(extras), measure.layer_cases(args.grading),
                                   with_tensor_cores=extras)
        said = None if args.solution or args.grading else points.estimate_note(4, report.cases)
        if said:
            report.note(said)


def optional_half(report, worker, args, passes: list) -> bool:
    """Steps 8-11 (optional): the bf16/fp16 kernel's checks, then bad input while its own sanitizer pass runs (added
    to `passes`); every case optional, so nothing here moves a point. Whether the checks passed."""
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        report.note(f"the bf16/fp16 part (steps 8-11) needs compute capability 8.0 (Ampere) or newer, for "
                    f"mma.sync.m16n8k16 and cp.async: not run on this GPU ({major}.{minor})")
        return False
    if not half_part(report, worker, args.hidden):
        return False
    passes.append(sanitize.start(report, 4, args, half_sanitizer_calls(args.hidden), step_of, HALF_PASS_NAME,
                                 kind="optional", part="half"))
    report.run("bad input to the bf16/fp16 kernel raises clear errors (the given binding)",
               lambda: check_half_errors(worker), kind="optional")
    return True


def optional_benchmarks(report, worker, timed: list[tuple[str, object]]) -> None:
    """The optional parts' benchmarks (a student's own run: the grader leaves them out), each part's in a fresh
    process of its own, after the float32 benchmarks."""
    for name, run in timed:
        report.heading(f"{name} benchmarks (optional)")
        with gpu_share.alone_in_a_fresh_process(worker):
            run()


def main(argv=None) -> int:
    parser = cli.parser(4, __doc__.splitlines()[2])
    parser.add_argument("--sweep", action="store_true", help="time over seq 128..8192, write task4-sweep.csv")
    parser.add_argument("--attention", action="store_true", help="test only README steps 1-7 (the float32 kernel)")
    parser.add_argument("--half", action="store_true", help="test only README steps 8-11 (optional: bf16/fp16)")
    parser.add_argument("--backward", action="store_true",
                        help="test only README steps 12-16 (optional: the backward pass)")
    args = parser.parse_args(argv)
    chosen = [p for p in ("attention", "half", "backward") if getattr(args, p)] or ["attention", "half", "backward"]
    report = Report(4, args.solution, "fused FlashAttention kernel", args.student_dir)
    with cli.worker(report, 4, args) as worker:
        if worker is None:
            return report.finish(args.json)
        if args.sanitize:
            if "attention" in chosen:
                sanitize.add_to_report(report, 4, args, sanitizer_calls(args.hidden), step_of)
            if "half" in chosen:
                sanitize.add_to_report(report, 4, args, half_sanitizer_calls(args.hidden), step_of, HALF_PASS_NAME,
                                       kind="optional")
            if "backward" in chosen:
                sanitize.add_to_report(report, 4, args, backward_sanitizer_calls(args.hidden), step_of,
                                       BACKWARD_PASS_NAME, kind="optional")
            return report.finish(args.json)
        # Every check first, the timings last: in a grading, the other tasks' tests check side by side with this
        # one, and a timed part waits until none of them is in the middle of its checks (harness/gpu_share.py). Each
        # part's sanitizer pass runs beside the checks that follow it, in processes of its own.
        passes = []
        if "attention" in chosen:
            float_part(report, worker, args, passes)
        half_passed = backward_passed = False
        if "half" in chosen and not report.stopped:
            # In a process of its own (the next call starts one): a crash or a hang in the optional kernel costs
            # its own part, never the float32 checks or the sanitizer pass before it, or the benchmarks after it.
            worker.stop_until_next_call()
            half_passed = optional_half(report, worker, args, passes)
        if "backward" in chosen and not report.stopped:
            worker.stop_until_next_call()  # the same: a process of its own
            backward_passed = optional_backward(report, worker, args, passes)
        training = lambda: report.run("a model trained through your kernels learns as with SDPA",  # noqa: E731
                                      lambda: check_training(worker, args.hidden, write_curves=args.backward,
                                                             timed=not args.grading), kind="optional")
        if backward_passed and args.grading:
            training()  # untimed: a check like the others, beside the sanitizer passes
        if any(passes):
            report.heading("compute-sanitizer")
        for started in passes:
            sanitize.finish(report, started)
        if backward_passed and not args.grading:
            training()  # timed: once the sanitizer passes have ended
        if "attention" in chosen:
            float_benchmarks(report, worker, args)
        timed = []  # the optional parts' benchmarks, for a student's own run: once the part's checks pass
        if half_passed and not args.grading and not report.stopped:
            timed.append(("bf16/fp16", lambda: measure.run_half_benchmarks(report, worker, measure.half_cases())))
        if backward_passed and not args.grading and not report.stopped:
            timed.append(("backward", lambda: measure.run_backward_benchmarks(report, worker,
                                                                              measure.backward_cases())))
        optional_benchmarks(report, worker, timed)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(4, args.solution, args.student_dir, report.attention_ops), kind="rule")
    if "attention" not in chosen:  # the status below counts required checks only, and this run has none
        optional = [c for c in report.cases if c.kind == "optional"]
        report.note(f"--{' --'.join(chosen)} tests the optional part{'s' if len(chosen) > 1 else ''} alone: "
                    f"{sum(c.passed for c in optional)} of {len(optional)} checks passed")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
