"""Task 4's step 26 (optional): the backward part (steps 12-16) with the masks beyond causal of steps 23-24, against
float64 autograd under the same masks; run by checks/task4/test.py in a process of its own."""

from __future__ import annotations

import dataclasses
import math

import torch

from checks.task4.backward import BACKWARD_CALL_TIMEOUT_S
from checks.task4.forward import make_inputs
from checks.task4.masks import MASK_CASES, mask_arguments, mask_text
from checks.task4.measure import ATOL, RTOL
from harness import cli, sanitize
from harness.attention_math import attention_float64, attention_gradients
from harness.checks import compare, guard_damage, guarded_input, guarded_output, random_tensor
from harness.diagnose_masks import diagnose_masked_gradient

BACKWARD_MASK_STEPS = (26,)
WHERE = "Task 4, step 26"


def backward_shapes(shapes):
    """The masks' cases the backward part takes: no padding (it has none)."""
    return [shape for shape in shapes if shape[-1] is None]


def masks_of(shape) -> dict:
    """The masks as attention_float64 and attention_gradients take them (documents: cu_seqlens as a list)."""
    masks = mask_arguments(shape)
    cu_seqlens = masks.pop("cu_seqlens")
    return {**masks, "documents": None if cu_seqlens is None else cu_seqlens.tolist()}


def check_backward_masked_case(worker, shape, seed):
    """forward_lse with the masks (out and L against float64), then backward with them (given float64's out and L
    in float32) against float64 autograd under the same masks; outputs poisoned, guard bands. A wrong gradient with
    a cap is compared with the cap's slope left out or taken twice."""
    b, h, kvh, sq, sk, d, causal, *_ = shape
    q, k, v = make_inputs((b, h, kvh, sq, sk, d, None), seed)
    d_out = random_tensor(q.shape, seed + 3)
    scale = 1.0 / math.sqrt(d)
    masks = masks_of(shape)
    cu_seqlens = mask_arguments(shape)["cu_seqlens"]
    arguments = (masks["window_left"], masks["softcap"], None if cu_seqlens is None else cu_seqlens.cuda())
    expected_out, expected_lse = attention_float64(q, k, v, causal, scale, **masks)

    inputs = [guarded_input(name, t) for name, t in zip("qkv", (q, k, v))]
    out, lse = guarded_output("out", q.shape), guarded_output("lse", q.shape[:3])
    worker.call("forward_lse", *(t.tensor for t in inputs), out.tensor, lse.tensor, causal, scale, *arguments,
                timeout=BACKWARD_CALL_TIMEOUT_S)
    damage = guard_damage(*inputs, out, lse)
    if damage:
        return damage
    said = []
    for name, got, expected in (("lse", lse, expected_lse), ("out", out, expected_out)):
        result = compare(got.tensor, expected, atol=ATOL, rtol=RTOL, name=name, poisoned=True)
        if not result.passed:  # the masks' forward is steps 23-24's kernel, with step 12's lse
            return dataclasses.replace(result, message=f"forward_lse's {result.message} with the masks (README, "
                                                       "Task 4, steps 12 and 23-24)")
        said.append(f"{name} {result.message}")

    saved = (q, k, v, expected_out.float(), d_out, expected_lse.float())
    inputs = [guarded_input(name, t) for name, t in zip(("q", "k", "v", "out", "dout", "lse"), saved)]
    grads = [guarded_output(name, t.shape) for name, t in zip(("dq", "dk", "dv"), (q, k, v))]
    worker.call("backward", *(t.tensor for t in inputs + grads), causal, scale, *arguments,
                timeout=BACKWARD_CALL_TIMEOUT_S)
    damage = guard_damage(*inputs, *grads)
    if damage:
        return damage
    for got, expected in zip(grads, attention_gradients(q, k, v, d_out, causal, scale, **masks)):
        result = compare(got.tensor, expected, atol=ATOL, rtol=RTOL, name=got.name, poisoned=True)
        if not result.passed:
            if result.untouched:
                return result
            return dataclasses.replace(result, message=diagnose_masked_gradient(
                result.message, got.name, got.tensor, q, k, v, d_out, causal, atol=ATOL, rtol=RTOL, scale=scale,
                where=WHERE, **masks))
        said.append(f"{got.name} {result.message}")
    return True, "; ".join(said), {}


def backward_masks_part(report, worker, hidden_cases) -> bool:
    """Step 26 (optional): the backward part with the masks, on the masks' cases without padding (and the hidden
    ones); whether all passed."""
    report.begin_part("backward masks", BACKWARD_MASK_STEPS, optional=True)
    before = len(report.cases)
    for case in cli.cases(4, "masks", backward_shapes(MASK_CASES), hidden_cases, mask_text, causal=(False,)):
        if case.shape[-1] is not None:  # a hidden case with padding
            continue
        report.run(f"backward masks: {case.name}", lambda: check_backward_masked_case(worker, case.shape, case.seed))
        if report.process_died_since(before, "the backward masks part"):
            break
    return report.end_part("backward masks")


BACKWARD_MASKS_PASS_NAME = f"{sanitize.PASS_NAME}, the backward kernels' masks (optional)"


def backward_masks_sanitizer_calls(hidden: cli.Hidden | None) -> list[sanitize.Call]:
    """Step 26's pass: forward_lse and backward with a window over grouped heads, and with short documents and a
    cap, at the tile edges."""
    calls = []
    for i, shape in enumerate([(1, 4, 2, 130, 130, 64, True, 30, None, None, None),
                               (1, 2, 1, 129, 129, 80, False, None, (1, 64, 64), 1.5, None)]):
        b, h, kvh, sq, sk, d, causal, *_ = shape
        q, k, v = make_inputs((b, h, kvh, sq, sk, d, None), cli.seed(sq + d + 5 * i, hidden))
        masks = masks_of(shape)
        cu_seqlens = mask_arguments(shape)["cu_seqlens"]
        arguments = (masks["window_left"], masks["softcap"], cu_seqlens)
        names = ("cu_seqlens",) * (cu_seqlens is not None)
        out, lse = (t.float() for t in attention_float64(q, k, v, causal, 1 / math.sqrt(d), **masks))
        calls.append(sanitize.Call(f"forward_lse masks {mask_text(shape)}", "forward_lse",
                                   (q, k, v, torch.empty_like(q), torch.empty(b, h, sq), causal, 1 / math.sqrt(d),
                                    *arguments), ("q", "k", "v", "out", "lse", *names)))
        calls.append(sanitize.Call(f"backward masks {mask_text(shape)}", "backward",
                                   (q, k, v, out, random_tensor(q.shape, i), lse, torch.empty_like(q),
                                    torch.empty_like(k), torch.empty_like(v), causal, 1 / math.sqrt(d), *arguments),
                                   ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv", *names)))
    return calls
