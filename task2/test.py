"""python -m task2.test [--softmax | --gemm | --attention] [--solution] [--json PATH]

Checks Task 2's CUDA kernels against float64 PyTorch on fresh random inputs, with
outputs pre-filled with NaN and sizes that are not multiples of the tiles:
- softmax (steps 1-2): 1 to 4097 columns, large values and -inf entries;
- GEMM_NT and GEMM_NN (steps 3-4): m, n, k from 1 to 300;
- attention chained from them (step 5): causal and not, seq_q != seq_k, head_dim 17 to 128;
each part alone with its flag; then times the attention against naive PyTorch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from common import cli
from common.checks import compare, exact_float32, poisoned, random_tensor
from common.records import Report
from common.reference import attention_reference, naive_attention
from common.timing import benchmark
from task2 import attention as mod

SOFTMAX_CASES = [(1, 1), (3, 7), (5, 1000), (2, 4097), (64, 128)]  # (rows, cols)
GEMM_CASES = [(1, 1, 1, 1), (2, 17, 33, 5), (3, 127, 129, 64), (1, 300, 200, 129), (2, 64, 64, 64)]  # (batch, m, n, k)
ATTENTION_CASES = [(1, 1, 1, 1, 16), (2, 2, 65, 65, 64), (1, 2, 100, 300, 80), (1, 2, 200, 200, 128),
                   (1, 2, 1, 257, 17)]  # (batch, heads, seq_q, seq_k, head_dim)
ATOL, RTOL = 2e-5, 1e-4
PARTS = {  # name: README steps
    "softmax": (1, 2),
    "gemm": (3, 4),
    "attention": (5,),
}


def check_softmax(ext, shape, seed):
    rows, cols = shape
    x = random_tensor(shape, seed, "cuda") * 20  # large values: without the max subtracted, exp overflows
    if cols > 3:
        x[:, ::3] = -math.inf  # masked entries, as after the causal mask
    out = poisoned(shape, "cuda")
    ext.softmax(x, out)
    torch.cuda.synchronize()
    return compare(out, torch.softmax(x.double(), dim=-1), atol=ATOL, rtol=RTOL, poisoned=True)


def check_gemm(ext, which, shape, seed):
    batch, m, n, k = shape
    a = random_tensor((batch, m, k), seed, "cuda")
    b = random_tensor((batch, n, k) if which == "nt" else (batch, k, n), seed + 1, "cuda")
    c = poisoned((batch, m, n), "cuda")
    getattr(ext, f"gemm_{which}")(a, b, c)
    torch.cuda.synchronize()
    with exact_float32():
        expected = a.double() @ (b.double().transpose(1, 2) if which == "nt" else b.double())
    # a sum of k products: rounding grows like sqrt(k)
    return compare(c, expected, atol=ATOL * math.sqrt(k), rtol=RTOL, poisoned=True)


def check_attention(ext, shape, causal, seed):
    b, h, sq, sk, d = shape
    q, k, v = (random_tensor((b, h, s, d), seed + i, "cuda") for i, s in enumerate((sq, sk, sk)))
    out = poisoned(q.shape, "cuda")
    scale = 1.0 / math.sqrt(d)
    ext.attention(q, k, v, out, causal, scale)
    torch.cuda.synchronize()
    return compare(out, attention_reference(q, k, v, causal, scale)[0], atol=ATOL, rtol=RTOL, poisoned=True)


def check_errors(ext):
    x = torch.randn(4, 8, device="cuda")
    a = torch.randn(2, 5, 3, device="cuda")
    wide = torch.randn(1, 1, 4, 256, device="cuda")
    bad = [
        ("softmax of a CPU tensor", lambda: ext.softmax(x.cpu(), x), "CUDA"),
        ("softmax of float64", lambda: ext.softmax(x.double(), x), "float32"),
        ("softmax of a non-contiguous tensor", lambda: ext.softmax(x.T, x.T.contiguous()), "contiguous"),
        ("gemm_nt with mismatched k", lambda: ext.gemm_nt(a, torch.randn(2, 4, 7, device="cuda"),
                                                           torch.empty(2, 5, 4, device="cuda")), "disagree"),
        ("gemm_nn with half", lambda: ext.gemm_nn(a.half(), a, a), "float32"),
        ("attention with head_dim 256", lambda: ext.attention(wide, wide, wide, torch.empty_like(wide), False, 0.1),
         "head_dim must be at most 128"),
        ("attention writing over its input", lambda: ext.attention(wide, wide, wide, wide, False, 0.1),
         "must not share memory"),
    ]
    for what, call, words in bad:
        try:
            call()
        except RuntimeError as err:
            if words not in str(err):
                return False, f"{what}: the error does not say {words!r}: {err}", {}
            continue
        return False, f"{what}: no error was raised", {}
    return True, f"{len(bad)} kinds of bad input rejected with clear errors", {}


def time_attention(solution):
    b, h, s, d = 4, 32, 1024, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda") for _ in range(3))
    out = torch.empty_like(q)
    metrics, parts = {}, []
    for causal in (False, True):
        tag = "causal" if causal else "full"
        with torch.no_grad(), exact_float32():
            ours = benchmark(lambda: mod.attention(q, k, v, causal, out=out, solution=solution), "cuda")
            naive = benchmark(lambda: naive_attention(q, k, v, causal), "cuda")
            sdpa = benchmark(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), "cuda")
        metrics |= {f"{tag}_ms": ours.median_ms, f"{tag}_naive_ms": naive.median_ms, f"{tag}_sdpa_ms": sdpa.median_ms}
        parts.append(f"{tag}: {ours.median_ms:.2f} ms, naive PyTorch {naive.median_ms:.2f} ms, "
                     f"SDPA {sdpa.median_ms:.2f} ms")
    return True, f"batch {b} heads {h} seq {s} head_dim {d}: " + "; ".join(parts), metrics


def main(argv=None) -> int:
    parser = cli.parser(2, __doc__.splitlines()[2])
    for part, steps in PARTS.items():
        parser.add_argument(f"--{part}", action="store_true", help=f"test only README steps {steps}")
    args = parser.parse_args(argv)
    chosen = [p for p in PARTS if getattr(args, p)] or list(PARTS)
    report = Report(2, args.solution, "softmax and tiled GEMM kernels")
    ext = cli.cuda_extension(report, lambda: mod.extension(args.solution))
    if ext is None:
        return report.finish(args.json)

    extra = cli.extra_cases(2, args.hidden)
    for part in chosen:
        report.begin_part(part, PARTS[part])
        if part == "softmax":
            for i, shape in enumerate(SOFTMAX_CASES + [c for c in extra if len(c) == 2]):
                seed = cli.seed(10 * i, args.hidden)
                report.run(f"softmax {shape[0]}x{shape[1]}", lambda: check_softmax(ext, shape, seed))
        elif part == "gemm":
            for which in ("nt", "nn"):
                for i, shape in enumerate(GEMM_CASES + [c for c in extra if len(c) == 4]):
                    seed = cli.seed(10 * i, args.hidden)
                    report.run(f"gemm_{which} batch {shape[0]} m {shape[1]} n {shape[2]} k {shape[3]}",
                               lambda: check_gemm(ext, which, shape, seed))
        else:
            for i, shape in enumerate(ATTENTION_CASES + [c for c in extra if len(c) == 5]):
                for causal in (False, True):
                    if causal and shape[2] > shape[3]:
                        continue
                    seed = cli.seed(100 * i + 10 * causal, args.hidden)
                    name = "attention batch {} heads {} seq {}x{} head_dim {}".format(*shape)
                    report.run(name + (" causal" if causal else ""),
                               lambda: check_attention(ext, shape, causal, seed))
        report.end_part(part)
    report.run("bad input raises clear errors", lambda: check_errors(ext))
    if "attention" in chosen and all(c.passed for c in report.cases):
        report.run("time against PyTorch", lambda: time_attention(args.solution), kind="benchmark")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
