"""Experiment (issue 58, notes/backward16-hopper-plan.md; device only, Hopper): hopper_bwd.cu's 16-bit backward on
wgmma and TMA, checked against float64 autograd on the same 16-bit inputs (given the float64 reference's out rounded
to the type and its L, as the kit's check does), then timed beside SDPA's flash backward (FlashAttention-2's) in one
run, and beside the kit's mma.sync reference (steps 27-30) when it is built.

    PYTHONPATH=. python notes/tools/backward16/hopper_bwd.py [check] [time] [--cases N]

check: bwd16.py's cases and allowance (2x SDPA's own 16-bit error on the same inputs, or half a unit in the last
place); outputs poisoned with NaN first. time: CUDA events, median of 20 after 3 warm-ups; TFLOP/s as 2.5x the
forward's FLOPs."""
import argparse
import math
import os
import sys
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
from bwd16 import (CHECKS, TIMED, TYPES, case_inputs, judge, median_ms, reference, sdpa_flash_ms,  # noqa: E402
                   sdpa_grads)


def build():
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
    return load(name="hopper_bwd_experiment", sources=[str(HERE / "hopper_bwd_binding.cpp"),
                                                        str(HERE / "hopper_bwd.cu")],
                extra_include_paths=[str(REPO / "common/csrc"), str(HERE)],
                extra_cuda_cflags=["-O3", "-std=c++17", "-Xptxas", "-v"], extra_ldflags=["-lcuda"], verbose=False)


def check(ext, cases=None):
    failures = 0
    for case in CHECKS[:cases]:
        b, h, kvh, sq, sk, d, causal, magnitude = case
        for name, dtype in TYPES.items():
            q, k, v, dout, scale = case_inputs(case, name, dtype)
            dq64, dk64, dv64, out64, lse64 = reference(q, k, v, dout, causal, scale)
            dq, dk, dv = (torch.full_like(t, math.nan) for t in (q, k, v))
            ext.backward(q, k, v, out64.to(dtype), dout, lse64.float(), dq, dk, dv, causal, scale)
            torch.cuda.synchronize()
            failed, words = judge((dq, dk, dv), (dq64, dk64, dv64), sdpa_grads(q, k, v, dout, causal, scale), dtype,
                                  2e-5)  # the kit's least allowance (a gradient of zeros from float32 sums)
            failures += failed
            print(f"{name} b{b} h{h}/{kvh} sq{sq} sk{sk} d{d}{' causal' if causal else ''} x{magnitude}: "
                  + "; ".join(words), flush=True)
    print(f"checks: {failures} failed", flush=True)
    return failures


def out_and_lse(q, k, v, causal, scale):
    """The forward's out (in q's type) and L (float32), a sequence at a time in float32."""
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
    for b in range(q.shape[0]):
        s = (q[b].float() @ k[b].float().transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
        lse[b] = torch.logsumexp(s, -1)
        out[b] = (torch.softmax(s, -1) @ v[b].float()).to(q.dtype)
    return out, lse


def time_cases(ext):
    sys.path.insert(0, str(REPO))
    try:
        from task4.attention import extension
        kit = extension(solution=True)  # the kit's mma.sync backward (steps 27-30), for the same inputs
    except Exception as err:  # noqa: BLE001  (reported, the experiment goes on)
        print(f"the kit's reference not built: {err}", flush=True)
        kit = None
    for b, h, s, d in TIMED:
        for causal in (False, True):
            q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = d ** -0.5
            flash = sdpa_flash_ms(q, k, v, dout, causal, scale)
            out, lse = out_and_lse(q, k, v, causal, scale)
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            mine = median_ms(lambda: ext.backward(q, k, v, out, dout, lse, dq, dk, dv, causal, scale))
            flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
            said = (f"bf16 b{b} h{h} s{s} d{d}{' causal' if causal else ''}: wgmma {mine:.3f} ms "
                    f"({flops / mine / 1e9:.0f} TFLOP/s), SDPA flash {flash:.3f} ms: {flash / mine:.2f}x its speed")
            if kit is not None:
                ms = median_ms(lambda: kit.backward(q, k, v, out, dout, lse, dq, dk, dv, causal, scale, None, None,
                                                    None))
                said += f"; the kit's mma.sync {ms:.3f} ms ({flash / ms:.2f}x)"
            print(said, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", nargs="*", default=["check", "time"])
    parser.add_argument("--cases", type=int, help="check the first N cases only (a compute-sanitizer run)")
    args = parser.parse_args()
    ext = build()
    failed = check(ext, args.cases) if "check" in args.what else 0
    if "time" in args.what and not failed:
        time_cases(ext)
