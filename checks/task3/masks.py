"""The optional masks beyond causal of task 3 (steps 9-12): a sliding window, packed documents and soft-capped
scores, each against float64 with the tiles it hides skipped, in the forward pass and in the backward pass."""

from __future__ import annotations

import itertools

import torch

from harness import cli
from harness.attention_math import attention_float64, attention_gradients
from harness.checks import compare, random_tensor
from harness.diagnose_masks import diagnose_masked, diagnose_masked_gradient

from checks.task3.cases import (ATOL, BACKWARD_CALL_TIMEOUT_S, RTOL, SKIP_TILE, SkipSizes, autograd_wrong,
                                backward_call, causal_cpu_ratio, check_no_full_matrix, float64_masks, inputs,
                                skip_sizes, tiles_visited, timed_runs, timed_wrong)

# The masks beyond causal (steps 9-12): (batch, heads, seq_q, seq_k, head_dim, block_rows, block_cols, causal,
# window_left, the documents' lengths, softcap); None where a mask is not used. The scores of random_tensor inputs
# reach about 3 at head_dim 32, so a softcap of 1 or 2 binds.
MASK_STEPS, MASK_BACKWARD_STEPS = (9, 10, 11), (12,)
MASK_CASES = [
    (2, 2, 129, 129, 32, 32, 16, True, 40, None, None),  # the window's edge inside tiles; rows of no key yet
    (1, 2, 100, 300, 32, 64, 64, True, 70, None, None),  # seq_q != seq_k
    (1, 2, 97, 97, 16, 16, 16, True, 0, None, None),  # a window of one key, the query's own
    (1, 1, 70, 70, 16, 16, 32, True, 500, None, None),  # a window past the sequence's start: causal's values
    (1, 2, 96, 96, 16, 16, 16, True, 17, None, None),  # the window's edge a key before a tile's: the loops' bounds
    (1, 2, 50, 133, 16, 16, 16, True, 20, None, None),  # the same with seq_q != seq_k
    (2, 2, 150, 150, 32, 32, 32, False, None, (1, 40, 32, 77), None),  # documents, not causal; one of length 1
    (2, 2, 150, 150, 32, 32, 16, True, None, (60, 1, 89), None),  # documents, causal inside them
    (1, 2, 150, 150, 32, 48, 32, True, 20, (50, 100), None),  # a window inside documents
    (2, 2, 129, 129, 32, 64, 32, False, None, None, 1.0),  # soft-capping
    (1, 2, 100, 300, 32, 64, 64, True, None, None, 2.0),
    (1, 2, 150, 150, 32, 32, 32, True, 30, (70, 16, 64), 1.0),  # all three
]
MASK_BACKWARD_CASES = [
    (2, 2, 129, 129, 32, 32, 16, True, 40, None, None),
    (1, 2, 100, 300, 32, 64, 64, True, 70, None, None),
    (1, 2, 96, 96, 16, 16, 16, True, 17, None, None),
    (1, 2, 50, 133, 16, 16, 16, True, 20, None, None),
    (2, 2, 150, 150, 32, 32, 16, True, None, (60, 1, 89), None),
    (2, 2, 150, 150, 32, 32, 32, False, None, (1, 40, 32, 77), None),
    (2, 2, 129, 129, 32, 64, 32, False, None, None, 1.0),
    (1, 2, 150, 150, 32, 32, 32, True, 30, (70, 16, 64), 1.0),
]
# The skip checks (their sizes: checks/task3/cases.py's skip_sizes). Each side runs MASK_SKIP_RUNS times a request
# (forward, backward), so that the masked side takes about 10 ticks of the CPU clock (/proc counts in 10 ms) on the
# machines we tried, not 1 or 2.
MASK_SKIP_RUNS = {False: 6, True: 3}
SKIP_LIMIT = 0.6  # of the unmasked side's CPU time


def documents_text(lengths) -> str:
    """The documents' lengths as a case's name says them: a run of three or more of one length once, 1 (x10)+150."""
    runs = [(n, len(list(same))) for n, same in itertools.groupby(lengths)]
    return "+".join(f"{n} (x{count})" if count > 2 else "+".join([str(n)] * count) for n, count in runs)


def mask_text(shape) -> str:
    b, h, sq, sk, d, br, bc, causal, window_left, lengths, softcap = shape
    text = f"batch {b} heads {h} seq {sq}x{sk} head_dim {d} tiles {br}x{bc}" + " causal" * causal
    if window_left is not None:
        text += f" window {window_left}"
    if lengths is not None:
        text += f" documents {documents_text(lengths)}"
    if softcap is not None:
        text += f" softcap {softcap:g}"
    return text


def mask_arguments(shape) -> tuple[bool, dict]:
    """causal, and the masks as flash_attention's keyword arguments (cu_seqlens from the documents' lengths)."""
    *_, causal, window_left, lengths, softcap = shape
    masks = {}
    if window_left is not None:
        masks["window_left"] = window_left
    if lengths is not None:
        masks["cu_seqlens"] = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    if softcap is not None:
        masks["softcap"] = softcap
    return causal, masks


def check_masked_values(worker, case):
    """Steps 9-11: out and lse of a masked case against float64, with the mistake a failure matches named."""
    q, k, v = inputs(case.shape, case.seed)
    causal, masks = mask_arguments(case.shape)
    on = lambda t: t.to(case.device)  # noqa: E731
    result = worker.call("flash", on(q), on(k), on(v), causal, *case.shape[5:7], True, masks)
    plain = worker.call("flash", on(q), on(k), on(v), causal, *case.shape[5:7], False, masks)
    if not (isinstance(result, tuple) and len(result) == 2):
        return False, "with return_lse=True, flash_attention must return (out, lse)", {}
    out, lse = result
    ref_out, ref_lse = attention_float64(q, k, v, causal, **float64_masks(masks))
    checked = compare(out, ref_out, atol=ATOL, rtol=RTOL, name="out", device=case.device)
    if not checked.passed:
        return diagnose_masked(checked, out, q, k, v, causal, atol=ATOL, rtol=RTOL, **float64_masks(masks))
    if not isinstance(plain, torch.Tensor):
        return False, f"without return_lse, flash_attention must return the output tensor, got {type(plain).__name__}", {}
    checked_plain = compare(plain, ref_out, atol=ATOL, rtol=RTOL, name="out without return_lse", device=case.device)
    if not checked_plain.passed:
        return checked_plain
    checked_lse = compare(lse, ref_lse, atol=ATOL, rtol=RTOL, name="lse", device=case.device)
    if not checked_lse.passed:
        checked_lse.message += " (the output is right: the log-sum-exp, README, Task 3, step 5, with the masks)"
        return checked_lse
    checked.message = f"out {checked.message}; lse {checked_lse.message}"
    return checked


def check_masked_backward(worker, case):
    """Step 12: dq, dk, dv of a masked case through flash_attention_trainable against float64 autograd."""
    q, k, v = inputs(case.shape, case.seed)
    d_out = random_tensor(q.shape, case.seed + 3)
    causal, masks = mask_arguments(case.shape)
    wrong, result = backward_call(worker, case, q, k, v, d_out, causal, case.shape[5:7], masks, "steps 6 and 12")
    if wrong:
        return False, wrong, {}
    out, *grads = result
    ref = float64_masks(masks)
    checked = compare(out, attention_float64(q, k, v, causal, **ref)[0], atol=ATOL, rtol=RTOL, name="out",
                      device=case.device)
    if not checked.passed:
        return False, (f"{checked.message} (flash_attention_trainable's forward pass with the masks: pass them on to "
                       f"flash_attention, README, Task 3, steps 6 and 12)"), {}
    messages = []
    expected = attention_gradients(q, k, v, d_out, causal, **ref)
    for name, got, want in zip(("dq", "dk", "dv"), grads, expected):
        checked = compare(got, want, atol=ATOL, rtol=RTOL, name=name, device=case.device)
        if not checked.passed:
            return False, diagnose_masked_gradient(checked.message, name, got, q, k, v, d_out, causal, atol=ATOL,
                                                   rtol=RTOL, **ref), {}
        messages.append(f"{name} {checked.message}")
    return True, "; ".join(messages), {}


def check_masks_skip_tiles(worker, seed, what: str, backward: bool = False, sizes: SkipSizes = SkipSizes()):
    """The tiles a window or the documents hide are skipped (steps 9-10, 12 in the backward pass): the CPU time
    of the masked run against the same run without that mask, as the causal-skip check measures it."""
    if what == "window":
        causal, masks, step, against = True, {"window_left": sizes.window}, 9, "causal's"
        name = f"a window of {sizes.window} keys"
    else:
        causal, masks, step, against = False, {"cu_seqlens": sizes.cu_seqlens}, 10, "no mask's"
        lengths = sorted(set(sizes.documents))
        name = (f"{len(sizes.documents)} documents of {lengths[0]}" if len(lengths) == 1 else
                f"{len(sizes.documents)} documents of {lengths[0]}-{lengths[-1]}") + " positions"
    visited = tiles_visited(sizes.seq, causal, masks.get("window_left"), masks.get("cu_seqlens"))
    all_of_them, runs = tiles_visited(sizes.seq, causal), MASK_SKIP_RUNS[backward]

    timed = []  # every request's runs and what it returned: checked below, or a skip could be faked

    def cpu_seconds(masked):
        chosen = masks if masked else {}
        request = timed_runs(seed + 1000 * len(timed), runs, sizes.seq, backward, causal, chosen)
        worker.call("stage_runs", request)
        before = worker.cpu_seconds()
        if backward:
            got = worker.call("flash_backward_one_thread", causal, SKIP_TILE, SKIP_TILE, chosen or None,
                              timeout=BACKWARD_CALL_TIMEOUT_S)
        else:
            got = worker.call("flash_one_thread", causal, SKIP_TILE, SKIP_TILE, chosen or None)
        timed.append((masked, causal, chosen, request, got))
        return worker.cpu_seconds() - before

    ratio, with_mask, without = causal_cpu_ratio(cpu_seconds)
    wrong = timed_wrong(timed, backward, seed, {True: f"with the {what}", False: f"without the {what}"})
    if wrong:
        return False, (f"the timed {'backward passes' if backward else 'runs'}: {wrong} (README, Task 3, step "
                       f"{12 if backward else step})"), {}
    if backward:  # the timed calls were watched: autograd over the tiles the mask leaves would be fast too
        passed, said, _ = autograd_wrong(worker.call("autograd_seen"))
        if not passed:
            return False, said.replace("steps 7-8", "steps 7-8 and 12"), {}
    message = (f"{'backward passes' if backward else 'runs'} with {name} took {ratio:.0%} of {against} CPU time "
               f"({with_mask:.2f} s vs {without:.2f} s for {runs}; {visited} of {all_of_them} tiles is "
               f"{visited / all_of_them:.0%}; {SKIP_LIMIT:.0%} or less passes)")
    if ratio > SKIP_LIMIT:
        hidden = "query" if backward else "key"
        return False, (f"{message}: the {hidden} tiles the {what} {'hides' if what == 'window' else 'hide'} are "
                       f"computed and masked, not skipped (README, Task 3, step {12 if backward else step})"), {}
    return True, message, {f"{'backward_' if backward else ''}{what}_cpu_fraction": ratio}


def run_masks(report, worker, args, backward_passed: bool) -> None:
    """The optional masks (steps 9-11), once the forward pass passes everything; in the backward pass (step 12)
    once the backward part and the masks' values pass too."""
    report.begin_part("masks beyond causal: a sliding window, packed documents, soft-capping", MASK_STEPS,
                      optional=True)
    before = len(report.cases)
    for case in cli.cases(3, "masks", MASK_CASES, args.hidden, mask_text, devices=cli.devices(), causal=(False,)):
        report.run(f"masks: {case.name}", lambda: check_masked_values(worker, case))
        if report.process_died_since(before, "the masks part"):
            report.end_part("masks")
            return
    values_passed = not report.stopped and all(c.passed for c in report.cases[before:])
    if values_passed:
        run_skip_checks(report, worker, args, backward=False)
    report.end_part("masks")
    if args.masks and not args.backward:
        report.note("the masks in the backward pass (step 12): python -m task3.test --masks --backward")
        return
    if not (values_passed and backward_passed):  # the gradients need right values; a tile not skipped is no matter
        report.note("the masks in the backward pass (step 12) are checked once the masks' values and the backward "
                    "part pass")
        return
    report.begin_part("masks in the backward pass", MASK_BACKWARD_STEPS, optional=True)
    before = len(report.cases)
    for case in cli.cases(3, "masks_backward", MASK_BACKWARD_CASES, args.hidden, mask_text, devices=cli.devices(),
                          causal=(False,)):
        report.run(f"masks backward: {case.name}", lambda: check_masked_backward(worker, case))
        if report.process_died_since(before, "the masks in the backward pass"):
            report.end_part("masks backward")
            return
    if not report.stopped and all(c.passed for c in report.cases[before:]):
        run_skip_checks(report, worker, args, backward=True)
    report.end_part("masks backward")


def run_skip_checks(report, worker, args, backward: bool) -> None:
    """The window's and the documents' tiles skipped, and each mask done tile by tile (the rule's memory case)."""
    part = "masks backward" if backward else "masks"
    for what, seed in (("window", 995), ("documents", 994)):
        said = "the window skips the tiles it hides" if what == "window" else "the documents skip the tiles they hide"
        seed = cli.seed(seed - 10 * backward, args.hidden)
        report.run(f"{part}: {said}",
                   lambda: check_masks_skip_tiles(worker, seed, what, backward, skip_sizes(seed, args.hidden)))
    if not report.stopped:
        check_no_full_matrix(report, args, cli.seed(992 - 10 * backward, args.hidden), backward=backward, masks=True)
