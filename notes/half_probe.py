"""Issue 32: the bf16/fp16 tensor-core FlashAttention reference (task4/solution/kernels/attention_half.cu) alone.

python notes/half_probe.py [--time] [--build N] [--configs BLOCK_WARPS=8 BLOCK_COLS=32,Q_STEPS_UNROLLED=1 ...]  (a GPU of compute
capability 8.0 or later; --build N builds variant N only, 0 being the reference as it is, and exits). Builds the file with a small
binding of its own, then, for bf16 and fp16: checks it against float64 on the same 16-bit inputs over shapes
that are not multiples of the tiles (causal, seq_q != seq_k, grouped heads, key_start), each output poisoned
with NaN and followed by a guard band, and prints its error beside SDPA's own on the same inputs. --time: at
B8 H32 S4096, head_dim 64 and 128, causal and not, CUDA events around 10 runs after 3 (the median), against
SDPA's flash backend in the same dtype, in TFLOP/s. --configs: variants of the reference's constants (or file=PATH: another version), each built,
checked and timed (bf16) after it, and a table of all.
"""
import os
import re
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.cpp_extension import load_inline  # noqa: E402

BINDING = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
cudaError_t flash_attention_half_forward(const void* q, const void* k, const void* v, void* out, bool bf16,
                                         int batch, int heads, int kv_heads, const int* key_start, int seq_q,
                                         int seq_k, int head_dim, float scale, bool causal, cudaStream_t stream);
void forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor out, bool causal, double scale,
             std::optional<torch::Tensor> key_start) {
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && out.is_contiguous());
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf);
  const cudaError_t err = flash_attention_half_forward(
      q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), q.scalar_type() == at::kBFloat16, q.size(0),
      q.size(1), k.size(1), key_start ? key_start->data_ptr<int>() : nullptr, q.size(2), k.size(2), q.size(3),
      (float)scale, causal, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
}
"""

CASES = [  # batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, key_start
    (1, 1, 1, 1, 1, 64, False, None), (2, 4, 4, 100, 100, 64, True, None), (2, 4, 2, 77, 131, 128, False, None),
    (1, 8, 8, 200, 333, 128, True, None), (3, 2, 1, 65, 65, 32, True, None), (2, 3, 3, 129, 257, 80, False, None),
    (1, 4, 4, 513, 1000, 96, True, None), (2, 2, 2, 17, 40, 40, False, None), (1, 2, 2, 50, 50, 33, True, None),
    (2, 4, 4, 90, 90, 64, True, (0, 37)), (2, 4, 2, 30, 100, 128, False, (5, 99)), (1, 32, 8, 1024, 1024, 128, True, None),
]


def reference(q, k, v, causal, key_start):
    """float64 attention with the kernel's conventions: queries the last seq_q positions, padding per sequence."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    seq_q, seq_k = q.shape[2], k.shape[2]
    rows = torch.arange(seq_q, device=q.device)[:, None] + (seq_k - seq_q)
    cols = torch.arange(seq_k, device=q.device)[None, :]
    mask = torch.zeros(q.shape[0], 1, seq_q, seq_k, dtype=torch.bool, device=q.device)
    if causal:
        mask |= cols > rows
    if key_start is not None:
        first = torch.tensor(key_start, device=q.device)[:, None, None, None]
        mask |= cols < first
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key: zeros
    out = p @ v
    if key_start is not None:  # padded queries (before their sequence's first key) get zeros
        out = out.masked_fill(rows[None, None, :, :1] < torch.tensor(key_start, device=q.device)[:, None, None, None], 0)
    return out


def check(ext, dtype):
    worst = 0.0
    for batch, heads, kv_heads, seq_q, seq_k, d, causal, key_start in CASES:
        torch.manual_seed(seq_q * 7 + d)
        q = torch.randn(batch, heads, seq_q, d, device="cuda").to(dtype)
        k = torch.randn(batch, kv_heads, seq_k, d, device="cuda").to(dtype)
        v = torch.randn(batch, kv_heads, seq_k, d, device="cuda").to(dtype)
        guard = 4096
        buffer = torch.full((q.numel() + guard,), float("nan"), device="cuda", dtype=dtype)
        buffer[q.numel():] = 7.0
        out = buffer[:q.numel()].view(q.shape)
        starts = None if key_start is None else torch.tensor(key_start, device="cuda", dtype=torch.int32)
        ext.forward(q, k, v, out, causal, d ** -0.5, starts)
        torch.cuda.synchronize()
        expected = reference(q, k, v, causal, key_start)
        err = float((out.double() - expected).abs().max())
        unwritten = int(out.isnan().sum())
        guard_ok = bool((buffer[q.numel():] == 7.0).all())
        sdpa_err = float("nan")
        if key_start is None and (not causal or seq_q == seq_k):
            groups = heads // kv_heads
            kk, vv = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
            sdpa_err = float((F.scaled_dot_product_attention(q, kk, vv, is_causal=causal).double() - expected).abs().max())
        worst = max(worst, err / sdpa_err if sdpa_err == sdpa_err and sdpa_err > 0 else 0.0)
        print(f"  {str(dtype)[6:]:8s} B{batch} H{heads}/{kv_heads} q{seq_q} k{seq_k} D{d} causal={causal!s:5s} "
              f"key_start={key_start}: max err {err:.2e} (SDPA {sdpa_err:.2e}), unwritten {unwritten}, "
              f"guard {'kept' if guard_ok else 'WRITTEN'}", flush=True)
    print(f"  {dtype}: worst error / SDPA's {worst:.2f}")


def event_ms(fn, reps=10):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[reps // 2]


def timing(ext, dtype, head_dims=(64, 128)):
    """(head_dim, causal) -> (ours ms, SDPA flash ms) at B8 H32 S4096."""
    found = {}
    for d in head_dims:
        for causal in (False, True):
            q, k, v = (torch.randn(8, 32, 4096, d, device="cuda", dtype=dtype) for _ in range(3))
            out = torch.empty_like(q)
            flops = 4 * 8 * 32 * 4096 * 4096 * d / (2 if causal else 1)
            ours = event_ms(lambda: ext.forward(q, k, v, out, causal, d ** -0.5, None))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                flash = event_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            print(f"  {str(dtype)[6:]:8s} B8 H32 S4096 D{d} causal={causal!s:5s}: ours {ours:.2f} ms "
                  f"({flops / ours / 1e9:.0f} TFLOP/s), SDPA flash {flash:.2f} ms ({flops / flash / 1e9:.0f} TFLOP/s): "
                  f"{flash / ours:.2f}x its speed", flush=True)
            found[(d, causal)] = (ours, flash)
    return found


def variant(source: str, config: str) -> str:
    """The reference with constants replaced: config "BLOCK_WARPS=8,BLOCK_COLS=32"; "file=PATH" starts from another
    version of the file (an earlier design step, say)."""
    items = [item for item in config.split(",") if item]
    for item in sorted(items, key=lambda item: not item.startswith("file=")):  # file= first: the others edit it
        name, value = item.split("=", 1)
        if name == "file":
            source = open(value).read()
            continue
        def replace(m, value=int(value)):  # an int constant takes the number, a bool one 0 or 1
            return m.group(1) + (str(bool(value)).lower() if m.group(2) == "bool" else str(value)) + ";"
        source, count = re.subn(rf"(constexpr (int|bool) {name} = )(?:\d+|true|false);", replace, source)
        if count != 1:
            raise SystemExit(f"--configs: no single `constexpr int {name} = N;` (or bool) in the kernel file")
    return source


def main():
    """python notes/half_probe.py [--time] [--configs CONFIG ...]: CONFIG like BLOCK_WARPS=8,BLOCK_COLS=32 (one build and
    one row each, after the reference as it is)."""
    source = open("task4/solution/kernels/attention_half.cu").read()
    configs = [""] + (sys.argv[sys.argv.index("--configs") + 1:] if "--configs" in sys.argv else [])
    print(torch.cuda.get_device_name())
    def build(i):
        return load_inline(f"half_probe_{i}", cpp_sources=BINDING, cuda_sources=variant(source, configs[i]),
                           functions=["forward"], extra_cuda_cflags=["-O3", "-Xptxas=-v,-warn-spills"], verbose=False)

    if "--build" in sys.argv:  # one variant only, so that several processes can build them side by side first
        build(int(sys.argv[sys.argv.index("--build") + 1]))
        return
    rows = []
    for i, config in enumerate(configs):
        print(f"== {config or 'the reference as it is'}", flush=True)
        ext = build(i)
        for dtype in (torch.bfloat16, torch.float16):
            check(ext, dtype)
        if "--time" in sys.argv:
            rows.append((config or "reference", timing(ext, torch.bfloat16)))
    if rows:
        print("| bf16, B8 H32 S4096 | " + " | ".join(f"D{d}{' causal' if c else ''}" for d, c in rows[0][1]) + " |")
        for name, found in rows:
            print(f"| {name} | " + " | ".join(f"{o:.2f} ms ({f / o:.2f}x flash)" for o, f in found.values()) + " |")


if __name__ == "__main__":
    main()
