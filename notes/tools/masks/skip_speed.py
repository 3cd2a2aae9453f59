"""Issue 61, item 3, on the GPU (device only): what the tiles the masks skip buy in task 4's float32 kernel (the
reference's steps 23-24), in one run: a window of 1024 keys at 16384 against causal (the goal: at least 6x faster),
documents of 512 against causal over the row (at least 10x), and FlexAttention beside with --flex (compiled, the same
masks). CUDA events after warm-up, the median of RUNS; every mask first checked against float64 on a short sequence.
--dtype bf16 (or fp16): the Hopper kernel's masks (step 25) instead, on an H100/H200, where the issue's FlexAttention
goal is at least 1.0x.
PYTHONPATH=. python notes/tools/masks/skip_speed.py [--heads 16] [--head-dim 128] [--seq 16384] [--flex]
    [--dtype bf16]"""
import argparse
import statistics

import torch

from harness.attention_math import attention_float64
from task4.attention import flash_attention

RUNS, WARMUP = 10, 3

parser = argparse.ArgumentParser()
parser.add_argument("--heads", type=int, default=16)
parser.add_argument("--head-dim", type=int, default=128)
parser.add_argument("--seq", type=int, default=16384)
parser.add_argument("--window", type=int, default=1024)
parser.add_argument("--document", type=int, default=512)
parser.add_argument("--flex", action="store_true")
parser.add_argument("--dtype", choices=("float32", "bf16", "fp16"), default="float32")
args = parser.parse_args()
dtype = {"float32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
# float32: the float32 kernel's error (1e-6 measured); 16 bits: a few units in the last place of outputs about 1
tolerance = 1e-4 if dtype == torch.float32 else 3e-2


def median_ms(fn) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# 1. right first: each mask and all three, with padding and grouped heads, against float64
torch.manual_seed(0)
q, k, v = (torch.randn(2, heads, 700, 64, device="cuda", dtype=dtype) for heads in (4, 2, 2))
key_start = torch.tensor([0, 130], dtype=torch.int32, device="cuda")
for masks in ({"window_left": 100}, {"cu_seqlens": [0, 1, 129, 400, 700]}, {"softcap": 1.0},
              {"window_left": 60, "cu_seqlens": [0, 250, 700], "softcap": 2.0}):
    for causal in (True, False):
        if "window_left" in masks and not causal:
            continue
        got = flash_attention(q, k, v, causal, key_start=key_start, solution=True, **masks)
        want = attention_float64(q.cpu(), k.cpu(), v.cpu(), causal, None, key_start.cpu(),
                                 window_left=masks.get("window_left"), documents=masks.get("cu_seqlens"),
                                 softcap=masks.get("softcap"))[0]
        error = (got.double().cpu() - want).abs().max().item()
        verdict = "ok" if error < tolerance else "WRONG"
        print(f"check {masks} causal={causal}: max error {error:.2e} {verdict}", flush=True)

# 2. the skip, in one run
b, h, s, d = 1, args.heads, args.seq, args.head_dim
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
documents = list(range(0, s + 1, args.document))
cases = {
    "causal": lambda: flash_attention(q, k, v, True, solution=True),
    f"window {args.window}": lambda: flash_attention(q, k, v, True, solution=True, window_left=args.window - 1),
    f"documents of {args.document}, causal": lambda: flash_attention(q, k, v, True, solution=True, cu_seqlens=documents),
    "no mask": lambda: flash_attention(q, k, v, False, solution=True),
    f"documents of {args.document}": lambda: flash_attention(q, k, v, False, solution=True, cu_seqlens=documents),
}
print(f"{args.dtype}, batch {b} heads {h} seq {s} head_dim {d}; median of {RUNS} runs (CUDA events)")
times = {name: median_ms(fn) for name, fn in cases.items()}
for name, ms in times.items():
    base = "causal" if "causal" in name or "window" in name else "no mask"
    print(f"  {name:32s} {ms:9.3f} ms   {times[base] / ms:6.2f}x {base}'s speed   "
          f"{times['causal'] / ms:6.2f}x causal's")

if args.flex:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention)
    ids = torch.arange(s, device="cuda") // args.document
    mods = {
        "causal": lambda b_, h_, i, j: j <= i,
        f"window {args.window}": lambda b_, h_, i, j: (j <= i) & (j > i - args.window),
        f"documents of {args.document}, causal": lambda b_, h_, i, j: (j <= i) & (ids[i] == ids[j]),
    }
    for name, mod in mods.items():
        block = create_block_mask(mod, None, None, s, s)
        ms = median_ms(lambda: flex(q, k, v, block_mask=block))
        print(f"  FlexAttention {name:18s} {ms:9.3f} ms   the kit's {ms / times[name]:5.2f}x FlexAttention's speed")
