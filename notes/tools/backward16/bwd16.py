"""Experiment (issue 58; device only): bwd16.cu's 16-bit backward and forward_lse.py's 16-bit forward with L (steps
23-26) built, the pair checked against float64 autograd on the same 16-bit inputs (the forward's out and L feed the
backward, as in training), then the backward timed beside SDPA's flash backward (FlashAttention-2's) in one run.

    PYTHONPATH=. python notes/tools/backward16/bwd16.py [check] [time] [--block-m 32|64]

check: each gradient within 2x SDPA's own 16-bit error on the same inputs against the same float64, or half a unit
in the last place of its largest value (the forward's rule, steps 8-11); outputs poisoned with NaN first.
time: CUDA events, median of 20 after 3 warm-ups; TFLOP/s as 2.5x the forward's FLOPs (FlashAttention's count)."""
import argparse
import math
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.cpp_extension import load

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CHECKS = [  # batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, magnitude
    (1, 2, 2, 128, 128, 64, False, 1), (2, 4, 2, 100, 300, 64, True, 1), (1, 2, 1, 257, 513, 128, False, 1),
    (1, 2, 1, 257, 513, 128, True, 1), (2, 3, 3, 1, 65, 128, False, 1), (1, 2, 2, 70, 70, 64, True, 1),
    (1, 4, 1, 200, 200, 128, True, 1), (1, 2, 2, 150, 150, 64, True, 25),  # 25: very negative (and large) scores
]
TIMED = [(4, 32, 2048, 64), (4, 32, 2048, 128), (2, 16, 4096, 64), (2, 16, 4096, 128)]


def build():
    import forward_lse

    half = forward_lse.write(Path("/tmp/backward16/attention_half_lse.cu"))
    return load(name="bwd16_experiment", sources=[str(HERE / "binding.cpp"), str(HERE / "bwd16.cu"), str(half)],
                extra_include_paths=[str(REPO / "common/csrc"), str(HERE)],
                extra_cuda_cflags=["-O3", "-std=c++17", "-Xptxas", "-v"], verbose=False)


def reference(q, k, v, dout, causal, scale):
    """float64 autograd on the 16-bit values: dq, dk, dv (grouped heads summed), out, lse."""
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    ke, ve = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    s = q64 @ ke.transpose(-1, -2) * scale
    if causal:
        seq_q, seq_k = q.shape[2], k.shape[2]
        future = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).triu(seq_k - seq_q + 1)
        s = s.masked_fill(future, -math.inf)
    lse = torch.logsumexp(s, -1)
    out = torch.softmax(s, -1) @ ve
    dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), dout.double())
    return dq, dk, dv, out.detach(), lse.detach()


def sdpa_grads(q, k, v, dout, causal, scale):
    """SDPA's own 16-bit backward on the same inputs (flash where it runs; a causal mask aligned to the end, which
    SDPA's is_causal is not when seq_q != seq_k, as an explicit mask: its efficient or math backend)."""
    group = q.shape[1] // k.shape[1]
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    seq_q, seq_k = q.shape[2], k.shape[2]
    mask = None
    if causal and seq_q != seq_k:
        mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril(seq_k - seq_q)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(qs, ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1),
                                             attn_mask=mask, is_causal=causal and mask is None, scale=scale)
    return torch.autograd.grad(out, (qs, ks, vs), dout)


def judge(grads, exact, theirs, dtype, least=0.0):
    """(how many of dq, dk, dv failed, a word on each): each within 2x SDPA's error against the same float64, or half
    a unit in the last place of its largest value, or `least`."""
    failures, words = 0, []
    for label, mine, want, sdpa in zip(("dq", "dk", "dv"), grads, exact, theirs):
        err = (mine.double() - want).abs().max().item()
        ulp = want.abs().max().item() * torch.finfo(dtype).eps / 2
        sdpa_err = (sdpa.double() - want).abs().max().item()
        ok = err <= max(2 * sdpa_err, ulp, least)  # NaN fails
        failures += not ok
        words.append(f"{label} {err:.1e} (SDPA {sdpa_err:.1e}) {'ok' if ok else 'FAIL'}")
    return failures, words


def case_inputs(case, name, dtype):
    """q, k, v, dout of a CHECKS case in `dtype` (named `name`), from a seed of the case, and the scale."""
    b, h, kvh, sq, sk, d, causal, magnitude = case
    gen = torch.Generator(device="cuda").manual_seed(hash(case) % 1000 + len(name))
    q = (torch.randn(b, h, sq, d, device="cuda", generator=gen) * magnitude).to(dtype)
    k, v = (torch.randn(b, kvh, sk, d, device="cuda", generator=gen).to(dtype) for _ in range(2))
    dout = torch.randn(b, h, sq, d, device="cuda", generator=gen).to(dtype)
    return q, k, v, dout, d ** -0.5


def check(ext, block_m):
    failures = 0
    for case in CHECKS:
        b, h, kvh, sq, sk, d, causal, magnitude = case
        for name, dtype in TYPES.items():
            q, k, v, dout, scale = case_inputs(case, name, dtype)
            dq64, dk64, dv64, out64, lse64 = reference(q, k, v, dout, causal, scale)
            out, lse = torch.full_like(q, math.nan), torch.full(q.shape[:3], math.nan, device="cuda")
            ext.forward_lse16(q, k, v, out, lse, causal, scale)
            dq, dk, dv = (torch.full_like(t, math.nan) for t in (q, k, v))
            ext.backward(q, k, v, out, dout, lse, dq, dk, dv, causal, scale, block_m)
            torch.cuda.synchronize()
            lse_err = (lse.double() - lse64).abs().max().item()  # reported: its allowance is for the device run to set
            failed, words = judge((dq, dk, dv), (dq64, dk64, dv64), sdpa_grads(q, k, v, dout, causal, scale), dtype)
            failures += failed
            print(f"{name} b{b} h{h}/{kvh} sq{sq} sk{sk} d{d}{' causal' if causal else ''} x{magnitude}: "
                  + "; ".join(words) + f"; L {lse_err:.1e}", flush=True)
    print(f"checks: {failures} failed", flush=True)
    return failures


def median_ms(fn, runs=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def sdpa_flash_ms(q, k, v, dout, causal, scale):
    """SDPA's flash backward (FlashAttention-2's) on these inputs: its median milliseconds, its forward run once."""
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale)
    return median_ms(lambda: torch.autograd.grad(out, (qs, ks, vs), dout, retain_graph=True))


def time_cases(ext, block_m):
    for b, h, s, d in TIMED:
        for causal in (False, True):
            q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = d ** -0.5
            flash = sdpa_flash_ms(q, k, v, dout, causal, scale)
            mine_out, lse = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
            ext.forward_lse16(q, k, v, mine_out, lse, causal, scale)  # L as the forward saves it
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            mine = median_ms(lambda: ext.backward(q, k, v, mine_out, dout, lse, dq, dk, dv,
                                                  causal, scale, block_m))
            flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
            print(f"bf16 b{b} h{h} s{s} d{d}{' causal' if causal else ''}: mine {mine:.3f} ms "
                  f"({flops / mine / 1e9:.0f} TFLOP/s), SDPA flash {flash:.3f} ms ({flops / flash / 1e9:.0f}): "
                  f"{flash / mine:.2f}x its speed", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", nargs="*", default=["check", "time"])
    parser.add_argument("--block-m", type=int, default=64)
    args = parser.parse_args()
    ext = build()
    failed = check(ext, args.block_m) if "check" in args.what else 0
    if "time" in args.what and not failed:
        time_cases(ext, args.block_m)
