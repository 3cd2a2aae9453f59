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
--sweep replaces those benchmarks (once the checks pass) by a sweep of the kernel, naive
PyTorch and SDPA over seq 128..8192 into task4-sweep.csv (and a plot when matplotlib
is installed). With --solution (the reference tested) the benchmarks add head_dim 64 and 80,
and the reference's tensor-core kernels (task4/solution/tensor_cores) are timed beside SDPA.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from common import impl

from harness import cli, gpu_share, points, sanitize
from harness.diagnose import diagnose, kernel_constants, tile_schedules
from harness.checks import compare, exact_float32, expect_errors, guard_damage, guarded_input, guarded_output, random_tensor
from common.layer import mha_weights
from harness.records import Report
from harness.reference import attention_reference, causal_mask, expand_kv_heads
from task4 import measure
from task4.measure import ATOL, RTOL

# (batch, heads, seq_q, seq_k, head_dim)
CASES = [
    (1, 1, 1, 1, 32),
    (2, 3, 1, 257, 64),
    (2, 2, 63, 63, 64),
    (1, 2, 64, 64, 64),
    (2, 2, 65, 65, 64),
    (1, 3, 127, 127, 128),
    (1, 2, 128, 128, 128),
    (1, 2, 129, 129, 128),
    (2, 2, 100, 300, 80),
    (1, 2, 300, 520, 64),  # causal: query tiles past the first, each shifted by seq_k - seq_q
    (1, 2, 300, 300, 80),
    (1, 2, 200, 200, 72),
    (1, 2, 150, 150, 88),
    (1, 2, 131, 131, 85),
    (2, 1, 96, 160, 99),
    (1, 1, 77, 77, 17),
    (1, 2, 1000, 1000, 32),
]

# Grouped-query attention and padding: (batch, heads, kv_heads, seq_q, seq_k, head_dim, key_start).
# kv_heads divides heads (query head h reads key/value head h // (heads // kv_heads)); key_start is
# each sequence's first valid key (left padding) or None. Group sizes 1, 2, 3, 4, 8 and MQA, head
# counts that are not powers of two; padding that leaves whole tiles, one key, or no key at all.
GROUPED_CASES = [
    (2, 8, 4, 65, 65, 64, None),
    (1, 8, 2, 129, 129, 128, None),
    (1, 16, 2, 100, 300, 80, None),
    (2, 6, 1, 70, 70, 64, None),  # MQA
    (1, 12, 3, 131, 131, 85, None),
    (1, 12, 4, 64, 64, 72, None),
    (4, 4, 2, 40, 40, 64, (0, 35, 12, 39)),  # prompts of 40, 5, 28 and 1 tokens
    (2, 4, 4, 150, 150, 96, (0, 129)),
    (3, 4, 1, 30, 200, 64, (0, 180, 199)),  # seq_q < seq_k: some queries are padding, one is not
    (2, 2, 2, 9, 9, 32, (9, 0)),  # the first sequence is padding throughout: all zeros
]


def shape_text(shape) -> str:
    return "batch {} heads {} seq {}x{} head_dim {}".format(*shape)


def grouped_text(shape) -> str:
    b, h, kvh, sq, sk, d, starts = shape
    group = "MQA" if kvh == 1 else f"{kvh} kv heads"
    padding = f" key_start {','.join(map(str, starts))}" if starts is not None else ""
    return f"batch {b} heads {h} ({group}) seq {sq}x{sk} head_dim {d}{padding}"


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


def step_of(kernel: str):
    return "Task 4, steps 1-6" if kernel == "flash_attention_kernel" else None



def main(argv=None) -> int:
    parser = cli.parser(4, __doc__.splitlines()[2])
    parser.add_argument("--sweep", action="store_true", help="time over seq 128..8192, write task4-sweep.csv")
    args = parser.parse_args(argv)
    report = Report(4, args.solution, "fused FlashAttention kernel", args.student_dir)
    with cli.worker(report, 4, args) as worker:
        if worker is None:
            return report.finish(args.json)
        if args.sanitize:
            sanitize.add_to_report(report, 4, args, sanitizer_calls(args.hidden), step_of)
            return report.finish(args.json)
        constants = kernel_constants("task4/kernels/attention.cu", args.student_dir, args.solution)
        for case in cli.cases(4, "attention", CASES, args.hidden, shape_text, causal_ok=lambda s: s[2] <= s[3]):
            report.run(case.name, lambda: check_case(worker, case.shape, case.causal, case.seed, constants=constants))
        for case in cli.cases(4, "grouped", GROUPED_CASES, args.hidden, grouped_text, causal_ok=lambda s: s[3] <= s[4]):
            report.run(case.name, lambda: check_case(worker, case.shape, case.causal, case.seed, constants=constants))
        seed = cli.seed(7, args.hidden)
        report.run("scale 0.3 and large scores (q x 4)",
                   lambda: check_case(worker, (2, 2, 150, 150, 64), True, seed, scale=0.3, magnitude=4.0,
                                      constants=constants))
        for hidden, heads, seq in ((256, 4, 100), (4096, 32, 65)):
            for causal in (False, True):
                report.run(f"layer hidden {hidden} heads {heads} seq {seq}{' causal' if causal else ''} "
                           "vs nn.MultiheadAttention",
                           lambda: check_layer(worker, hidden, heads, seq, causal, cli.seed(11, args.hidden)))
        if any(c.passed and c.kind == "check" for c in report.cases):
            sanitize.add_to_report(report, 4, args, sanitizer_calls(args.hidden), step_of)
        report.run("bad input raises clear errors (the given binding)", lambda: check_errors(worker), kind="given")

        if report.stopped or not all(c.passed for c in report.cases):
            report.note("benchmarks skipped until every check passes")
        elif args.sweep:
            from task4.sweep import sweep

            with gpu_share.alone(worker):
                sweep(report, worker, with_tensor_cores=args.solution)
        else:
            if args.grading:
                batch, seq = measure.HANDOUT_CASES[-1]
                report.note(cli.GRADING_LEAVES_OUT.format(task=4, what=f"the layer at batch {batch} seq {seq} "
                                                                      "against nn.MultiheadAttention"))
            with gpu_share.alone(worker):
                measure.run_benchmarks(report, worker, measure.benchmark_cases(args.solution),
                                       measure.layer_cases(args.grading), with_tensor_cores=args.solution)
            said = None if args.solution or args.grading else points.estimate_note(4, report.cases)
            if said:
                report.note(said)
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(4, args.solution, args.student_dir, report.attention_ops), kind="rule")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
