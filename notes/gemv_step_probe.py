"""Issue 31: the handout's decode step's matrix products (every weight once, batch 4) in one CUDA graph.

python notes/gemv_step_probe.py  (a GPU with 40 GB). The 24 layers' qkv (12288x4096), o (4096x4096),
gate_up (32768x4096) and down (4096x16384) and the LM head (8192x4096), each its own weights, as
F.linear and as float32 matrix-vector kernels of our own (variants below), captured once per kind and
replayed: CUDA events around 20 replays after 3, the median; against the copy bandwidth (harness/bench.py's,
outside a graph: a captured copy_ runs on the copy engines, at about 2.75 TB/s on an H200).
Layouts tried for cuBLAS: x @ W^T (F.linear, W as nn.Linear keeps it), W @ x^T (the same product the other
way round), and x @ Wt with Wt = W^T stored contiguous (K, N).
"""

import sys

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// y (B, n) = x (B, k) @ w^T, w (n, k) row-major. A warp per row at a time, rows taken grid-stride;
// each lane streams UNROLL float4 of the row before using them; x through L1.
template <int B, int UNROLL>
__global__ void __launch_bounds__(256) gemv_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                   float* __restrict__ y, int n, int k) {
  const int lane = threadIdx.x % 32, warps = gridDim.x * (blockDim.x / 32);
  const int k4 = k / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < n; row += warps) {
    const float4* w4 = reinterpret_cast<const float4*>(w + (size_t)row * k);
    float acc[B] = {};
    for (int c = lane; c < k4; c += 32 * UNROLL) {
      float4 wv[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) wv[u] = c + 32 * u < k4 ? __ldcs(w4 + c + 32 * u) : make_float4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (c + 32 * u >= k4) break;
#pragma unroll
        for (int b = 0; b < B; ++b) {
          const float4 xv = __ldg(x4 + (size_t)b * k4 + c + 32 * u);
          acc[b] += wv[u].x * xv.x + wv[u].y * xv.y + wv[u].z * xv.z + wv[u].w * xv.w;
        }
      }
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      float v = acc[b];
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) y[(size_t)b * n + row] = v;
    }
  }
}

// As gemv_kernel, but a warp takes ROWS rows at once: each x float4 it loads serves ROWS rows of w
// (a quarter or half of the L1 traffic for x), and ROWS * UNROLL float4 of w are in flight per lane.
template <int B, int UNROLL, int ROWS>
__global__ void __launch_bounds__(256) gemv_rows_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                        float* __restrict__ y, int n, int k) {
  const int lane = threadIdx.x % 32, warps = gridDim.x * (blockDim.x / 32);
  const int k4 = k / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (int row0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * ROWS; row0 < n; row0 += warps * ROWS) {
    float acc[ROWS][B] = {};
    for (int c = lane; c < k4; c += 32 * UNROLL) {
      float4 wv[ROWS][UNROLL];
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          wv[r][u] = row0 + r < n && c + 32 * u < k4 ? __ldcs(reinterpret_cast<const float4*>(w + (size_t)(row0 + r) * k) + c + 32 * u)
                                                   : make_float4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (c + 32 * u >= k4) break;
#pragma unroll
        for (int b = 0; b < B; ++b) {
          const float4 xv = __ldg(x4 + (size_t)b * k4 + c + 32 * u);
#pragma unroll
          for (int r = 0; r < ROWS; ++r)
            acc[r][b] += wv[r][u].x * xv.x + wv[r][u].y * xv.y + wv[r][u].z * xv.z + wv[r][u].w * xv.w;
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
}

void gemv_rows(torch::Tensor x, torch::Tensor w, torch::Tensor y, int64_t rows, int64_t unroll, int64_t blocks_per_sm) {
  const int n = w.size(0), k = w.size(1);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int warps = 8, all = (n + warps * rows - 1) / (warps * rows);
  const int grid = std::min<int>(all, sms * blocks_per_sm);
  auto stream = at::cuda::getCurrentCUDAStream();
  const float* xp = x.data_ptr<float>(); const float* wp = w.data_ptr<float>(); float* yp = y.data_ptr<float>();
  if (rows == 2 && unroll == 2) gemv_rows_kernel<4, 2, 2><<<grid, warps * 32, 0, stream>>>(xp, wp, yp, n, k);
  else if (rows == 2 && unroll == 4) gemv_rows_kernel<4, 4, 2><<<grid, warps * 32, 0, stream>>>(xp, wp, yp, n, k);
  else if (rows == 4 && unroll == 1) gemv_rows_kernel<4, 1, 4><<<grid, warps * 32, 0, stream>>>(xp, wp, yp, n, k);
  else gemv_rows_kernel<4, 2, 4><<<grid, warps * 32, 0, stream>>>(xp, wp, yp, n, k);
}

void gemv(torch::Tensor x, torch::Tensor w, torch::Tensor y, int64_t unroll, int64_t blocks_per_sm) {
  const int n = w.size(0), k = w.size(1);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int warps = 8, all = (n + warps - 1) / warps;
  const int grid = blocks_per_sm > 0 ? std::min<int>(all, sms * blocks_per_sm) : all;
  auto stream = at::cuda::getCurrentCUDAStream();
  if (unroll == 4) gemv_kernel<4, 4><<<grid, warps * 32, 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), n, k);
  else gemv_kernel<4, 8><<<grid, warps * 32, 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), n, k);
}
"""

SHAPES = [(12288, 4096), (4096, 4096), (32768, 4096), (4096, 16384)]


def graphed_ms(fn):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def copy_bandwidth() -> float:
    import os
    import sys

    sys.path.insert(0, os.getcwd())
    from harness import bench

    return bench.copy_bandwidth_gbs()


def main():
    ext = load_inline("gemv_step_probe", cpp_sources="void gemv(torch::Tensor x, torch::Tensor w, torch::Tensor y, "
                      "int64_t unroll, int64_t blocks_per_sm); void gemv_rows(torch::Tensor x, torch::Tensor w, "
                      "torch::Tensor y, int64_t rows, int64_t unroll, int64_t blocks_per_sm);", cuda_sources=SOURCE,
                      functions=["gemv", "gemv_rows"],
                      extra_cuda_cflags=["-O3"])
    copy_gbs = copy_bandwidth()
    weights = [torch.randn(n, k, device="cuda") * 0.01 for _ in range(24) for n, k in SHAPES]
    weights.append(torch.randn(8192, 4096, device="cuda") * 0.01)
    nbytes = sum(w.nbytes for w in weights)
    xs = {k: torch.randn(4, k, device="cuda") for k in (4096, 16384)}
    ys = [torch.empty(4, w.shape[0], device="cuda") for w in weights]
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbs:.0f} GB/s; {len(weights)} matrices, {nbytes / 1e9:.2f} GB; "
          f"at the copy bandwidth {nbytes / copy_gbs / 1e6:.2f} ms")
    check = [(w, ys[i]) for i, w in enumerate(weights[:4])]

    def run_linear():
        for w, y in zip(weights, ys):
            torch.mm(xs[w.shape[1]], w.t(), out=y)
    ms = graphed_ms(run_linear)  # the baseline, each run
    print(f"x @ W^T (F.linear, mm into y): {ms:.2f} ms, {nbytes / ms / 1e6 / copy_gbs:.0%} of copy")
    if "--layouts" in sys.argv:  # measured: slower than F.linear on an H200 (45% and 57% of copy)
        ys_t = [torch.empty(w.shape[0], 4, device="cuda") for w in weights]

        def run_w_first():
            for w, y in zip(weights, ys_t):
                torch.mm(w, xs[w.shape[1]].t(), out=y)
        ms = graphed_ms(run_w_first)
        print(f"W @ x^T (mm into y^T): {ms:.2f} ms, {nbytes / ms / 1e6 / copy_gbs:.0%} of copy")
        ys_t.clear()
        for i, w in enumerate(weights):  # W^T stored contiguous, in place of W: the same bytes
            weights[i] = w.t().contiguous()
            del w
        torch.cuda.empty_cache()

        def run_transposed():
            for wt, y in zip(weights, ys):
                torch.mm(xs[wt.shape[0]], wt, out=y)
        ms = graphed_ms(run_transposed)
        print(f"x @ Wt, Wt = W^T contiguous: {ms:.2f} ms, {nbytes / ms / 1e6 / copy_gbs:.0%} of copy")
        for i, wt in enumerate(weights):
            weights[i] = wt.t().contiguous()
            del wt
        torch.cuda.empty_cache()
    for rows, unroll, per_sm in ((2, 2, 4), (2, 4, 4), (4, 1, 4), (4, 2, 4), (2, 2, 2), (2, 4, 2), (4, 2, 2),
                                 (2, 2, 8)):
        def run_rows():
            for w, y in zip(weights, ys):
                ext.gemv_rows(xs[w.shape[1]], w, y, rows, unroll, per_sm)
        ms = graphed_ms(run_rows)
        err = max(float((y.double() - xs[w.shape[1]].double() @ w.double().t()).abs().max()) for w, y in check)
        print(f"gemv {rows} rows a warp, unroll {unroll}, blocks/SM {per_sm}: {ms:.2f} ms, "
              f"{nbytes / ms / 1e6 / copy_gbs:.0%} of copy (max err {err:.1e})", flush=True)
    for unroll, per_sm in ((4, 4), (4, 2), (4, 6)):
        def run():
            for w, y in zip(weights, ys):
                ext.gemv(xs[w.shape[1]], w, y, unroll, per_sm)
        ms = graphed_ms(run)
        err = max(float((y.double() - xs[w.shape[1]].double() @ w.double().t()).abs().max()) for w, y in check)
        print(f"gemv unroll {unroll} blocks/SM {per_sm or 'all rows'}: {ms:.2f} ms, {nbytes / ms / 1e6 / copy_gbs:.0%} "
              f"of copy (max err {err:.1e})")


if __name__ == "__main__":
    main()
