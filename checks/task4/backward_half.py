"""Task 4's steps 27-30 (optional): the 16-bit backward part, forward_lse and backward on bf16 and fp16 tensors,
against float64 autograd on the same 16-bit inputs, and the given binding's errors for them; run in a process of its
own by checks/task4/test.py.

How far a 16-bit gradient may be from float64: HALF_ERROR_FACTOR times SDPA's own 16-bit backward's largest error on
the same inputs (PyTorch's flash backward where it runs, else its efficient or math one), and at least half a unit in
the last place of the gradient's largest |expected|: the forward's rule (steps 8-11), gradient by gradient. L is
float32 arithmetic on exact products of 16-bit values, held to the float32 part's tolerance.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from harness import cli, sanitize
from harness.checks import (compare, expect_errors, guard_damage, guarded_input, guarded_output, in_each_type,
                            random_tensor)
from harness.attention_math import attention_float64, attention_gradients
from harness.diagnose import kernel_constants
from harness.diagnose_backward import diagnose_gradient
from checks.task4.measure import ATOL, HALF_ERROR_FACTOR, HALF_TYPES, RTOL, half_allowance
from checks.task4.measure_backward import gradient_allowance, sdpa_gradient_errors
from checks.task4.cases import BACKWARD_HALF_CASES, BACKWARD_HALF_NEGATIVE, NEGATIVE_TOLERANCE
from checks.task4.backward import BACKWARD_CALL_TIMEOUT_S, backward_text
from checks.task4.forward import make_inputs

# Where the 16-bit part makes each of the backward's common mistakes (harness/diagnose_backward.py names float32's
# steps 13-16): D and the first query tile in step 28, dK and dV in step 29, dQ in step 30
HALF_STEPS = {13: 28, 14: 28, 15: 29, 16: 30}
PART_STEPS = (27, 28, 29, 30)


def check_backward_half_case(worker, shape, causal, seed, dtype, shift=0.0, tiles=(128, 32)):
    """Step 27 (out and L from forward_lse on 16-bit tensors) against float64, then steps 28-30 (dq, dk, dv from
    backward, given the float64 reference's out rounded to the type and its L in float32, so a slip in step 27 is
    told there) against float64 autograd on the same 16-bit inputs, within what SDPA's own 16-bit backward says the
    type allows. Outputs poisoned, guard bands around every tensor. shift: added to q and taken from k (every score
    very negative; L then held to NEGATIVE_TOLERANCE of its largest |expected|). A wrong gradient is compared with
    the common mistakes (harness/diagnose_backward.py) within its allowance, under the student's tiles (keys a
    block, queries a tile)."""
    b, h, kvh, sq, sk, d = shape
    q, k, v = (t.to(dtype) for t in make_inputs((b, h, kvh, sq, sk, d, None), seed))
    q, k = (q + shift).to(dtype), (k - shift).to(dtype)
    d_out = random_tensor(q.shape, seed + 3).to(dtype)
    scale = 1.0 / math.sqrt(d)
    expected_out, expected_lse = attention_float64(q, k, v, causal, scale)

    inputs = [guarded_input(name, t) for name, t in zip("qkv", (q, k, v))]
    out, lse = guarded_output("out", q.shape, dtype=dtype), guarded_output("lse", q.shape[:3])
    worker.call("forward_lse", *(t.tensor for t in inputs), out.tensor, lse.tensor, causal, scale,
                timeout=BACKWARD_CALL_TIMEOUT_S)
    damage = guard_damage(*inputs, out, lse)
    if damage:
        return damage
    said = []
    lse_tolerance = (NEGATIVE_TOLERANCE * float(expected_lse.abs().max()), 0.0) if shift else (ATOL, RTOL)
    allowed, why = half_allowance(q, k, v, causal, scale, None, expected_out)
    for name, got, expected, (atol, rtol) in (("lse", lse, expected_lse, lse_tolerance),
                                              ("out", out, expected_out, (allowed, 0.0))):
        result = compare(got.tensor, expected, atol=atol, rtol=rtol, name=name, poisoned=True)
        if not result.passed:
            where = "step 27" if name == "lse" else f"steps 8-11: its forward kernel; {why}"
            return dataclasses.replace(result, message=f"forward_lse's {result.message} (README, Task 4, {where})")
        said.append(f"{name} {result.message}")

    saved = (q, k, v, expected_out.to(dtype), d_out, expected_lse.float())
    inputs = [guarded_input(name, t) for name, t in zip(("q", "k", "v", "out", "dout", "lse"), saved)]
    grads = [guarded_output(name, t.shape, dtype=dtype) for name, t in zip(("dq", "dk", "dv"), (q, k, v))]
    worker.call("backward", *(t.tensor for t in inputs + grads), causal, scale, timeout=BACKWARD_CALL_TIMEOUT_S)
    damage = guard_damage(*inputs, *grads)
    if damage:
        return damage
    steps = {"dq": "steps 28 and 30", "dk": "steps 28-29", "dv": "steps 28-29"}
    expected_grads = attention_gradients(q, k, v, d_out, causal, scale)
    yardsticks = sdpa_gradient_errors(q, k, v, d_out, causal, scale, expected_grads)
    for got, expected, yardstick in zip(grads, expected_grads, yardsticks):
        atol = gradient_allowance(yardstick, expected, dtype)
        result = compare(got.tensor, expected, atol=atol, rtol=0.0, name=got.name, poisoned=True)
        result = dataclasses.replace(result, message=f"{result.message} (allowed {atol:.1e}: the larger of "
                                                     f"{HALF_ERROR_FACTOR:g}x SDPA's {yardstick:.1e}, half a unit "
                                                     f"in the last place of the largest |expected| and {ATOL:g})")
        if not result.passed:
            diagnosed = diagnose_gradient(result, got.name, got.tensor, q, k, v, d_out, causal, scale, atol=atol,
                                          rtol=torch.finfo(dtype).eps, tiles=tiles, steps=HALF_STEPS, dq_with_dk=True)
            if diagnosed.message.startswith("looks like"):
                return diagnosed
            return dataclasses.replace(result, message=f"{result.message} (README, Task 4, {steps[got.name]})")
        said.append(f"{got.name} {result.message}")
    return True, "; ".join(said), {}


def check_backward_half_errors(worker):
    """The given binding's errors for the 16-bit backward part (not the student's work: reported, not scored)."""
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=torch.bfloat16)
    k, v, out, dout = (q.clone() for _ in range(4))
    lse = torch.randn(1, 2, 8, device="cuda")
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    masked = {"window_left": 4, "causal": True}
    calls = [  # what, entry, tensors, the words its error must have, the masks and causal
        ("lse in bfloat16", "forward_lse", (q, k, v, torch.empty_like(q), lse.bfloat16()), "float32", {}),
        ("a window with bf16 tensors", "forward_lse", (q, k, v, torch.empty_like(q), lse), "float32's (step 26)",
         masked),
        ("dout in float32 beside a bfloat16 q", "backward", (q, k, v, out, dout.float(), lse, dq, dk, dv), "like q",
         {}),
        ("dq in float16 beside a bfloat16 q", "backward", (q, k, v, out, dout, lse, dq.half(), dk, dv), "like q", {}),
        ("dk is dv", "backward", (q, k, v, out, dout, lse, dq, dk, dk), "must not share memory", {}),
        ("soft-capping with bf16 tensors", "backward", (q, k, v, out, dout, lse, dq, dk, dv), "float32's (step 26)",
         {"softcap": 5.0}),
    ]
    return expect_errors(lambda entry, *args: worker.call(entry, *args),
                         [(what, (entry, *tensors, how.get("causal", False), 0.125, how.get("window_left"),
                                  how.get("softcap"), None), words)
                          for what, entry, tensors, words, how in calls])


def backward_half_sanitizer_calls(hidden: cli.Hidden | None) -> list[sanitize.Call]:
    """The 16-bit backward part's pass (steps 27-30): forward_lse and backward at the tile edges, causal and not, bf16
    and fp16 in turn, a head_dim the binding pads, grouped heads."""
    calls = []
    for i, (b, h, kvh, sq, sk, d) in enumerate([(1, 2, 2, 65, 129, 64), (1, 4, 2, 70, 131, 40),
                                                (1, 2, 1, 33, 160, 128)]):
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        q, k, v = (t.to(dtype) for t in make_inputs((b, h, kvh, sq, sk, d, None), cli.seed(sq + sk + d + i, hidden)))
        d_out = random_tensor(q.shape, cli.seed(sq + d, hidden)).to(dtype)
        for causal in (False, True):
            out, lse = attention_float64(q, k, v, causal, 1 / math.sqrt(d))
            label = f"{str(dtype)[6:]} {backward_text((b, h, kvh, sq, sk, d))}{' causal' if causal else ''}"
            calls.append(sanitize.Call(f"forward_lse {label}", "forward_lse",
                                       (q, k, v, torch.empty_like(q), torch.empty(b, h, sq), causal, 1 / math.sqrt(d)),
                                       ("q", "k", "v", "out", "lse")))
            calls.append(sanitize.Call(label, "backward", (q, k, v, out.to(dtype), d_out, lse.float(),
                                                           torch.empty_like(q), torch.empty_like(k),
                                                           torch.empty_like(v), causal, 1 / math.sqrt(d)),
                                       ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv")))
    return calls


def backward_half_part(report, worker, hidden_cases, constants=None, grading=False) -> bool:
    """Steps 27-30 (optional): forward_lse and backward on 16-bit tensors, both types (a grading: each case in one,
    in_each_type); whether every case passed. The first case whose process crashed or hung ends the part. constants:
    the student's attention_backward_half.cu's (its tiles: WARPS, BLOCK_QUERIES)."""
    constants = constants or {}
    tiles = (16 * constants.get("WARPS", 8), constants.get("BLOCK_QUERIES", 32))
    report.begin_part("backward_half", PART_STEPS, optional=True)
    cases_of = lambda name: cli.cases(4, "backward_half", BACKWARD_HALF_CASES, hidden_cases,  # noqa: E731
                                      lambda s: f"{name} {backward_text(s)}", causal_ok=lambda s: s[3] <= s[4])
    for case, dtype in in_each_type(cases_of, grading):
        before = len(report.cases)
        report.run(case.name, lambda: check_backward_half_case(worker, case.shape, case.causal, case.seed, dtype,
                                                               tiles=tiles))
        if report.process_died_since(before, "the 16-bit backward part"):
            return report.end_part("backward_half")
    shape, shift = BACKWARD_HALF_NEGATIVE
    for i, (name, dtype) in enumerate(HALF_TYPES.items()):
        for causal in (False, True) if not grading else (bool(i),):  # not causal: only the tail's keys are masked
            before = len(report.cases)
            report.run(f"{name} {backward_text(shape)}{' causal' if causal else ''}, every score very negative "
                       f"(q + {shift:g}, k - {shift:g})",
                       lambda: check_backward_half_case(worker, shape, causal, cli.seed(31 + 2 * i + causal,
                                                                                        hidden_cases),
                                                        dtype, shift, tiles))
            if report.process_died_since(before, "the 16-bit backward part"):
                return report.end_part("backward_half")
    return report.end_part("backward_half")


BACKWARD_HALF_PASS_NAME = f"{sanitize.PASS_NAME}, the 16-bit backward kernels (optional)"


def backward_half_step_of(step_of):
    """test.py's step_of with the 16-bit backward's kernels (and step 27's in kernels/attention_half.cu)."""
    steps = {"delta_half_kernel": "Task 4, step 28 (optional)",
             "flash_attention_dkdv_half_kernel": "Task 4, steps 28-30 (optional)",
             "dq_half_kernel": "Task 4, step 30 (optional)",
             "flash_attention_half_kernel": "Task 4, steps 8-11, and step 27 for lse (optional)"}
    return lambda kernel: steps.get(kernel) or step_of(kernel)


def optional_backward_half(report, worker, args, passes: list, step_of) -> bool:
    """Steps 27-30 (optional), on compute capability 8.0 or newer: the checks, then bad input while the part's
    sanitizer pass runs (added to `passes`). Whether the checks passed."""
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        report.note(f"the 16-bit backward part (steps 27-30) needs compute capability 8.0 (Ampere) or newer, for "
                    f"mma.sync.m16n8k16 and cp.async: not run on this GPU ({major}.{minor})")
        return False
    constants = kernel_constants("task4/kernels/attention_backward_half.cu", args.student_dir, args.solution)
    if not backward_half_part(report, worker, args.hidden, constants, args.grading):
        return False
    passes.append(sanitize.start(report, 4, args, backward_half_sanitizer_calls(args.hidden),
                                 backward_half_step_of(step_of), BACKWARD_HALF_PASS_NAME, kind="optional",
                                 part="backward half"))
    report.run("bad input to the 16-bit backward part raises clear errors (the given binding)",
               lambda: check_backward_half_errors(worker), kind="optional")
    return True
