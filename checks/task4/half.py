"""Task 4's steps 8-11 (optional): the bf16/fp16 kernel against float64 on the same 16-bit inputs, and the given
binding's errors for it; run in a process of its own by checks/task4/test.py.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from harness import cli
from harness.checks import compare, expect_errors, guard_damage, guarded_input, guarded_output
from harness.attention_math import attention_float64, expand_kv_heads
from harness.diagnose import diagnose, diagnose_sequences, named, tile_schedules
from checks.task4 import measure
from checks.task4.measure import HALF_TYPES
from checks.task4.cases import HALF_CASES, LARGE_SCORES
from checks.task4.forward import grouped, grouped_text, make_inputs, padded_spans

HALF_CALL_TIMEOUT_S = 60  # a call of the bf16/fp16 part: small cases, so a hang costs a minute, not five


def half_text(shape) -> str:
    b, h, kvh, sq, sk, d, starts = shape
    return (grouped_text(shape) if kvh < h or starts is not None
            else f"batch {b} heads {h} seq {sq}x{sk} head_dim {d}")


# Where the 16-bit kernel makes each of the common mistakes (harness/diagnose.py): the scale, the mask and the
# online softmax's rescales are all step 10 here
HALF_MISTAKES_STEP = 10


def check_half_case(worker, shape, causal, seed, dtype, magnitude=1.0, constants=None, call="forward_half",
                    step=HALF_MISTAKES_STEP, diagnosed=True, shifted=()):
    """One case of a 16-bit kernel (`call`: the bf16/fp16 one, or the Hopper one) against float64 on the same
    16-bit inputs, within what SDPA's error says the type allows; outputs poisoned, guard bands around every
    tensor. A wrong output is compared with the common mistakes within the same allowance, under the student's
    key tiles (`constants`: BLOCK_COLS, and BLOCK_COLS_SMALL or BLOCK_COLS_LARGE_D), and named with `step` (unless
    not `diagnosed`). The tensors named in `shifted` start 2 bytes off a 16-byte boundary."""
    heads, starts = grouped(shape)[1], grouped(shape)[6]
    q, k, v = (t.to(dtype) for t in make_inputs(shape, seed, magnitude))
    key_start = None if starts is None else torch.tensor(starts, dtype=torch.int32)
    scale = 1.0 / math.sqrt(q.shape[-1])
    inputs = [guarded_input(name, t, shift=int(name in shifted)) for name, t in zip("qkv", (q, k, v))]
    out = guarded_output("out", q.shape, dtype=dtype, shift=int("out" in shifted))
    worker.call(call, *(t.tensor for t in inputs), out.tensor, causal, scale,
                None if key_start is None else key_start.cuda(), timeout=HALF_CALL_TIMEOUT_S)
    damage = guard_damage(*inputs, out)
    if damage:
        return damage
    expected = attention_float64(q, k, v, causal, scale, key_start)[0]
    allowed, said = measure.half_allowance(q, k, v, causal, scale, key_start, expected)
    result = compare(out.tensor, expected, atol=allowed, rtol=0.0, poisoned=True)
    result = dataclasses.replace(result, message=f"{result.message} ({said})")
    if not diagnosed:
        return result
    k, v = expand_kv_heads(k, heads), expand_kv_heads(v, heads)  # the float64 side only
    widths = [(constants or {}).get(name) for name in ("BLOCK_COLS", "BLOCK_COLS_SMALL", "BLOCK_COLS_LARGE_D")]
    # a mistaken output can be larger than a right one (a single row of V where a mean was meant), and its 16-bit
    # rounding with it: the allowance, plus one unit in the last place of the type at each value's size
    how = dict(atol=allowed, rtol=torch.finfo(dtype).eps, scale=scale, step=step)
    if key_start is not None:
        spans = padded_spans(starts, q.shape[-2], k.shape[-2])
        return diagnose_sequences(4, result, out.tensor, q, k, v, causal, spans,
                                  schedules_for=lambda keys: tile_schedules(*widths), **how)
    return diagnose(4, result, out.tensor, q, k, v, causal, schedules=tile_schedules(*widths), **how)


def check_half_errors(worker, call="forward_half"):
    """The given binding's errors for a 16-bit kernel (`call`: the bf16/fp16 one, or the Hopper one, which share
    them; not the student's work: reported, not scored)."""
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=torch.bfloat16)
    bad = {
        "float32 q": ((q.float(), q.float(), q.float(), q.float()), f"must be bfloat16 or float16 for {call}"),
        "k in float16 beside a bfloat16 q": ((q, q.half(), q.clone(), torch.empty_like(q)), "like q"),
        "out in float32": ((q, q.clone(), q.clone(), q.float()), "like q"),
        "CPU tensor": ((q.cpu(), q.cpu(), q.cpu(), q.cpu()), "must be a CUDA tensor"),
        "non-contiguous": ((q.transpose(2, 3), q.clone(), q.clone(), torch.empty_like(q)), "contiguous"),
        "head_dim 256": ((torch.randn(1, 1, 4, 256, device="cuda", dtype=torch.half),) * 4,
                         "head_dim must be at most 128"),
        "out is q": ((q, q.clone(), q.clone(), q), "must not share memory"),
    }
    return expect_errors(lambda *args: worker.call(call, *args),
                         [(what, (*args, False, 0.125), words) for what, (args, words) in bad.items()])


# Failed cases of a 16-bit part that no common mistake explains, compared with them all the same: each comparison
# computes every mistake in float64 on the CPU (seconds on a large padded case), so a kernel wrong in some other way
# would pay it in every case. Cases a mistake explains go on being compared (they stop at the mistake they match).
DIAGNOSED_FAILURES = 3


def run_16bit_part(report, worker, part, cases, hidden_cases, prefix, large_seed, what, constants=None,
                   shifted_cases=(), **how):
    """A 16-bit part's cases: `cases` and the hidden ones in both types (causal too where seq_q <= seq_k), then
    large scores, then `shifted_cases` ((tensor names, shape, causal), bf16: those tensors 2 bytes off a 16-byte
    boundary), each through check_half_case (`how`: its call and step). The first case whose process crashed,
    hung or met a CUDA error ends the part (after a CUDA error the process can no longer use the GPU): the rest
    would fail as it did, or wait as long, and it is said once. Failures are compared with the common mistakes until
    DIAGNOSED_FAILURES of them matched none; a note counts the failures not compared after that."""
    runs = [(case, dtype, 1.0, ()) for name, dtype in HALF_TYPES.items()
            for case in cli.cases(4, part, cases, hidden_cases, lambda s: f"{prefix}{name} {half_text(s)}",
                                  causal_ok=lambda s: s[3] <= s[4])]
    shape, magnitude = LARGE_SCORES
    runs += [(cli.Case(part, shape, True, cli.seed(large_seed, hidden_cases), "cuda",
                       f"{prefix}{name} large scores (q x {magnitude:g}) {half_text(shape)}"), dtype, magnitude, ())
             for name, dtype in HALF_TYPES.items()]
    assert all(set(names) <= {"q", "k", "v", "out"} for names, _, _ in shifted_cases), shifted_cases
    runs += [(cli.Case(part, shape, causal, cli.seed(large_seed + 1 + i, hidden_cases), "cuda",
                       f"{prefix}bf16 {', '.join(names)} 2 bytes off a 16-byte boundary, {half_text(shape)}"),
              torch.bfloat16, 1.0, names) for i, (names, shape, causal) in enumerate(shifted_cases)]
    unexplained = not_compared = 0  # failures no mistake named; failures left uncompared after that
    try:
        for case, dtype, magnitude, shifted in runs:
            before = len(report.cases)
            compared = unexplained < DIAGNOSED_FAILURES
            report.run(case.name, lambda: check_half_case(worker, case.shape, case.causal, case.seed, dtype,
                                                          magnitude, constants, **how, diagnosed=compared,
                                                          shifted=shifted))
            failed = [c for c in report.cases[before:] if not c.passed]
            # a failure that never reached the comparison (a raise, guard damage) is one no mistake named, too
            unexplained += sum(compared and not named(c.message) for c in failed)
            not_compared += 0 if compared else len(failed)
            if report.process_died_since(before, what):
                return
            if any("CUDA error" in c.message for c in report.cases[before:]):
                report.note(f"the rest of {what} was not run: {case.name} ended in a CUDA error, and the process "
                            "running your code cannot use the GPU after one")
                return
    finally:
        if not_compared:
            report.note(f"{what}: {not_compared} failed case(s) were not compared with the common mistakes, after "
                        f"{DIAGNOSED_FAILURES} that matched none of them (each comparison takes seconds): fix those "
                        "first")


def half_part(report, worker, hidden_cases, constants=None) -> bool:
    """Steps 8-11 (optional): the bf16/fp16 kernel in both types; whether every case passed."""
    report.begin_part("half", (8, 9, 10, 11), optional=True)
    run_16bit_part(report, worker, "half", HALF_CASES, hidden_cases, "", 19, "the bf16/fp16 part", constants)
    return report.end_part("half")
