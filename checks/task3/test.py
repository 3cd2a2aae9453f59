"""python -m task3.test [--solution] [--json PATH]

Checks Task 3's FlashAttention-2 (PyTorch) on the CPU (and on CUDA when present):
- output and log-sum-exp against a float64 reference, for several tile sizes,
  sequence lengths that are not multiples of the tiles, seq_q != seq_k, causal and not;
- that the full (seq_q x seq_k) score matrix is never built: a case whose full matrix is
  larger than the memory your code may use (a rule: the task scores 0 without it);
- that causal runs skip the tiles after the diagonal (they take about half the CPU time);
then times it next to Task 1's naive attention on the same inputs.
Optional (steps 6-8, reported, not scored unless the rubric says so): the backward pass, dq, dk and dv
through flash_attention_trainable against float64 autograd, what its forward pass saves, the full
matrix never built and the causal tiles skipped there too.
Optional (steps 9-12, the same): the masks beyond causal, a sliding window, packed documents and soft-capped
scores, against float64 with the tiles they hide skipped (CPU time), and in the backward pass (step 12).
Your code runs in a worker process (task3/entry.py); this file only checks what it returns.
"""

from __future__ import annotations

import random
import time

import torch

from common import impl

from harness import cli, gpu_share
from harness.checks import compare, random_tensor
from harness.diagnose import diagnose
from harness.outcome import Kind
from harness.records import Report
from harness.attention_math import attention_gradients, attention_float64
from harness.timing import summarize

from checks.task3.cases import (ATOL, BACKWARD_CALL_TIMEOUT_S, RTOL, SKIP_CHECK_RUNS, SKIP_TILE, autograd_wrong,
                                backward_call, causal_cpu_ratio, check_no_full_matrix, inputs, not_the_forwards,
                                skip_sizes, tiles_visited, timed_outputs_wrong, timed_runs, timed_wrong)
from checks.task3.masks import run_masks

# (batch, heads, seq_q, seq_k, head_dim, block_rows, block_cols)
CASES = [
    (1, 1, 1, 1, 16, 64, 64),
    (2, 3, 127, 127, 32, 16, 16),
    (2, 3, 127, 127, 32, 32, 64),
    (2, 2, 129, 129, 64, 64, 32),
    (1, 2, 100, 300, 64, 64, 64),
    (1, 2, 1, 257, 64, 64, 64),
    (1, 2, 200, 200, 80, 128, 128),
    (1, 1, 70, 70, 8, 1, 7),
]
FORWARD_STEPS, BACKWARD_STEPS = (1, 2, 3, 4, 5), (6, 7, 8)
# The optional backward pass (steps 6-8), same layout. Its gradients are held to the forward's tolerance: the reference's
# worst error on these cases is 3e-6 (dv, seq 129 causal, |dv| up to 6), PyTorch's own float32 autograd through naive
# attention 2.5e-6 on the same inputs: a wrong step is off by far more.
BACKWARD_CASES = [
    (1, 1, 1, 1, 16, 64, 64),
    (2, 3, 127, 127, 32, 16, 16),
    (2, 2, 129, 129, 64, 64, 32),
    (1, 2, 100, 300, 64, 64, 64),
    (1, 2, 1, 257, 64, 64, 64),
    (1, 1, 70, 70, 8, 1, 7),
]
TIMING_SHAPES = {"cpu": (2, 8, 512, 64), "cuda": (4, 32, 1024, 128)}  # (batch, heads, seq, head_dim)


def shape_text(shape) -> str:
    return "batch {} heads {} seq {}x{} head_dim {} tiles {}x{}".format(*shape)


def check_values(worker, case):
    q, k, v = inputs(case.shape, case.seed)
    tiles = case.shape[5:]
    on = lambda t: t.to(case.device)  # noqa: E731
    result = worker.call("flash", on(q), on(k), on(v), case.causal, *tiles, True)
    plain = worker.call("flash", on(q), on(k), on(v), case.causal, *tiles, False)
    if not (isinstance(result, tuple) and len(result) == 2):
        return False, "with return_lse=True, flash_attention must return (out, lse)", {}
    if not isinstance(plain, torch.Tensor):
        return False, f"without return_lse, flash_attention must return the output tensor, got {type(plain).__name__}", {}
    out, lse = result
    ref_out, ref_lse = attention_float64(q, k, v, case.causal)
    checked = compare(out, ref_out, atol=ATOL, rtol=RTOL, name="out", device=case.device)
    if not checked.passed:
        return diagnose(3, checked, out, q, k, v, case.causal, atol=ATOL, rtol=RTOL, tiles=tiles)
    checked_lse = compare(lse, ref_lse, atol=ATOL, rtol=RTOL, name="lse (the log-sum-exp m_i + log(l_i))",
                          device=case.device)
    if not checked_lse.passed:
        return diagnose(3, checked_lse, lse, q, k, v, case.causal, atol=ATOL, rtol=RTOL, tiles=tiles, of="lse")
    checked.message = f"out {checked.message}; lse {checked_lse.message}"
    return checked


def check_backward(worker, case):
    """dq, dk, dv of flash_attention_trainable against float64 autograd; what its forward pass kept for the backward."""
    q, k, v = inputs(case.shape, case.seed)
    d_out = random_tensor(q.shape, case.seed + 3)
    wrong, result = backward_call(worker, case, q, k, v, d_out, case.causal, case.shape[5:])
    if wrong:
        return False, wrong, {}
    out, *grads = result
    checked = compare(out, attention_float64(q, k, v, case.causal)[0], atol=ATOL, rtol=RTOL, name="out",
                      device=case.device)
    if not checked.passed:
        return checked.passed, f"{checked.message} (flash_attention_trainable's forward pass: README, Task 3, step 6)", {}
    messages = []
    for name, got, expected in zip(("dq", "dk", "dv"), grads, attention_gradients(q, k, v, d_out, case.causal)):
        checked = compare(got, expected, atol=ATOL, rtol=RTOL, name=name, device=case.device)
        if not checked.passed:
            return False, f"{checked.message} (README, Task 3, steps 7-8)", {}
        messages.append(f"{name} {checked.message}")
    return True, "; ".join(messages) + "; saved q, k, v, out and the log-sum-exp", {}


CAUSAL_SKIP_LIMIT = 0.8  # of the full run's CPU time: all the tiles and a mask take 100% or more


def check_backward_causal_skips_tiles(worker, seed, seq: int = 2048):
    """The backward pass skips the query tiles a causal key tile never reaches (step 7): the worker's CPU time."""
    timed = []  # every request's runs and what it returned: checked below, or a skip could be faked

    def cpu_seconds(causal):
        runs = timed_runs(seed + 1000 * len(timed), SKIP_CHECK_RUNS, seq, True, causal, {})
        worker.call("stage_runs", runs)
        before = worker.cpu_seconds()
        got = worker.call("flash_backward_one_thread", causal, SKIP_TILE, SKIP_TILE, timeout=BACKWARD_CALL_TIMEOUT_S)
        timed.append((causal, causal, {}, runs, got))
        return worker.cpu_seconds() - before

    ratio, causal, full = causal_cpu_ratio(cpu_seconds)
    wrong = timed_wrong(timed, True, seed, {True: "causal", False: "not causal"})
    if wrong:
        return False, f"the timed backward passes: {wrong} (README, Task 3, steps 7-8)", {}
    message = (f"causal backward passes took {ratio:.0%} of the CPU time of full ones ({causal:.2f} s vs {full:.2f} s "
               f"for {SKIP_CHECK_RUNS}; {tiles_share(seq)}; {CAUSAL_SKIP_LIMIT:.0%} or less passes)")
    if ratio > CAUSAL_SKIP_LIMIT:
        return False, message + ": the query tiles before a key tile's diagonal are computed, not skipped " \
                                "(README, Task 3, step 7)", {}
    return True, message, {"backward_causal_cpu_fraction": ratio}


def tiles_share(seq: int) -> str:
    visited, all_of_them = tiles_visited(seq, True), tiles_visited(seq, False)
    return f"{visited} of {all_of_them} tiles is {visited / all_of_them:.0%}"


def check_causal_skips_tiles(worker, seed, seq: int = 2048):
    """With a causal mask the tiles past the diagonal are skipped (step 2): measured as the worker's CPU time."""
    timed = []  # every request's runs and what it returned: checked below, or a skip could be faked

    def cpu_seconds(causal):
        runs = timed_runs(seed + 1000 * len(timed), SKIP_CHECK_RUNS, seq, False, causal, {})
        worker.call("stage_runs", runs)
        before = worker.cpu_seconds()
        timed.append((causal, causal, {}, runs, worker.call("flash_one_thread", causal, SKIP_TILE, SKIP_TILE)))
        return worker.cpu_seconds() - before

    ratio, causal, full = causal_cpu_ratio(cpu_seconds)
    wrong = timed_wrong(timed, False, seed, {True: "causal", False: "not causal"})
    if wrong:
        return False, f"the timed runs: {wrong} (README, Task 3, steps 2-5)", {}
    # 16 x 16 tiles at seq 2048: the causal loop visits 136 of them, 53% of the work; all 256 and a mask is >= 100%.
    message = (f"causal run took {ratio:.0%} of the CPU time of the full one ({causal:.2f} s vs {full:.2f} s for "
               f"{SKIP_CHECK_RUNS} runs; {tiles_share(seq)}; {CAUSAL_SKIP_LIMIT:.0%} or less passes)")
    if ratio > CAUSAL_SKIP_LIMIT:
        return False, message + ": the tiles after the diagonal are computed, not skipped (README, Task 3, step 2)", {}
    return True, message, {"causal_cpu_fraction": ratio}


def time_against_task1(report, worker, device, solution):
    """A benchmark beside Task 1's attention; Task 1's state (not done, broken) only ever adds a note."""
    batch, heads, seq, d = TIMING_SHAPES[device]
    q, k, v = (t.to(device) for t in inputs((batch, heads, seq, seq, d), 7))
    metrics, parts = {}, []
    try:
        for causal in (False, True):
            tag = "causal" if causal else "full"
            t_flash, t_naive = (time_requests(worker, which, q, k, v, causal) for which in ("flash", "task1"))
            metrics |= t_flash.metrics(f"{tag}_flash_") | t_naive.metrics(f"{tag}_task1_")
            metrics[f"{tag}_flash_over_task1"] = t_flash.median_ms / t_naive.median_ms
            parts.append(f"{tag}: flash {t_flash.median_ms:.2f} ms, task 1 {t_naive.median_ms:.2f} ms "
                         f"({t_flash.median_ms / t_naive.median_ms:.2f}x the time)")
    except Exception as err:  # noqa: BLE001  task 1 not done or broken: a note, not a failure of task 3
        report.note(f"{device}: timing against task 1 skipped: {err}")
        return
    shape = f"batch {batch} heads {heads} seq {seq} head_dim {d}"
    report.add(f"{device} time against task 1", True, f"{shape}, task 1 from {impl.label(solution)}: " + "; ".join(parts),
               metrics, kind="benchmark")


def time_requests(worker, which, q, k, v, causal, reps=5, per_request=3):
    """Host clock around requests that each run the function `per_request` times and wait for the GPU."""
    worker.call("repeat", 1, which, q, k, v, causal)  # warm-up
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        worker.call("repeat", per_request, which, q, k, v, causal)
        samples.append((time.perf_counter() - start) * 1e3 / per_request)
    return summarize(samples)


def run_backward(report, worker, args) -> bool:
    """The optional part: steps 6-8, once the forward pass passes everything. Returns whether it all passed."""
    report.begin_part("the backward pass (Algorithm 2), through flash_attention_trainable", BACKWARD_STEPS, optional=True)
    before = len(report.cases)
    for case in cli.cases(3, "backward", BACKWARD_CASES, args.hidden, shape_text, devices=cli.devices(),
                          causal_ok=lambda shape: shape[2] <= shape[3]):
        report.run(f"backward: {case.name}", lambda: check_backward(worker, case))
        if report.process_died_since(before, "the backward part"):  # a crash or a hang: the rest would wait as long
            return report.end_part("backward")
    seed = cli.seed(997, args.hidden)
    report.run("backward: causal skips the query tiles before the diagonal",
               lambda: check_backward_causal_skips_tiles(worker, seed, skip_sizes(seed, args.hidden).seq))
    if not report.stopped:
        check_no_full_matrix(report, args, cli.seed(996, args.hidden), backward=True)
        report.run("backward: its own gradients, not autograd's",
                   lambda: check_no_autograd_inside(worker, cli.seed(993, args.hidden), args.student_dir,
                                                    args.solution))
    return report.end_part("backward")


AUTOGRAD_INSIDE = ("enable_grad", "set_grad_enabled", "autograd.grad", ".backward(", "torch.func", "functorch",
                   "saved_tensors_hooks", "_execution_engine", "_ImperativeEngine", "run_backward",
                   "task3.entry", "autograd_seen")  # the last two: the run-time count's own names


def check_no_autograd_inside(worker, seed, student_dir, solution):
    """Steps 6-8 compute dq, dk and dv themselves: autograd run inside them (over small chunks of rows, say) would
    pass the values and the memory case without Algorithm 2. A scan of the file's code, as the own-work rule's, that
    names the line; then one backward pass given an out and lse that are not the forward pass's (Algorithm 2 uses
    them, autograd through the forward pass computed again cannot); then what autograd did in the backward passes
    (task3/entry.py counts it in its process: a deterrent)."""
    from common.impl import source_of

    text = source_of("task3/attention.py", student_dir, solution).read_text(errors="replace")
    found = [f"line {n}: {name}" for n, line in enumerate(text.splitlines(), 1)
             for name in AUTOGRAD_INSIDE if name in line.split("#")[0]]
    if found:
        return False, (f"task3/attention.py runs autograd ({', '.join(found[:3])}): the backward pass computes dq, "
                       f"dk and dv itself, tile by tile (README, Task 3, steps 7-8)"), {}
    q, k, v = inputs((1, 2, 130, 130, 32), seed)
    run = (q, k, v, *not_the_forwards(*(t.float() for t in attention_float64(q, k, v, True)), seed + 4),
           random_tensor(q.shape, seed + 3))
    worker.call("stage_runs", [run])
    got = worker.call("flash_backward_one_thread", True, 64, 32, timeout=BACKWARD_CALL_TIMEOUT_S)
    wrong = timed_outputs_wrong(got, [run], causal=True, masks={}, backward=True, tiles=None,
                                pick=random.Random(seed))
    if wrong:
        return False, (f"given an out and lse that are not the forward pass's, {wrong}: the backward pass computes "
                       f"dq, dk and dv from them itself (README, Task 3, steps 7-8), not by autograd through the "
                       f"forward pass computed again"), {}
    return autograd_wrong(worker.call("autograd_seen"))


def main(argv=None) -> int:
    parser = cli.parser(3, __doc__.splitlines()[2])
    parser.add_argument("--backward", action="store_true",
                        help="the optional backward pass (steps 6-8) alone, after the forward pass's values")
    parser.add_argument("--masks", action="store_true",
                        help="the optional masks beyond causal (steps 9-11; with --backward, 12 too) alone, after "
                             "the forward pass's values")
    args = parser.parse_args(argv)
    report = Report(3, args.solution, "FlashAttention-2 in PyTorch", args.student_dir)
    with cli.worker(report, 3, args, cuda=torch.cuda.is_available()) as worker:
        if worker is None:
            return report.finish(args.json)
        # The forward pass's steps: a missing one is named among 1-5, never the optional part's 6-8 below it.
        report.part_steps = FORWARD_STEPS
        for case in cli.cases(3, "attention", CASES, args.hidden, shape_text, devices=cli.devices(),
                              causal_ok=lambda shape: shape[2] <= shape[3]):
            report.run(case.name, lambda: check_values(worker, case))
        alone = args.backward or args.masks  # one optional part (or both) after the forward pass's values
        if not alone:
            run_forward_rest(report, worker, args)
        forward_passed = not report.stopped and all(c.passed for c in report.cases)
        backward_passed = False
        if forward_passed and (args.backward or not args.masks):
            backward_passed = run_backward(report, worker, args)
        if forward_passed and (args.masks or not args.backward):
            run_masks(report, worker, args, backward_passed)
        if not forward_passed and alone:
            report.note("the optional parts are checked once the forward pass's checks pass")
        if not alone:  # last: the grading's other tests do their checks meanwhile (harness/gpu_share.py)
            run_timing(report, worker, args)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(3, args.solution, args.student_dir, report.attention_ops), kind="rule")
    return report.finish(args.json)


def run_forward_rest(report, worker, args) -> None:
    """After the values: the causal skip and the rule's memory case."""
    seed = cli.seed(998, args.hidden)
    report.run("causal skips the tiles after the diagonal",
               lambda: check_causal_skips_tiles(worker, seed, skip_sizes(seed, args.hidden).seq))
    if not report.stopped:
        check_no_full_matrix(report, args, cli.seed(999, args.hidden))


def run_timing(report, worker, args) -> None:
    """The timing beside task 1, once every check of the forward pass passes (a student's own run: no point depends
    on it, so a grading leaves it out)."""
    if not report.stopped and all(c.passed for c in report.cases if c.kind != Kind.OPTIONAL):
        report.heading("timing")
        if cli.grading_leaves_out(report, args, 3, "the CPU and CUDA time against task 1"):
            return
        with gpu_share.alone(worker):
            for device in cli.devices():
                time_against_task1(report, worker, device, args.solution)


if __name__ == "__main__":
    raise SystemExit(main())
