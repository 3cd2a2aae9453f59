"""Issue 31: can a plain float32 matrix-vector kernel read the handout's weights at ~90% of the copy bandwidth?

python notes/gemv_kernel_probe.py  (GPU). y (B, N) = x (B, K) @ W^T for W (N, K) row-major, B = 4 tokens:
each warp takes ROWS rows of W, its lanes stream them with float4 loads (UNROLL in flight), x read through
L1; CUDA events, the median of 50 calls after a warm-up, against F.linear and the copy bandwidth.
"""

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <int B, int ROWS>
__global__ void __launch_bounds__(256) gemv_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                   float* __restrict__ y, int n, int k) {
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * ROWS;
  if (row0 >= n) return;
  float acc[ROWS][B] = {};
  const int k4 = k / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (int c = lane; c < k4; c += 32 * 4) {
    float4 wv[4][ROWS];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int cc = c + 32 * u;
        wv[u][r] = cc < k4 && row0 + r < n ? __ldcs(reinterpret_cast<const float4*>(w + (size_t)(row0 + r) * k) + cc)
                                           : make_float4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int cc = c + 32 * u;
      if (cc >= k4) break;
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float4 xv = __ldg(x4 + (size_t)b * k4 + cc);
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
          acc[r][b] += wv[u][r].x * xv.x + wv[u][r].y * xv.y + wv[u][r].z * xv.z + wv[u][r].w * xv.w;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int b = 0; b < B; ++b) {
      float v = acc[r][b];
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && row0 + r < n) y[(size_t)b * n + row0 + r] = v;
    }
}

torch::Tensor gemv(torch::Tensor x, torch::Tensor w, int64_t rows) {
  const int n = w.size(0), k = w.size(1);
  auto y = torch::empty({x.size(0), n}, x.options());
  const int warps = 8, per_block = warps * rows;
  const dim3 grid((n + per_block - 1) / per_block);
  auto stream = at::cuda::getCurrentCUDAStream();
  if (rows == 1) gemv_kernel<4, 1><<<grid, warps * 32, 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), n, k);
  else if (rows == 2) gemv_kernel<4, 2><<<grid, warps * 32, 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), n, k);
  else gemv_kernel<4, 4><<<grid, warps * 32, 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), n, k);
  return y;
}
"""


def events(fn, reps=50):
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
    return sorted(times)[len(times) // 2]


def main():
    ext = load_inline("gemv_probe", cpp_sources="torch::Tensor gemv(torch::Tensor x, torch::Tensor w, int64_t rows);",
                      cuda_sources=SOURCE, functions=["gemv"], extra_cuda_cflags=["-O3", "--use_fast_math"])
    src = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 4 / events(lambda: dst.copy_(src)) / 1e6  # GB/s
    del src, dst
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s")
    total = {"F.linear": 0.0, "gemv": 0.0}
    for n, k, count in [(12288, 4096, 24), (4096, 4096, 24), (32768, 4096, 24), (4096, 16384, 24), (8192, 4096, 1)]:
        w = torch.randn(n, k, device="cuda")
        x = torch.randn(4, k, device="cuda")
        want = F.linear(x.double(), w.double())
        line = []
        best = None
        for rows in (1, 2, 4):
            got = ext.gemv(x, w, rows)
            err = float((got.double() - want).abs().max())
            ms = events(lambda: ext.gemv(x, w, rows))
            best = ms if best is None else min(best, ms)
            line.append(f"rows {rows}: {ms * 1e3:.1f} us {w.nbytes / ms / 1e6 / copy:.0%} (err {err:.1e})")
        ms_linear = events(lambda: F.linear(x, w))
        total["F.linear"] += ms_linear * count
        total["gemv"] += best * count
        print(f"W {n}x{k} ({w.nbytes / 1e6:.0f} MB): F.linear {ms_linear * 1e3:.1f} us {w.nbytes / ms_linear / 1e6 / copy:.0%}; "
              + "; ".join(line))
        del w
    print(f"every weight of the handout's decode step (single calls summed): F.linear {total['F.linear']:.2f} ms, "
          f"gemv {total['gemv']:.2f} ms")


if __name__ == "__main__":
    main()
