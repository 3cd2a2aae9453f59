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

import math

import torch

from common import impl

from harness import cli, gpu_share, points, sanitize
from harness.diagnose import kernel_constants
from harness.checks import random_tensor
from harness.records import Report
from harness.attention_math import attention_float64
from checks.task4 import measure, measure_backward
from checks.task4.backward import (backward_part, backward_text, check_backward_errors, check_training,
                                   training_name)
from checks.task4.backward_half import (BACKWARD_HALF_PASS_NAME, PART_STEPS as BACKWARD_HALF_STEPS,
                                        backward_half_sanitizer_calls, backward_half_step_of, optional_backward_half)
from checks.task4.forward import attention_part, check_errors, grouped_text, make_inputs, shape_text
from checks.task4.half import check_half_errors, half_part, half_text
from checks.task4.hopper import hopper_part, is_hopper
from checks.task4.backward_masks import (BACKWARD_MASKS_PASS_NAME, backward_masks_part,
                                         backward_masks_sanitizer_calls)
from checks.task4.masks import (HOPPER_MASKS_PASS_NAME, MASKS_PASS_NAME, hopper_masks_part, masks_part,
                                masks_sanitizer_calls, run_masks_benchmarks)


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


def hopper_sanitizer_calls(hidden: cli.Hidden | None) -> list[sanitize.Call]:
    """The Hopper kernel's pass (steps 17-22): one and two panels, tile edges, a padded head_dim, the ring of stages
    reused, padding and groups, bf16 and fp16 in turn, causal and not."""
    calls = []
    shapes = [(1, 2, 2, 129, 129, 64, None, True), (1, 1, 1, 100, 300, 128, None, True),
              (1, 2, 1, 257, 513, 80, None, True), (2, 4, 2, 30, 140, 96, (0, 130), True),
              (1, 1, 1, 40, 40, 33, None, True), (1, 2, 1, 200, 450, 64, None, False),
              (1, 1, 1, 150, 70, 128, None, False)]
    for i, (*shape, causal) in enumerate(shapes):
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        q, k, v = (t.to(dtype) for t in make_inputs(shape, cli.seed(sum(shape[3:6]) + 7 * i, hidden)))
        extra = () if shape[6] is None else (torch.tensor(shape[6], dtype=torch.int32),)
        calls.append(sanitize.Call(f"Hopper {str(dtype)[6:]} {half_text(shape)}{' causal' if causal else ''}",
                                   "forward_hopper",
                                   (q, k, v, torch.empty_like(q), causal, 1 / math.sqrt(shape[5]), *extra),
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
            out, lse = (t.float() for t in attention_float64(q, k, v, causal, 1 / math.sqrt(d)))
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
            "flash_attention_hopper_kernel": "Task 4, steps 17-22 (optional)",
            "delta_kernel": "Task 4, step 13 (optional)",
            "flash_attention_dkdv_kernel": "Task 4, steps 14-15 (optional)",
            "flash_attention_dq_kernel": "Task 4, step 16 (optional)"}.get(kernel)


HALF_PASS_NAME = f"{sanitize.PASS_NAME}, the bf16/fp16 kernel (optional)"
BACKWARD_PASS_NAME = f"{sanitize.PASS_NAME}, the backward kernels (optional)"
HOPPER_PASS_NAME = f"{sanitize.PASS_NAME}, the Hopper kernel (optional)"
HOPPER_ONLY = "the Hopper part (steps 17-22) runs on compute capability 9.0 only (H100, H200): not run on this GPU"


def say_not_hopper(report) -> None:
    report.note(f"{HOPPER_ONLY} ({'.'.join(map(str, torch.cuda.get_device_capability()))})")


def optional_backward(report, worker, args, passes: list) -> bool:
    """Steps 12-16 (optional): the checks, then bad input while its sanitizer pass runs (added to `passes`); every
    case optional, so nothing here moves a point. Whether the checks passed (its training check and benchmarks
    follow the sanitizer passes)."""
    if not backward_part(report, worker, args.hidden,
                         kernel_constants("task4/kernels/attention_backward.cu", args.student_dir, args.solution)):
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
                                                                  "and Hopper kernels against SDPA, and the "
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
    if not half_part(report, worker, args.hidden,
                     kernel_constants("task4/kernels/attention_half.cu", args.student_dir, args.solution)):
        return False
    passes.append(sanitize.start(report, 4, args, half_sanitizer_calls(args.hidden), step_of, HALF_PASS_NAME,
                                 kind="optional", part="half"))
    report.run("bad input to the bf16/fp16 kernel raises clear errors (the given binding)",
               lambda: check_half_errors(worker), kind="optional")
    return True


def optional_hopper(report, worker, args, passes: list) -> bool:
    """Steps 17-22 (optional), on compute capability 9.0: the Hopper kernel's checks, then bad input while its
    sanitizer pass runs (added to `passes`). Whether the checks passed."""
    if not is_hopper():
        say_not_hopper(report)
        return False
    if not hopper_part(report, worker, args.hidden,
                       kernel_constants("task4/kernels/attention_hopper.cu", args.student_dir, args.solution)):
        return False
    passes.append(sanitize.start(report, 4, args, hopper_sanitizer_calls(args.hidden), step_of, HOPPER_PASS_NAME,
                                 kind="optional", part="hopper"))
    report.run("bad input to the Hopper kernel raises clear errors (the given binding)",
               lambda: check_half_errors(worker, "forward_hopper"), kind="optional")
    return True


def hopper_masks_step_of(kernel: str):
    return "Task 4, step 25 (optional)" if kernel == "flash_attention_hopper_kernel" else step_of(kernel)


def optional_hopper_masks(report, worker, args, passes: list, hopper_chosen: bool, hopper_passed: bool) -> bool:
    """Step 25 (optional), on compute capability 9.0, once the Hopper part passed where it ran (hopper_chosen): the
    masks through the Hopper kernel, then its sanitizer pass (added to `passes`). Whether the checks passed."""
    if not is_hopper():
        if not hopper_chosen:  # else the Hopper part said so
            say_not_hopper(report)
        return False
    if hopper_chosen and not hopper_passed:
        report.note("the Hopper kernel's masks (step 25) were not checked: they run on the Hopper part's kernel, which "
                    "did not pass (steps 17-22 first)")
        return False
    if not hopper_masks_part(report, worker, args.hidden, args.grading):
        return False
    passes.append(sanitize.start(report, 4, args, masks_sanitizer_calls(args.hidden, torch.bfloat16),
                                 hopper_masks_step_of, HOPPER_MASKS_PASS_NAME, kind="optional", part="hopper masks"))
    return True


def backward_masks_step_of(kernel: str):
    return "Task 4, step 26 (optional)" if "dkdv" in kernel or "dq_kernel" in kernel else step_of(kernel)


def optional_backward_masks(report, worker, args, passes: list, waiting_for: list[str]) -> bool:
    """Step 26 (optional), once the parts it builds on passed where they ran (waiting_for: those that did not: the
    backward part's kernels, the masks' forward): the backward part with the masks, then its sanitizer pass (added to
    `passes`). Whether the checks passed."""
    if waiting_for:
        report.note(f"the backward part's masks (step 26) were not checked: they run on {' and '.join(waiting_for)}, "
                    "which did not pass")
        return False
    if not backward_masks_part(report, worker, args.hidden):
        return False
    passes.append(sanitize.start(report, 4, args, backward_masks_sanitizer_calls(args.hidden), backward_masks_step_of,
                                 BACKWARD_MASKS_PASS_NAME, kind="optional", part="backward masks"))
    return True


def optional_benchmarks(report, worker, timed: list[tuple[str, object]]) -> None:
    """The optional parts' benchmarks (a student's own run: the grader leaves them out), each part's in a fresh
    process of its own, after the float32 benchmarks."""
    for name, run in timed:
        report.heading(f"{name} benchmarks (optional)")
        with gpu_share.alone_in_a_fresh_process(worker):
            run()


# The README steps of each part (step 7 is the float32 kernel's tuning; step 12, in kernels/attention.cu, the backward's)
PART_STEPS = {"attention": (1, 2, 3, 4, 5, 6, 7), "half": (8, 9, 10, 11), "backward": (12, 13, 14, 15, 16),
              "hopper": (17, 18, 19, 20, 21, 22), "masks": (23, 24), "hopper_masks": (25,),
              "backward_masks": (26,), "backward_half": BACKWARD_HALF_STEPS}


def main(argv=None) -> int:
    parser = cli.parser(4, __doc__.splitlines()[2])
    parser.add_argument("--sweep", action="store_true", help="time over seq 128..8192, write task4-sweep.csv")
    parser.add_argument("--attention", action="store_true", help="test only README steps 1-7 (the float32 kernel)")
    parser.add_argument("--half", action="store_true", help="test only README steps 8-11 (optional: bf16/fp16)")
    parser.add_argument("--backward", action="store_true",
                        help="test only README steps 12-16 (optional: the backward pass)")
    parser.add_argument("--hopper", action="store_true",
                        help="test only README steps 17-22 (optional: the Hopper kernel, compute capability 9.0)")
    parser.add_argument("--masks", action="store_true",
                        help="test only README steps 23-24 (optional: a sliding window, documents, soft-capping)")
    parser.add_argument("--hopper-masks", action="store_true",
                        help="test only README step 25 (optional: the masks in the Hopper kernel, on 9.0)")
    parser.add_argument("--backward-masks", action="store_true",
                        help="test only README step 26 (optional: the masks in the backward kernels)")
    parser.add_argument("--backward-half", action="store_true",
                        help="test only README steps 27-30 (optional: the backward pass in bf16/fp16)")
    args = parser.parse_args(argv)
    chosen = [p for p in PART_STEPS if getattr(args, p)] or list(PART_STEPS)
    report = Report(4, args.solution, "fused FlashAttention kernel", args.student_dir)
    if len(chosen) < len(PART_STEPS):  # without a GPU, the TODO lines listed are the asked parts' alone
        report.asked_steps = {step for part in chosen for step in PART_STEPS[part]}
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
            if "hopper" in chosen and is_hopper():
                sanitize.add_to_report(report, 4, args, hopper_sanitizer_calls(args.hidden), step_of,
                                       HOPPER_PASS_NAME, kind="optional")
            elif "hopper" in chosen:
                say_not_hopper(report)
            if "masks" in chosen:
                sanitize.add_to_report(report, 4, args, masks_sanitizer_calls(args.hidden), step_of, MASKS_PASS_NAME,
                                       kind="optional", part="masks")
            if "backward_masks" in chosen:
                sanitize.add_to_report(report, 4, args, backward_masks_sanitizer_calls(args.hidden),
                                       backward_masks_step_of, BACKWARD_MASKS_PASS_NAME, kind="optional",
                                       part="backward masks")
            if "hopper_masks" in chosen and is_hopper():
                sanitize.add_to_report(report, 4, args, masks_sanitizer_calls(args.hidden, torch.bfloat16),
                                       hopper_masks_step_of, HOPPER_MASKS_PASS_NAME, kind="optional",
                                       part="hopper masks")
            if "backward_half" in chosen:
                sanitize.add_to_report(report, 4, args, backward_half_sanitizer_calls(args.hidden),
                                       backward_half_step_of(step_of), BACKWARD_HALF_PASS_NAME, kind="optional",
                                       part="backward half")
            return report.finish(args.json)
        # Every check first, the timings last: in a grading, the other tasks' tests check side by side with this
        # one, and a timed part waits until none of them is in the middle of its checks (harness/gpu_share.py). Each
        # part's sanitizer pass runs beside the checks that follow it, in processes of its own.
        passes = []
        if "attention" in chosen:
            float_part(report, worker, args, passes)
        half_passed = backward_passed = hopper_passed = masks_passed = backward_half_passed = False
        if "half" in chosen and not report.stopped:
            # In a process of its own (the next call starts one): a crash or a hang in the optional kernel costs
            # its own part, never the float32 checks or the sanitizer pass before it, or the benchmarks after it.
            worker.stop_until_next_call()
            half_passed = optional_half(report, worker, args, passes)
        if "backward" in chosen and not report.stopped:
            worker.stop_until_next_call()  # the same: a process of its own
            backward_passed = optional_backward(report, worker, args, passes)
        if "hopper" in chosen and not report.stopped:
            worker.stop_until_next_call()  # the same: a process of its own
            hopper_passed = optional_hopper(report, worker, args, passes)
            worker.stop_until_next_call()  # and the checks after it (training) in a fresh one: a trap ends a context
        if "masks" in chosen and not report.stopped:
            worker.stop_until_next_call()  # a process of its own, as the parts above
            masks_passed = masks_part(report, worker, args.hidden)
            if masks_passed:
                passes.append(sanitize.start(report, 4, args, masks_sanitizer_calls(args.hidden), step_of,
                                             MASKS_PASS_NAME, kind="optional", part="masks"))
        if "hopper_masks" in chosen and not report.stopped:
            worker.stop_until_next_call()  # the same
            optional_hopper_masks(report, worker, args, passes, "hopper" in chosen, hopper_passed)
        if "backward_masks" in chosen and not report.stopped:
            worker.stop_until_next_call()  # the same
            waiting_for = [what for part, passed, what in (("backward", backward_passed, "the backward kernels"),
                                                           ("masks", masks_passed, "the masks' forward kernel"))
                           if part in chosen and not passed]
            optional_backward_masks(report, worker, args, passes, waiting_for)
        if "backward_half" in chosen and not report.stopped:
            worker.stop_until_next_call()  # the same
            backward_half_passed = optional_backward_half(report, worker, args, passes, step_of)
        trained = [(dtype, written) for passed, dtype, written in ((backward_passed, torch.float32, args.backward),
                                                                   (backward_half_passed, torch.bfloat16,
                                                                    args.backward_half)) if passed]
        training = lambda dtype, written: report.run(  # noqa: E731
            training_name(dtype), lambda: check_training(worker, args.hidden, written, not args.grading, dtype),
            kind="optional")
        for dtype, written in trained if args.grading else ():
            training(dtype, written)  # untimed: a check like the others, beside the sanitizer passes
        if any(passes):
            report.heading("compute-sanitizer")
        for started in passes:
            sanitize.finish(report, started)
        for dtype, written in () if args.grading else trained:
            training(dtype, written)  # timed: once the sanitizer passes have ended
        if "attention" in chosen:
            float_benchmarks(report, worker, args)
        timed = []  # the optional parts' benchmarks, for a student's own run: once the part's checks pass
        if half_passed and not args.grading and not report.stopped:
            timed.append(("bf16/fp16", lambda: measure.run_half_benchmarks(report, worker, measure.half_cases())))
        if backward_passed and not args.grading and not report.stopped:
            timed.append(("backward", lambda: measure_backward.run_backward_benchmarks(
                report, worker, measure_backward.backward_cases())))
        if hopper_passed and not args.grading and not report.stopped:
            timed.append(("Hopper", lambda: measure.run_half_benchmarks(report, worker, measure.half_cases("Hopper "),
                                                                        "forward_hopper")))
        if masks_passed and not args.grading and not report.stopped:
            timed.append(("masks", lambda: run_masks_benchmarks(report, worker)))
        if backward_half_passed and not args.grading and not report.stopped:
            timed.append(("bf16 backward", lambda: measure_backward.run_backward_benchmarks(
                report, worker, measure_backward.backward_cases(half=True), torch.bfloat16)))
        optional_benchmarks(report, worker, timed)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(4, args.solution, args.student_dir, report.attention_ops), kind="rule")
    if "attention" not in chosen:  # the status below counts required checks only, and this run has none
        optional = [c for c in report.cases if c.kind == "optional"]
        flags = " ".join(f"--{part.replace('_', '-')}" for part in chosen)
        report.note(f"{flags} tests the optional part{'s' if len(chosen) > 1 else ''} alone: "
                    f"{sum(c.passed for c in optional)} of {len(optional)} checks passed")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
