"""Correctness checks: compare an output with a float64 reference.

Every check in the course goes through `compare`, so a wrong value, a NaN, an
Inf and an element the kernel never wrote (left at the NaN that `guarded_output`
filled it with) all fail the same way, with the first few bad indices printed.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

SHOW_FIRST = 5  # how many mismatching indices a message lists


@dataclass
class CheckResult:
    passed: bool
    message: str
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan
    mean_abs_err: float = math.nan
    mismatches: int = 0
    untouched: bool = False  # every element still holds the NaN the output was poisoned with

    def metrics(self) -> dict:
        return {
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "mean_abs_err": self.mean_abs_err,
            "mismatches": self.mismatches,
        }


GUARD_ELEMENTS = 1 << 16  # float32 elements in each band: more than a tile of rows at the largest head_dim
GUARD_BITS = 0x7FBADBAD  # a NaN that no arithmetic produces, so even a NaN written into a band shows
GUARD_BITS_16 = 0x7FBD  # the same for 16-bit tensors: a NaN in bfloat16 and in float16 alike


class Guarded:
    """A tensor placed inside a larger allocation, with a band before and after it holding GUARD_BITS.

    The code under test gets `.tensor` (contiguous, the shape asked for). Afterwards `damage()`
    says whether it wrote into a band (past the end, or before the start) or, for an input,
    changed a value. Inputs keep a copy of their values here, so the expected values never
    come from memory the code under test could write. `shift` elements more before the tensor
    move it off the allocation's alignment (1: 2 bytes off a 16-byte boundary for a 16-bit type).
    """

    def __init__(self, name: str, shape, device="cuda", values: torch.Tensor | None = None, dtype=torch.float32,
                 shift: int = 0):
        self.name, self.shape = name, tuple(shape)
        count = math.prod(self.shape)
        self.start = GUARD_ELEMENTS + shift
        self.buffer = torch.empty(2 * GUARD_ELEMENTS + shift + count, device=device, dtype=dtype)
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"a guarded tensor is float32, bfloat16 or float16, got {dtype}")
        self.bits, self.guard = (torch.int32, GUARD_BITS) if dtype == torch.float32 else (torch.int16, GUARD_BITS_16)
        self.buffer.view(self.bits).fill_(self.guard)  # an output starts as this NaN too: unwritten shows
        self.tensor = self.buffer[self.start:self.start + count].view(self.shape)
        self.values = None if values is None else values.detach().to("cpu", dtype).clone()
        if values is not None:
            self.tensor.copy_(values)

    def damage(self) -> str | None:
        """What the code under test did outside its rights, or None."""
        bits = self.buffer.view(self.bits)
        before = (bits[:self.start] != self.guard).nonzero()
        after = (bits[self.start + math.prod(self.shape):] != self.guard).nonzero()
        row = self.shape[-1] if self.shape else 1
        what = "tensor" if len(self.shape) < 2 else " x ".join(map(str, self.shape))
        if len(after):
            reach = int(after.max()) + 1
            rows = -(-reach // row)
            return (f"wrote {rows} row{'s' if rows > 1 else ''} past the end of `{self.name}` ({what}): "
                    f"{len(after)} of the {GUARD_ELEMENTS} elements after it changed (a missing bounds check "
                    "on a store?)")
        if len(before):
            reach = self.start - int(before.min())
            return (f"wrote {reach} element{'s' if reach > 1 else ''} before the start of `{self.name}` ({what}) "
                    "(a negative index?)")
        if self.values is not None:
            changed = int((self.tensor.cpu().view(self.bits) != self.values.view(self.bits)).sum())
            if changed:
                return (f"changed its input `{self.name}` ({what}): {changed} element"
                        f"{'s differ' if changed > 1 else ' differs'} afterwards; inputs are read-only")
        return None


def guarded_input(name: str, values: torch.Tensor, device="cuda", shift: int = 0) -> Guarded:
    half = values.dtype in (torch.bfloat16, torch.float16)  # any other input is held as float32, as always
    return Guarded(name, values.shape, device, values, dtype=values.dtype if half else torch.float32, shift=shift)


def guarded_output(name: str, shape, device="cuda", dtype=torch.float32, shift: int = 0) -> Guarded:
    return Guarded(name, shape, device, dtype=dtype, shift=shift)


def guard_damage(*guarded: Guarded) -> CheckResult | None:
    """A failed CheckResult for the first tensor written outside its rights, or None when all are intact."""
    for g in guarded:
        problem = g.damage()
        if problem:
            return CheckResult(False, problem)
    return None


def bit_sum(t: torch.Tensor) -> int:
    """The sum of a tensor's bits (int64, on its device, no copy): any change to an input shows."""
    return int(t.view(torch.int32 if t.element_size() == 4 else torch.int16).sum(dtype=torch.int64))


@contextmanager
def exact_float32():
    """Turn TF32 off so float32 matmuls are true float32 (and the reference is exact)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def random_tensor(shape, seed: int, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Fresh standard-normal values from a seed, generated on the CPU so every device sees the same data."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def _fmt_index(flat: int, shape) -> tuple:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def builds_on(result, failed_before: int, what: str):
    """A check built on cases that already failed (a layer over a kernel whose own cases fail): its failure points
    there first, so the results say it as one kind with a count, not as numbers of its own."""
    passed = result.passed if isinstance(result, CheckResult) else bool(result[0])
    if passed or not failed_before:
        return result
    lead = f"{what} fail above ({failed_before}): fix that first."
    if isinstance(result, CheckResult):
        return dataclasses.replace(result, message=f"{lead} {result.message}")
    return (result[0], f"{lead} {result[1]}", *result[2:])


def index_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 7] -> "0-2, 7" (the first few runs)."""
    runs = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:4])
    return text + (", ..." if len(runs) > 4 else "")


def unwritten(nan: torch.Tensor) -> str | None:
    """Where a poisoned output was left unwritten (`nan`: bool, the output's shape), in words, when it is
    whole matrices, whole rows or whole columns of its last two dimensions: what a grid or a loop that
    stops a tile early leaves behind. None when the NaN fit no such pattern."""
    if nan.dim() < 2 or not nan.any():
        return None
    rows, cols = nan.shape[-2:]
    mats = nan.reshape(-1, rows, cols)
    whole = mats.flatten(1).all(dim=1)
    if bool((mats == whole[:, None, None]).all()) and mats.shape[0] > 1:
        lead = tuple(nan.shape[:-2])
        first = [_fmt_index(i, lead) for i in whole.nonzero().flatten()[:SHOW_FIRST].tolist()]
        return (f"the whole {rows} x {cols} matrix at {', '.join(map(str, first))}"
                f"{', ...' if len(first) < int(whole.sum()) else ''} ({int(whole.sum())} of the {mats.shape[0]} "
                f"over the leading dimensions {lead}): does the grid cover every batch and head?")
    for axis, count, what in ((2, rows, "rows"), (1, cols, "columns")):
        lines = mats.all(dim=axis)  # (matrices, count): a row or column left whole
        if not bool((mats == (lines[:, :, None] if axis == 2 else lines[:, None, :])).all()):
            continue  # some NaN outside whole lines
        hit = lines.any(dim=0).nonzero().flatten().tolist()
        if len(hit) == 1:
            what = what[:-1]  # "row 0", not "rows 0"
        where = "" if len(mats) == 1 else " of every matrix" if bool((lines == lines[:1]).all()) else " of some matrices"
        tail = hit == list(range(count - len(hit), count))
        hint = (f", the last {len(hit)}: a grid or loop that leaves out the last, partial tile (round the number of "
                "tiles up)?" if tail else ": a tile or a thread's share left out?")
        return f"{what} {index_ranges(hit)} of {count}{where}{hint}"
    return None


def wrong_kind(out, shape, name: str, device: str | None) -> CheckResult | None:
    """A failed CheckResult when `out` is not a floating-point tensor of `shape` made on `device`."""
    if not isinstance(out, torch.Tensor):
        return CheckResult(False, f"{name} should be a torch.Tensor, got {type(out).__name__}")
    made_on = getattr(out, "worker_device", out.device.type)
    if device is not None and made_on != device:
        return CheckResult(False, f"{name} is on {made_on}, but the inputs were on {device}: keep it on theirs")
    if not out.is_floating_point():
        return CheckResult(False, f"{name} has dtype {out.dtype}, expected a floating-point tensor")
    if tuple(out.shape) != tuple(shape):
        return CheckResult(False, f"{name} has shape {tuple(out.shape)}, expected {tuple(shape)}")
    return None


def compare(out, ref, *, atol: float, rtol: float, name: str = "output", poisoned: bool = False,
            device: str | None = None) -> CheckResult:
    """Elementwise |out - ref| <= atol + rtol * |ref|; NaN or Inf in `out` always fails.

    poisoned=True says `out` was filled with NaN before the code under test ran, so an
    all-NaN result means nothing was written (a skeleton), not NaN computed everywhere.
    device: where the output must have been made (the inputs' device), for outputs that a
    worker returned (they arrive on the CPU, marked with the device they were on).
    """
    wrong = wrong_kind(out, ref.shape, name, device)
    if wrong:
        return wrong
    got = out.detach().to("cpu", torch.float64)
    want = ref.detach().to("cpu", torch.float64)
    total = got.numel()

    bad_values = ~torch.isfinite(got)
    if bad_values.any():
        nans = int(torch.isnan(got).sum())
        infs = int(bad_values.sum()) - nans
        # Never written means still holding the fill's bits: a NaN the code computed is not that.
        filled = out.detach().to("cpu").contiguous()
        fills = {torch.float32: (torch.int32, GUARD_BITS), torch.bfloat16: (torch.int16, GUARD_BITS_16),
                 torch.float16: (torch.int16, GUARD_BITS_16)}
        filled = filled.view(fills[filled.dtype][0]) == fills[filled.dtype][1] if filled.dtype in fills else None
        if nans == total and poisoned and (filled is None or bool(filled.all())):
            return CheckResult(False, f"{name} is entirely NaN: nothing was written to it", mismatches=total,
                               untouched=True)
        if nans == total and not (poisoned and filled is not None and bool(filled.any())):  # else: both kinds
            return CheckResult(False, f"{name} is entirely NaN{', computed by the code (not the fill)' if poisoned else ''}"
                               " (for example exp(-inf - (-inf)) in a row whose every score is -inf, or inf / inf)",
                               mismatches=total)
        first = [_fmt_index(i, got.shape) for i in bad_values.flatten().nonzero()[:SHOW_FIRST, 0].tolist()]
        exact = poisoned and infs == 0 and filled is not None and bool((filled == torch.isnan(got)).all())
        pattern = unwritten(filled) if exact else None
        if pattern:
            return CheckResult(False, f"{name}: {nans} of {total} elements never written (still the NaN it was "
                               f"filled with): {pattern}", mismatches=nans)
        if poisoned and filled is not None:  # the fill's bits tell the two kinds of NaN apart
            left = int(filled.sum())
            computed = (torch.isnan(got) & ~filled).reshape(got.shape)
            where = unwritten(computed)
            kinds = [f"{nans - left} NaN computed by the code (0/0, inf - inf, or an overflow: not left unwritten)"
                     + (f", in {where.split(':')[0]}" if where else ""), f"{infs} Inf",
                     f"{left} never written (still the NaN it was filled with)"]
            said = "; ".join(kind for kind in kinds if not kind.startswith("0 "))
        else:
            said = f"{nans} NaN and {infs} Inf (computed, or never written)"
        return CheckResult(False, f"{name} has {int(bad_values.sum())} of {total} elements not finite: {said}; "
                           f"first at {', '.join(map(str, first))}", mismatches=int(bad_values.sum()))

    diff = (got - want).abs()
    rel = diff / want.abs().clamp_min(1e-12)
    bad = diff > atol + rtol * want.abs()
    count = int(bad.sum())
    result = CheckResult(
        passed=count == 0,
        message="",
        max_abs_err=float(diff.max()) if total else 0.0,
        max_rel_err=float(rel.max()) if total else 0.0,
        mean_abs_err=float(diff.mean()) if total else 0.0,
        mismatches=count,
    )
    # The worst error against the output's scale: an error relative to each element means
    # nothing where the expected value is near zero.
    scale = float(want.abs().max()) if total else 0.0
    worst = "exact" if result.max_abs_err == 0 else (
        f"max abs err {result.max_abs_err:.2e}"
        + (f" = {result.max_abs_err / scale:.1e} x the largest |expected| ({scale:.3g})" if scale > 0 else ""))
    if count == 0:
        result.message = worst
        return result
    flat_got, flat_want = got.flatten(), want.flatten()
    shown = [
        f"{_fmt_index(i, got.shape)}: got {flat_got[i]:.6g}, expected {flat_want[i]:.6g}"
        for i in bad.flatten().nonzero()[:SHOW_FIRST, 0].tolist()
    ]
    result.message = (
        f"{name}: {count} of {total} elements differ (atol {atol:g}, rtol {rtol:g}; {worst}); first: "
        + "; ".join(shown)
    )
    return result


def within(out, ref, *, atol, rtol) -> bool:
    """compare's rule computed where the tensors are, one answer sent back: the quick path of a check that runs
    many times (every output of a benchmark's requests). atol may be a tensor (a tolerance per row). NaN and Inf
    never pass; compare then says what is wrong."""
    if out.shape != ref.shape:
        return False
    got, want = out.detach().double(), ref.detach().to(out.device, torch.float64)
    return bool(((got - want).abs() <= atol + rtol * want.abs()).all())


def expect_errors(call, bad) -> tuple[bool, str, dict]:
    """Every bad input raises an error that says what is wrong: a check of the given bindings.

    bad: (what, args, words) triples; `call(*args)` must raise the worker's error, and its
    message must contain `words`.
    """
    from harness.sandbox import WorkerError

    for what, args, words in bad:
        try:
            call(*args)
        except WorkerError as err:
            if words not in err.message:
                return False, f"{what}: the error does not say {words!r}: {err}", {}
            continue
        return False, f"{what}: no error was raised", {}
    return True, f"{len(bad)} kind{'s' if len(bad) != 1 else ''} of bad input rejected with clear errors", {}


# Generated text: logits agree within LOGITS_ATOL x the largest |logit| plus LOGITS_RTOL x |logit|.
# Measured: a float32 model on the CPU is within 1e-6 of float64 (relative to the largest logit).
LOGITS_ATOL, LOGITS_RTOL = 1e-4, 1e-4


# A model in bf16 or fp16: its logits within this many times the largest error of the same model in that type
# with PyTorch's own attention, measured on the same tokens (tasks 6 and 7's optional 16-bit parts).
HALF_ERROR_FACTOR = 2.0
HALF_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # their short names, as case names say them

# A 16-bit model's call in tasks 6 and 7 (teacher-forced, or a generation). Their slowest case took 18.6 s in a
# grading on an H200 (the first: the build's load and warm-up included), so a 16-bit kernel that hangs (the Hopper
# kernel's turns, task 4's step 22) costs two minutes there, not the five of any other call.
MODEL_16BIT_CALL_TIMEOUT_S = 120
HUNG_16BIT = ("the 16-bit model did not answer: one of your 16-bit kernels hangs. python -m task4.test --half (on an "
              "H100/H200, --hopper: its kernel runs these models once its steps are written) and python -m "
              "task5.test --half run each alone and say which")


def in_each_type(cases_of, grading: bool = False) -> list:
    """(case, dtype) for an optional 16-bit part: every cli.Case of cases_of(short name) in bf16 and in fp16, or in
    a grading each case in one of them (both types still run, at half the cost every grading pays; a student's own
    run checks both). The type turns with the shape and the mask together, so a shape checked causal and not runs
    once in each type."""
    runs = []
    for t, (name, dtype) in enumerate(HALF_TYPES.items()):
        shapes: dict = {}  # each shape's place among the part's shapes, in order
        for case in cases_of(name):
            place = shapes.setdefault(case.shape, len(shapes))
            if not grading or (place + case.causal) % len(HALF_TYPES) == t:
                runs.append((case, dtype))
    return runs


def half_logits_atol(yardstick: float, expected, dtype) -> tuple[float, str]:
    """(atol, what it is, for the message): a 16-bit model's tolerance from `yardstick`, the largest logit error of
    the same model in `dtype` with PyTorch's attention against `expected` (never under float32's)."""
    atol = max(HALF_ERROR_FACTOR * yardstick, LOGITS_ATOL * float(expected.abs().max()))
    return atol, (f" (allowed {atol:.2g}: {HALF_ERROR_FACTOR:g}x the largest logit error of the same model in "
                  f"{str(dtype)[6:]} with PyTorch's attention, {yardstick:.2g}, on the same tokens)")


def decided(expected, atol: float | None = None) -> torch.Tensor:
    """Where the greedy token is decided: the reference's two best logits (batch, positions, vocab) further apart
    than twice the tolerance (below it, float32 may pick either: random weights make such near-ties common).
    atol: the logits' absolute tolerance, when not float32's (a 16-bit model's, measured)."""
    atol = LOGITS_ATOL * float(expected.abs().max()) if atol is None else atol
    top2 = expected.topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]) > 2 * (atol + LOGITS_RTOL * top2[..., 0].abs())


def compare_logits(got, expected, prompt_len: int, first: int = 0, hints=("", ""),
                   atol: float | None = None) -> tuple[bool, str, dict]:
    """Teacher forcing's rule: logits (batch, positions, vocab), from position `first`, against the reference's.

    The logits must agree everywhere, and the greedy token wherever the reference's two best
    logits differ by more than the tolerance (below it, float32 may pick either: random
    weights make such near-ties common). A failure names the first wrong position, in the
    prompt or at which decode step, with `hints` (prompt, decode) saying what to look at.
    """
    if not torch.isfinite(expected).all():  # the checks' own reference: never a pass against it
        return False, "the reference's logits are not all finite: the check itself is wrong (report it)", {}
    atol = LOGITS_ATOL * float(expected.abs().max()) if atol is None else atol
    result = compare(got, expected, atol=atol, rtol=LOGITS_RTOL, name="logits")
    if not result.passed:
        err = (got.double() - expected).abs() - LOGITS_RTOL * expected.abs()
        wrong = (err > atol) | ~torch.isfinite(got)
        positions = wrong.any(dim=-1).any(dim=0).nonzero().flatten().tolist()
        if positions:
            p = first + positions[0]
            where = (f"position {p}, in the prompt{hints[0]}" if p < prompt_len else
                     f"position {p}, decode step {p - prompt_len + 1} after a prompt of {prompt_len}{hints[1]}")
            result.message += f"; the first wrong logits are at {where}"
        return False, result.message, result.metrics()
    settled = decided(expected, atol)
    differ = (got.argmax(dim=-1) != expected.argmax(dim=-1)) & settled
    if differ.any():
        b, t = differ.nonzero()[0].tolist()
        return False, f"greedy token differs at position {first + t} of sequence {b}", result.metrics()
    ties = int((~settled).sum())
    return True, (f"{result.message}; greedy tokens agree at {int(settled.sum())} positions"
                  f"{f' ({ties} near-ties not compared)' if ties else ''}"), result.metrics()
