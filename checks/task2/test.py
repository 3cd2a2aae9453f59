"""python -m task2.test [--softmax | --gemm | --attention] [--solution] [--json PATH]

Checks Task 2's CUDA kernels against float64 PyTorch on fresh random inputs, with
outputs pre-filled with NaN and sizes that are not multiples of the tiles:
- softmax (steps 1-2): 1 to 4097 columns, large values and -inf entries;
- GEMM_NT and GEMM_NN (steps 3-4): m, n, k from 1 to 300;
- attention chained from them (step 5): causal and not, seq_q != seq_k, head_dim 17 to 128;
each part alone with its flag; then times the attention against naive PyTorch.
Your kernels run in a worker process (task2/entry.py) on GPU memory this process owns;
this file only checks what they wrote.
"""

from __future__ import annotations

import math

import torch

from harness import cli, gpu_share, sanitize
from harness.diagnose import diagnose
from harness.checks import (compare, exact_float32, expect_errors, guard_damage, guarded_input, guarded_output,
                           random_tensor)
from harness.records import Report
from harness.attention_math import attention_float64
from checks.task2.measure import time_attention

SOFTMAX_CASES = [(1, 1), (3, 7), (5, 1000), (2, 4097), (64, 128)]  # (rows, cols)
# (batch, m, n, k); a batch over 65535 is launched in slices (a grid holds 65535 blocks along z)
GEMM_CASES = [(1, 1, 1, 1), (2, 17, 33, 5), (3, 127, 129, 64), (1, 300, 200, 129), (2, 64, 64, 64), (70000, 2, 3, 5)]
ATTENTION_CASES = [(1, 1, 1, 1, 16), (2, 2, 65, 65, 64), (1, 2, 100, 300, 80), (1, 2, 200, 200, 128),
                   (1, 2, 1, 257, 17), (1000, 70, 2, 3, 8)]  # (batch, heads, seq_q, seq_k, head_dim)
ATOL, RTOL = 2e-5, 1e-4
PARTS = {  # name: README steps
    "softmax": (1, 2),
    "gemm": (3, 4),
    "attention": (5,),
}


def check_softmax(worker, case):
    rows, cols = case.shape
    # large values: most rows reach past 88.7, where float32's exp overflows, so a softmax that does not
    # subtract the row's maximum first shows (softmax itself does not change when every value moves up)
    x = random_tensor(case.shape, case.seed) * 20 + 80
    if cols > 3:
        x[:, ::3] = -math.inf  # masked entries, as after the causal mask
    x_in, out = guarded_input("x", x), guarded_output("out", case.shape)
    worker.call("softmax", x_in.tensor, out.tensor)
    damage = guard_damage(x_in, out)
    if damage:
        return damage
    expected = torch.softmax(x.double(), dim=-1)
    result = compare(out.tensor, expected, atol=ATOL, rtol=RTOL, poisoned=True)
    return result if result.passed else diagnose_overflow(result, out.tensor.cpu().double(), expected, x)


EXP_OVERFLOWS = math.log(torch.finfo(torch.float32).max)  # 88.72: exp of more is inf in float32


def diagnose_overflow(result, got, expected, x):
    """A softmax whose wrong rows are those that reach past EXP_OVERFLOWS: exp(x) taken without the maximum."""
    wrong = ~((got - expected).abs() <= ATOL + RTOL * expected.abs()).all(dim=-1)  # NaN is wrong too
    overflows = x.amax(dim=-1) > EXP_OVERFLOWS
    if result.untouched or not wrong.any() or bool((wrong & ~overflows).any()):
        return result
    result.message = (f"looks like exp(x) without the row's maximum subtracted first: the wrong rows are the ones "
                      f"that reach past {EXP_OVERFLOWS:.1f}, where float32's exp overflows to inf: see README, Task 2, "
                      f"step 2. Wrong rows past it: {int(wrong.sum())}; {result.message}")
    return result


def check_gemm(worker, which, case):
    batch, m, n, k = case.shape
    a = random_tensor((batch, m, k), case.seed)
    b = random_tensor((batch, n, k) if which == "nt" else (batch, k, n), case.seed + 1)
    a_in, b_in, c = guarded_input("a", a), guarded_input("b", b), guarded_output("c", (batch, m, n))
    worker.call("gemm", which, a_in.tensor, b_in.tensor, c.tensor)
    with exact_float32():
        expected = a.double() @ (b.double().transpose(1, 2) if which == "nt" else b.double())
    # a sum of k products: rounding grows like sqrt(k)
    return guard_damage(a_in, b_in, c) or compare(c.tensor, expected, atol=ATOL * math.sqrt(k), rtol=RTOL,
                                                  poisoned=True)


def check_attention(worker, case):
    b, h, sq, sk, d = case.shape
    q, k, v = (random_tensor((b, h, s, d), case.seed + i) for i, s in enumerate((sq, sk, sk)))
    inputs = [guarded_input(name, t) for name, t in zip("qkv", (q, k, v))]
    out = guarded_output("out", q.shape)
    scale = 1.0 / math.sqrt(d)
    worker.call("attention_forward", *(t.tensor for t in inputs), out.tensor, case.causal, scale)
    result = compare(out.tensor, attention_float64(q, k, v, case.causal, scale)[0], atol=ATOL, rtol=RTOL,
                     poisoned=True)
    return guard_damage(*inputs, out) or diagnose(2, result, out.tensor, q, k, v, case.causal, atol=ATOL, rtol=RTOL,
                                                  scale=scale)


def check_errors(worker):
    """The given binding's errors (not the student's work: reported, not scored)."""
    x = torch.randn(4, 8, device="cuda")
    a = torch.randn(2, 5, 3, device="cuda")
    wide = torch.randn(1, 1, 4, 256, device="cuda")
    bad = [
        ("softmax of a CPU tensor", ("softmax", x.cpu(), x), "CUDA"),
        ("softmax of float64", ("softmax", x.double(), x), "float32"),
        ("softmax of a non-contiguous tensor", ("softmax", x.T, x.T.contiguous()), "contiguous"),
        ("gemm_nt with mismatched k", ("gemm", "nt", a, torch.randn(2, 4, 7, device="cuda"),
                                       torch.empty(2, 5, 4, device="cuda")), "disagree"),
        ("gemm_nn with half", ("gemm", "nn", a.half(), a, a), "float32"),
        ("attention with head_dim 256", ("attention_forward", wide, wide, wide, torch.empty_like(wide), False, 0.1),
         "head_dim must be at most 128"),
        ("attention writing over its input", ("attention_forward", wide, wide, wide, wide, False, 0.1),
         "must not share memory"),
    ]
    return expect_errors(worker.call, bad)


KERNEL_STEPS = {"softmax_kernel": "Task 2, steps 1-2", "gemm_nt_kernel": "Task 2, step 3",
                "gemm_nn_kernel": "Task 2, step 4"}


def sanitizer_calls(hidden: cli.Hidden | None) -> list[sanitize.Call]:
    """Small cases with edges that are not multiples of the tiles, for compute-sanitizer."""
    calls = []
    for rows, cols in [(3, 7), (2, 1100)]:
        x = random_tensor((rows, cols), cli.seed(rows, hidden))
        calls.append(sanitize.Call(f"softmax {rows}x{cols}", "softmax", (x, torch.empty_like(x)), ("x", "out")))
    for batch, m, n, k in [(2, 67, 53, 45), (1, 33, 65, 70)]:
        a = random_tensor((batch, m, k), cli.seed(m, hidden))
        for which in ("nt", "nn"):
            b = random_tensor((batch, n, k) if which == "nt" else (batch, k, n), cli.seed(n, hidden))
            calls.append(sanitize.Call(f"gemm_{which} batch {batch} m {m} n {n} k {k}", "gemm",
                                       (which, a, b, torch.empty(batch, m, n)), ("a", "b", "c")))
    for causal in (False, True):
        q, k, v = (random_tensor((1, 2, s, 40), cli.seed(s + i, hidden)) for i, s in enumerate((33, 70, 70)))
        calls.append(sanitize.Call(f"attention seq 33x70{' causal' if causal else ''}", "attention_forward",
                                   (q, k, v, torch.empty_like(q), causal, 1 / math.sqrt(40)), ("q", "k", "v", "out")))
    return calls


def main(argv=None) -> int:
    parser = cli.parser(2, __doc__.splitlines()[2])
    for part, steps in PARTS.items():
        parser.add_argument(f"--{part}", action="store_true", help=f"test only README steps {steps}")
    args = parser.parse_args(argv)
    chosen = [p for p in PARTS if getattr(args, p)] or list(PARTS)
    report = Report(2, args.solution, "softmax and tiled GEMM kernels", args.student_dir)
    if len(chosen) < len(PARTS):  # without a GPU, the TODO lines listed are the asked parts' alone
        report.asked_steps = {step for part in chosen for step in PARTS[part]}
    with cli.worker(report, 2, args) as worker:
        if worker is None:
            return report.finish(args.json)
        formats = {"softmax": "softmax {}x{}", "gemm": "batch {} m {} n {} k {}",
                   "attention": "attention batch {} heads {} seq {}x{} head_dim {}"}
        public = {"softmax": SOFTMAX_CASES, "gemm": GEMM_CASES, "attention": ATTENTION_CASES}
        for part in [] if args.sanitize else chosen:
            report.begin_part(part, PARTS[part])
            masks = (False, True) if part == "attention" else (False,)
            for case in cli.cases(2, part, public[part], args.hidden, lambda s: formats[part].format(*s), causal=masks,
                                  causal_ok=lambda shape: shape[-3] <= shape[-2]):
                if part == "softmax":
                    report.run(case.name, lambda: check_softmax(worker, case))
                elif part == "gemm":
                    for which in ("nt", "nn"):
                        report.run(f"gemm_{which} {case.name}", lambda: check_gemm(worker, which, case))
                else:
                    report.run(case.name, lambda: check_attention(worker, case))
            report.end_part(part)
        if args.sanitize or any(c.passed and c.kind == "check" for c in report.cases):
            sanitize.add_to_report(report, 2, args, sanitizer_calls(args.hidden), KERNEL_STEPS.get)
        if args.sanitize:
            return report.finish(args.json)
        report.run("bad input raises clear errors (the given binding)", lambda: check_errors(worker), kind="given")
        if "attention" in chosen and all(c.passed for c in report.cases):
            with gpu_share.alone(worker):
                report.run("time against PyTorch", lambda: time_attention(worker), kind="benchmark")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
