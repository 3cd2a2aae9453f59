"""Instructors' bench: python3 notes/tools/task4_bench.py [--cases quick|all] [--ncu] KERNEL.cu ...

Builds each kernel file (a variant of task 4's, with its launcher) with the task's binding, in
parallel, checks it against float64 on odd shapes (outputs poisoned with NaN), then times every
file and SDPA on the same inputs in one run (harness.timing.benchmark: CUDA events, L2 flushed,
median). notes/task4-performance.md was measured with it (it lived in .dev/ as bench4.py then).
"""

import argparse
import concurrent.futures
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CHECKS = [(1, 2, 129, 129, 128, False), (1, 2, 129, 129, 128, True), (2, 3, 70, 200, 72, True),
          (1, 2, 257, 300, 128, False), (2, 1, 1, 65, 32, False), (1, 2, 200, 200, 80, True),
          (1, 1, 333, 333, 96, False), (1, 2, 130, 130, 64, True), (1, 1, 600, 611, 128, True),
          (1, 1, 5, 133, 17, False)]
CASES = {"quick": [(8, 32, 4096, 128), (4, 32, 2048, 64)],
         "all": [(8, 32, 4096, 128), (16, 32, 1024, 128), (4, 32, 2048, 64), (32, 32, 512, 80)]}


def build(path: Path):
    from torch.utils.cpp_extension import load

    name = "v_" + path.stem.replace("-", "_")
    folder = REPO / "build" / "dev" / name
    folder.mkdir(parents=True, exist_ok=True)
    return load(name=name, sources=[str(REPO / "task4" / "binding.cpp"), str(path)],
                extra_include_paths=[str(REPO)], extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3", "-lineinfo", "-Xptxas=-v"], build_directory=str(folder), verbose=False)


def build_in_child(path: Path) -> str:
    done = subprocess.run([sys.executable, __file__, "--build-one", str(path)], capture_output=True, text=True)
    regs = [line.strip() for line in (done.stdout + done.stderr).splitlines() if "registers" in line or "spill" in line]
    return f"{path.name}: rc {done.returncode} " + (done.stderr[-3000:] if done.returncode else " | ".join(regs[-6:]))


def reference(q, k, v, causal, scale):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~mask, -math.inf)
    return torch.softmax(s, -1) @ v.double()


def check(mod) -> str:
    worst = 0.0
    for b, h, sq, sk, d, causal in CHECKS:
        g = torch.Generator(device="cuda").manual_seed(sq * 7 + d)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=g) for n in (sq, sk, sk))
        out = torch.full_like(q, math.nan)
        scale = 1 / math.sqrt(d)
        mod.forward(q, k, v, out, causal, scale)
        torch.cuda.synchronize()
        err = (out.double() - reference(q, k, v, causal, scale)).abs().max().item()
        if not err < 1e-4:
            return f"WRONG at {(b, h, sq, sk, d, causal)}: max error {err}"
        worst = max(worst, err)
    return f"ok (max error {worst:.1e})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("variants", nargs="*", type=Path)
    parser.add_argument("--build-one", type=Path)
    parser.add_argument("--cases", default="all", choices=CASES)
    parser.add_argument("--ncu", action="store_true", help="one launch of the first variant at the first case")
    args = parser.parse_args()
    if args.build_one:
        build(args.build_one)
        return
    with concurrent.futures.ThreadPoolExecutor(len(args.variants)) as pool:
        for line in pool.map(build_in_child, args.variants):
            print(line, flush=True)
    mods = {p.stem: build(p) for p in args.variants}
    if args.ncu:
        b, h, s, d = CASES[args.cases][0]
        q, k, v = (torch.randn(b, h, s, d, device="cuda") for _ in range(3))
        out = torch.empty_like(q)
        next(iter(mods.values())).forward(q, k, v, out, False, 1 / math.sqrt(d))
        torch.cuda.synchronize()
        return
    for name, mod in list(mods.items()):
        verdict = check(mod)
        print(f"{name}: {verdict}", flush=True)
        if verdict.startswith("WRONG"):
            del mods[name]
    from harness.timing import benchmark
    from harness.attention_math import attention_flops

    torch.backends.cuda.matmul.allow_tf32 = False
    for b, h, s, d in CASES[args.cases]:
        q, k, v = (torch.randn(b, h, s, d, device="cuda") for _ in range(3))
        out = torch.empty_like(q)
        scale = 1 / math.sqrt(d)
        for causal in (False, True):
            flops = attention_flops(b, h, s, s, d, causal)
            t_sdpa = benchmark(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
                               "cuda", max_seconds=4).median_ms
            row = [f"B{b} H{h} S{s} D{d}{' causal' if causal else ''}: SDPA {t_sdpa:.2f} ms"]
            for name, mod in mods.items():
                t = benchmark(lambda: mod.forward(q, k, v, out, causal, scale), "cuda", max_seconds=4).median_ms
                row.append(f"{name} {t:.2f} ms {flops / t / 1e9:.1f} TF/s {t_sdpa / t:.3f}x")
            print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
