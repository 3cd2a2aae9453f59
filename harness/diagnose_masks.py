"""The common mistakes of the masks beyond causal (Task 3, steps 9-12), each computed in float64 and compared with
what failed, so a failure says which one it is and the step to fix.

A mistake is named only where it shows on the case's inputs (its result differs from the right one by more than
the tolerance) and the student's output matches it; otherwise the failure stays as the comparison said it.
"""

from __future__ import annotations

import math

import torch

from harness.attention_math import apply_masks, attention_float64, attention_gradients, expand_kv_heads, masked_scores
from harness.checks import CheckResult, exact_float32
from harness.diagnose import matches_mistake


def capped_twice(q, k, v, causal, scale, window_left, documents, softcap):
    """The scores capped twice (cap_scores called on what was already capped)."""
    scores = masked_scores(q, k, False, scale, softcap=softcap)
    scores = softcap * torch.tanh(scores / softcap)
    return torch.softmax(apply_masks(scores, causal, window_left, documents), dim=-1) @ v


def capped_before_scale(q, k, v, causal, scale, window_left, documents, softcap):
    """softcap * tanh(Q K^T / softcap) first, the scale after it."""
    scores = masked_scores(q, k, False, 1.0, softcap=softcap) * scale
    return torch.softmax(apply_masks(scores, causal, window_left, documents), dim=-1) @ v


def forward_mistakes(causal, window_left, documents, softcap):
    """(what, step, masks) for each mistake that applies: masks are attention_float64's keyword arguments, or a
    function of (q, k, v, causal, scale, window_left, documents, softcap) for the ones it cannot express."""
    right = {"window_left": window_left, "documents": documents, "softcap": softcap}
    found = []
    if window_left is not None:
        found.append(("the window one key too wide (window_left + 1 keys before the query: the edge one key early)",
                      9, right | {"window_left": window_left + 1}))
        if window_left > 0:
            found.append(("the window one key too narrow (window_left - 1 keys before the query: `<=` where "
                          "j < i + offset - window_left has `<`)", 9, right | {"window_left": window_left - 1}))
        found.append(("no window at all: the keys before it were seen (mask_tile's window, or the tiles it crosses "
                      "left unmasked)", 9, right | {"window_left": None}))
    if documents is not None:
        found.append(("no document mask: queries saw the keys of other documents", 10, right | {"documents": None}))
        for shift in (1, -1):
            moved = [documents[0]] + [c + shift for c in documents[1:-1]] + [documents[-1]]
            if all(a < b for a, b in zip(moved, moved[1:])):
                ends = "ends one key late" if shift > 0 else "ends one key early"
                found.append((f"a document boundary crossed: each document {ends} (cu_seqlens[d + 1] is the first "
                              f"position of the next document)", 10, right | {"documents": moved}))
    if softcap is not None:
        found.append(("the scores not soft-capped (cap_scores not called in step 3, or returning S)", 11,
                      right | {"softcap": None}))
        found.append(("the cap applied twice", 11, capped_twice))
        found.append(("the cap applied before the scale (softcap * tanh(Q K^T / softcap), then times the scale)", 11,
                      capped_before_scale))
    return found


def _result(how, q, k, v, causal, scale, window_left, documents, softcap):
    if callable(how):
        with exact_float32():
            q, k, v = (t.detach().double() for t in (q, k, v))
            k, v = expand_kv_heads(k, q.shape[-3]), expand_kv_heads(v, q.shape[-3])
            return how(q, k, v, causal, scale, window_left, documents, softcap)
    return attention_float64(q, k, v, causal, scale, **how)[0]


def _close(got, want, atol, rtol) -> bool:
    return bool(torch.isfinite(got).all()) and bool(((got - want).abs() <= atol + rtol * want.abs()).all())


def where(steps: dict | None, step) -> str:
    """"Task 3, step 9", or where another task's README has task 3's step (steps: {"task": N, 9: "steps 23-24",
    ..., "all": ...}; step "all" is steps 9-11)."""
    if steps is None:
        return f"Task 3, {'steps 9-11' if step == 'all' else f'step {step}'}"
    return f"Task {steps['task']}, {steps[step]}"


def diagnose_masked(result: CheckResult, got, q, k, v, causal, *, window_left, documents, softcap, atol, rtol,
                    scale=None, steps: dict | None = None) -> CheckResult:
    """A failed output of a masked case (out, not lse), with the mistake it matches named, or as it was. steps: where
    task 3's steps are in the README of the task checked (`where`), for task 4's kernel."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if not isinstance(got, torch.Tensor) or got.shape != q.shape:
        return result
    got = got.detach().double().cpu()
    nan_rows = torch.isnan(got).any(dim=-1)
    right = attention_float64(q, k, v, causal, scale, window_left=window_left, documents=documents, softcap=softcap)[0]
    for what, step, how in forward_mistakes(causal, window_left, documents, softcap):
        wrong = _result(how, q, k, v, causal, scale, window_left, documents, softcap)
        if _close(wrong, right, 2 * atol, 2 * rtol):
            continue
        matched, extra = matches_mistake(got, wrong, atol, rtol)  # the rows it leaves without a key: NaN or zero
        if matched:
            result.message += f": it matches {what} (README, {where(steps, step)}).{extra}"
            return result
    if nan_rows.any():
        rows = int(nan_rows.sum())
        # With window_left = 0 a query sees its own key alone; most rows NaN is that key hidden by the window's mask
        # (a tile whose window edge the mask test finds no crossing of keeps its rows right).
        if window_left == 0 and 2 * rows > nan_rows.numel():
            result.message += (f": {rows} of {nan_rows.numel()} output rows are NaN: with window_left = 0 a query "
                               f"sees its own key alone, and the window's mask hid it too (`<=` where j < i + offset "
                               f"- window_left has `<`; README, {where(steps, 9)})")
        else:
            result.message += (f": {rows} output rows are NaN: a row whose keys in a tile are all masked (its window "
                               f"or document starts in a later tile) has m_new = -inf there, and exp(-inf - (-inf)) "
                               f"is NaN; subtract 0 for such a row (README, {where(steps, 4)})")
        return result
    result.message += f" (README, {where(steps, 'all')})"
    return result


def gradients_with_cap_slope(q, k, v, d_out, causal, scale, window_left, documents, softcap, slope):
    """The gradients with dS taken back through the cap with slope(capped scores, softcap) in place of the right
    1 - (capped / softcap)^2."""
    with exact_float32(), torch.enable_grad():
        q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
        heads = q.shape[-3]
        raw = (q @ expand_kv_heads(k, heads).transpose(-2, -1)) * scale
        cap = softcap * torch.tanh(raw.detach() / softcap)
        capped = cap + (raw - raw.detach()) * slope(cap, softcap)  # the cap's value, with the given slope
        probabilities = torch.softmax(apply_masks(capped, causal, window_left, documents), dim=-1)
        (probabilities @ expand_kv_heads(v, heads)).backward(d_out.detach().double())
        return q.grad, k.grad, v.grad


CAP_SLOPE_MISTAKES = [  # (what, slope(capped scores, softcap))
    ("dS not multiplied by the cap's slope 1 - (S / softcap)^2", lambda cap, softcap: torch.ones_like(cap)),
    ("the cap's slope taken through tanh again, 1 - tanh^2(S / softcap) of the already capped S (the slope is "
     "1 - (S / softcap)^2)", lambda cap, softcap: 1 - torch.tanh(cap / softcap) ** 2),
]


def diagnose_masked_gradient(message: str, name: str, got, q, k, v, d_out, causal, *, window_left, documents,
                             softcap, atol, rtol, scale=None, where: str | None = None) -> str:
    """A failed gradient of a masked case: the cap's slope left out, named, else the steps to look at. where: the
    README's words for the step of another task than task 3's (task 4's step 26)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    index = ("dq", "dk", "dv").index(name)
    if softcap is not None and isinstance(got, torch.Tensor) and torch.isnan(got).any():
        return (f"{message}: NaN where a key is masked: the cap's slope was taken of the masked scores, whose -inf "
                f"has no slope (1 - (-inf / softcap)^2 is -inf, times dS = 0 is NaN); take it of the capped scores "
                f"before the mask (README, {where or 'Task 3, step 12: cap_gradient before mask_tile'})")
    if softcap is not None and isinstance(got, torch.Tensor):
        right = attention_gradients(q, k, v, d_out, causal, scale, window_left=window_left, documents=documents,
                                    softcap=softcap)[index]
        got = got.detach().double().cpu()
        for what, slope in CAP_SLOPE_MISTAKES:
            wrong = gradients_with_cap_slope(q, k, v, d_out, causal, scale, window_left, documents, softcap,
                                             slope)[index]
            if wrong.shape == got.shape and not _close(wrong, right, 2 * atol, 2 * rtol) and _close(got, wrong, atol,
                                                                                                   rtol):
                return f"{message}: it matches {what} ({f'README, {where}' if where else TASK3_CAP})"
    return f"{message} (README, {where or TASK3_BACKWARD})"


TASK3_CAP = "cap_gradient, README, Task 3, step 12"
TASK3_BACKWARD = "Task 3, steps 8 and 12: the masks in step 8, the loops' bounds and cap_gradient"
