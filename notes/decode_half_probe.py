"""Issue 32: task 5's bf16/fp16 cache (task5/solution/kernels/decode_half.cu) alone, before it joins task 5.

python notes/decode_half_probe.py [--time]  (a GPU). Builds the file with a small binding of its own, then, for
bf16 and fp16: the cache update (new rows at each sequence's position, nothing else written) and the decode
against float64 on the same 16-bit values, over shapes that are not multiples of anything (odd head_dim, lengths
per sequence, key_start, grouped heads, splits), each output poisoned with NaN and followed by a guard band, with
SDPA's own error in the same type beside it. --time: the standard decode shapes (task 5's), CUDA events around 20
runs after 5 (the median), as a share of the copy bandwidth measured in the same run over the same bytes.
"""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.cpp_extension import load_inline  # noqa: E402

BINDING = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
cudaError_t update_cache_half(const void* k_new, const void* v_new, void* k_cache, void* v_cache, bool bf16,
                              int batch, int kv_heads, int n_new, int max_seq, int head_dim, const int* pos,
                              cudaStream_t stream);
cudaError_t decode_half_forward(const void* q, const void* k_cache, const void* v_cache, void* out, bool bf16,
                                int batch, int heads, int kv_heads, const int* length, const int* key_start,
                                int max_seq, int head_dim, float scale, int splits, float* partial_out,
                                float* partial_lse, cudaStream_t stream);
void update(torch::Tensor k_new, torch::Tensor v_new, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor pos) {
  const cudaError_t err = update_cache_half(k_new.data_ptr(), v_new.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
      k_new.scalar_type() == at::kBFloat16, k_new.size(0), k_new.size(1), k_new.size(2), k_cache.size(2),
      k_new.size(3), pos.data_ptr<int>(), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
}
void decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor out, torch::Tensor length,
            std::optional<torch::Tensor> key_start, double scale, int64_t splits) {
  torch::Tensor partial_out, partial_lse;
  if (splits > 1) {
    partial_out = torch::empty({q.size(0) * q.size(1) * splits * q.size(2)}, q.options().dtype(at::kFloat));
    partial_lse = torch::empty({q.size(0) * q.size(1) * splits}, q.options().dtype(at::kFloat));
  }
  const cudaError_t err = decode_half_forward(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
      q.scalar_type() == at::kBFloat16, q.size(0), q.size(1), k_cache.size(1), length.data_ptr<int>(),
      key_start ? key_start->data_ptr<int>() : nullptr, k_cache.size(2), q.size(2), (float)scale, (int)splits,
      splits > 1 ? partial_out.data_ptr<float>() : nullptr, splits > 1 ? partial_lse.data_ptr<float>() : nullptr,
      at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
}
"""

CASES = [  # batch, heads, kv_heads, max_seq, lengths, head_dim, key_start, splits
    (1, 1, 1, 1, [1], 64, None, 1), (2, 4, 4, 300, [300, 17], 128, None, 1), (3, 8, 2, 1000, [1, 999, 500], 64, None, 1),
    (2, 6, 3, 257, [257, 100], 80, None, 3), (1, 32, 8, 5000, [4097], 128, None, 16), (2, 5, 5, 90, [90, 33], 33, None, 1),
    (2, 4, 1, 130, [129, 60], 96, [0, 59], 2), (4, 8, 8, 64, [64, 1, 2, 63], 16, [3, 0, 1, 62], 1),
    (1, 12, 4, 2048, [2000], 40, None, 7), (2, 16, 2, 777, [700, 777], 128, [100, 0], 5),
]


def reference(q, k_cache, v_cache, lengths, key_start):
    """float64 decode: each sequence's one query per head over its positions [key_start, length)."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    groups = q.shape[1] // k_cache.shape[1]
    for b, length in enumerate(lengths):
        first = key_start[b] if key_start is not None else 0
        k = k_cache[b, :, first:length].double().repeat_interleave(groups, 0)
        v = v_cache[b, :, first:length].double().repeat_interleave(groups, 0)
        s = (q[b].double()[:, None, :] @ k.transpose(-1, -2))[:, 0] / q.shape[-1] ** 0.5
        out[b] = (torch.softmax(s, -1)[:, None, :] @ v)[:, 0]
    return out


def sdpa_error(q, k_cache, v_cache, lengths, key_start, expected):
    """SDPA's own largest error in the 16-bit type on the same inputs (per sequence, no mask needed)."""
    worst = 0.0
    groups = q.shape[1] // k_cache.shape[1]
    for b, length in enumerate(lengths):
        first = key_start[b] if key_start is not None else 0
        k = k_cache[b:b + 1, :, first:length].repeat_interleave(groups, 1)
        v = v_cache[b:b + 1, :, first:length].repeat_interleave(groups, 1)
        got = F.scaled_dot_product_attention(q[b:b + 1, :, None, :], k, v)[0, :, 0]
        worst = max(worst, float((got.double() - expected[b]).abs().max()))
    return worst


def check(ext, dtype):
    worst = 0.0
    for batch, heads, kv_heads, max_seq, lengths, d, key_start, splits in CASES:
        torch.manual_seed(max_seq + d)
        # the update: new rows written into a cache of NaN at each sequence's position, nothing else touched
        k_cache = torch.full((batch, kv_heads, max_seq, d), float("nan"), device="cuda", dtype=dtype)
        v_cache = k_cache.clone()
        k_full = torch.randn(batch, kv_heads, max_seq, d, device="cuda").to(dtype)
        v_full = torch.randn(batch, kv_heads, max_seq, d, device="cuda").to(dtype)
        n_new = min(lengths)
        for start in range(0, max(lengths), n_new):  # in chunks of n_new, each sequence at its own position
            pos = torch.tensor([min(start, length - n_new) for length in lengths], device="cuda", dtype=torch.int32)
            k_new = torch.stack([k_full[b, :, p:p + n_new] for b, p in enumerate(pos.tolist())]).contiguous()
            v_new = torch.stack([v_full[b, :, p:p + n_new] for b, p in enumerate(pos.tolist())]).contiguous()
            ext.update(k_new, v_new, k_cache, v_cache, pos)
        torch.cuda.synchronize()
        update_ok = all(torch.equal(k_cache[b, :, :length], k_full[b, :, :length]) and
                        torch.equal(v_cache[b, :, :length], v_full[b, :, :length]) and
                        bool(k_cache[b, :, length:].isnan().all()) for b, length in enumerate(lengths))
        q = torch.randn(batch, heads, d, device="cuda").to(dtype)
        guard = 4096
        buffer = torch.full((q.numel() + guard,), float("nan"), device="cuda", dtype=dtype)
        buffer[q.numel():] = 7.0
        out = buffer[:q.numel()].view(q.shape)
        length = torch.tensor(lengths, device="cuda", dtype=torch.int32)
        starts = None if key_start is None else torch.tensor(key_start, device="cuda", dtype=torch.int32)
        ext.decode(q, k_cache, v_cache, out, length, starts, d ** -0.5, splits)
        torch.cuda.synchronize()
        expected = reference(q, k_cache, v_cache, lengths, key_start)
        err = float((out.double() - expected).abs().max())
        sdpa = sdpa_error(q, k_cache, v_cache, lengths, key_start, expected)
        worst = max(worst, err / sdpa if sdpa > 0 else (0.0 if err == 0 else float("inf")))
        print(f"  {str(dtype)[6:]:8s} B{batch} H{heads}/{kv_heads} max_seq {max_seq} lengths {lengths} D{d} "
              f"key_start {key_start} splits {splits}: update {'right' if update_ok else 'WRONG'}, max err {err:.2e} "
              f"(SDPA {sdpa:.2e}), unwritten {int(out.isnan().sum())}, "
              f"guard {'kept' if bool((buffer[q.numel():] == 7.0).all()) else 'WRITTEN'}", flush=True)
    print(f"  {dtype}: worst error / SDPA's {worst:.2f}")


def event_ms(fn, reps=20):
    for _ in range(5):
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


def splits_for(blocks, max_length, sms, min_keys=512, most_splits=256):
    """decode.cu's decode_splits (the reference's step 3), here in Python."""
    most = max(1, min(most_splits, max_length // min_keys))
    splits, best = 1, -(-blocks // sms)
    for s in range(2, most + 1):
        time = -(-blocks * s // sms) / s
        if time < 0.95 * best:
            splits, best = s, time
    return splits


def timing(ext):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, heads, kv_heads, seq, d in [(16, 32, 32, 4096, 128), (1, 32, 32, 32768, 128), (16, 32, 8, 4096, 128),
                                           (64, 8, 8, 1000, 128), (8, 32, 32, 8192, 64)]:
        row = []
        for dtype in (torch.bfloat16, torch.float16):
            k = torch.randn(batch, kv_heads, seq, d, device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            q = torch.randn(batch, heads, d, device="cuda", dtype=dtype)
            out = torch.empty_like(q)
            length = torch.full((batch,), seq, device="cuda", dtype=torch.int32)
            group = heads // kv_heads
            per_block = 1 if group == 1 else 2 if group == 2 else 4
            splits = splits_for(batch * kv_heads * -(-group // per_block), seq, sms)
            ms = event_ms(lambda: ext.decode(q, k, v, out, length, None, d ** -0.5, splits))
            src = torch.cat([k.flatten(), v.flatten()])
            dst = torch.empty_like(src)
            copy = event_ms(lambda: dst.copy_(src))  # reads and writes the bytes: copy bandwidth = 2 x bytes / time
            read_gbs = src.numel() * src.element_size() / ms / 1e6
            copy_gbs = 2 * src.numel() * src.element_size() / copy / 1e6
            row.append(f"{str(dtype)[6:]} {ms:.3f} ms = {read_gbs:.0f} GB/s, {read_gbs / copy_gbs:.0%} of copy "
                       f"({copy_gbs:.0f} GB/s), splits {splits}")
        print(f"  B{batch} H{heads}/{kv_heads} S{seq} D{d}: " + "; ".join(row), flush=True)


def main():
    print(torch.cuda.get_device_name())
    ext = load_inline("decode_half_probe", cpp_sources=BINDING,
                      cuda_sources=open("task5/solution/kernels/decode_half.cu").read(),
                      functions=["update", "decode"], extra_cuda_cflags=["-O3", "-Xptxas=-v,-warn-spills"])
    for dtype in (torch.bfloat16, torch.float16):
        check(ext, dtype)
    if "--time" in sys.argv:
        timing(ext)


if __name__ == "__main__":
    main()
