// Given: not graded; edits here are not submitted. Compiled into task 5's extension beside your
// kernels, for task 6's decode step.
//
// y = x W^T for the few rows of a decode step (one token per sequence: rows = batch), W an
// nn.Linear weight (n, k), row-major. A decode step reads every weight of the model once and
// does two flops per weight and row, so, like decode, it is bound by how fast it reads W.
// cuBLAS's float32 product reads W at 62-75% of the copy bandwidth at 4 rows (H200 and H100, the
// 97 products of the handout model's decode step in one CUDA graph); this kernel's layout read
// them at 90% on an H100:
// - a warp takes ROWS rows of W at once, each lane a float4 of each, AHEAD float4 per row loaded
//   before any is used (ROWS * AHEAD 16-byte loads in flight per lane), marked streaming (__ldcs:
//   W is read once per step, so it should not push x out of the caches);
// - each float4 of x it loads (through L1: every warp reads the same x) serves ROWS rows of W;
// - the warps take rows of W grid-stride, with a grid of BLOCKS_PER_SM blocks per SM, so each
//   block streams many rows and the grid launches once per product.
// x (rows, k) and y (rows, n) are contiguous float32, k a multiple of 4 and every pointer 16-byte
// aligned (the binding checks); at most MAX_ROWS rows.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace {

constexpr int WARP = 32;
constexpr int WARPS = 8;          // warps per block
constexpr int ROWS = 2;           // rows of W a warp takes at once
constexpr int AHEAD = 2;          // float4 of each row each lane loads before using any
constexpr int BLOCKS_PER_SM = 4;  // the grid: enough warps per SM to keep the loads in flight
constexpr int MAX_ROWS = 8;       // rows of x (one per sequence of the batch)

// B rows of x, compiled for 1, 2, 4 and 8 (the launcher rounds `rows` up; the rows past it are
// computed on the last row again and never written).
template <int B>
__global__ void __launch_bounds__(WARPS * WARP) linear_rows_kernel(const float* __restrict__ x,
                                                                   const float* __restrict__ w, float* __restrict__ y,
                                                                   int rows, int n, int k) {
  const int lane = threadIdx.x % WARP, warps = gridDim.x * WARPS;
  const int k4 = k / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (int first = (blockIdx.x * WARPS + threadIdx.x / WARP) * ROWS; first < n; first += warps * ROWS) {
    float acc[ROWS][B] = {};
    for (int c = lane; c < k4; c += WARP * AHEAD) {
      float4 wv[ROWS][AHEAD];
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int u = 0; u < AHEAD; ++u) {
          const bool inside = first + r < n && c + WARP * u < k4;
          wv[r][u] = inside ? __ldcs(reinterpret_cast<const float4*>(w + (size_t)(first + r) * k) + c + WARP * u)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
      for (int u = 0; u < AHEAD; ++u) {
        if (c + WARP * u >= k4) break;
#pragma unroll
        for (int b = 0; b < B; ++b) {
          // Rows past `rows` read the last row again (their sums are never written): no branch here,
          // which would keep the compiler from issuing every load of the loop before the first use.
          const float4 xv = __ldg(x4 + (size_t)min(b, rows - 1) * k4 + c + WARP * u);
#pragma unroll
          for (int r = 0; r < ROWS; ++r)
            acc[r][b] += wv[r][u].x * xv.x + wv[r][u].y * xv.y + wv[r][u].z * xv.z + wv[r][u].w * xv.w;
        }
      }
    }
    // Each lane holds its part of every dot product: a butterfly sums them over the warp.
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int b = 0; b < B; ++b) {
        float v = acc[r][b];
        for (int offset = WARP / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
        if (lane == 0 && b < rows && first + r < n) y[(size_t)b * n + first + r] = v;
      }
  }
}

template <int B>
cudaError_t launch(const float* x, const float* w, float* y, int rows, int n, int k, cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int blocks_for_all = (n + WARPS * ROWS - 1) / (WARPS * ROWS);
  const int grid = std::max(1, std::min(blocks_for_all, sms * BLOCKS_PER_SM));
  linear_rows_kernel<B><<<grid, WARPS * WARP, 0, stream>>>(x, w, y, rows, n, k);
  return cudaGetLastError();
}

}  // namespace

// y (rows, n) = x (rows, k) @ w^T, w (n, k); returns the launch's error.
cudaError_t linear_rows(const float* x, const float* w, float* y, int rows, int n, int k, cudaStream_t stream) {
  if (rows < 1 || rows > MAX_ROWS || n < 1 || k < 4 || k % 4 != 0) return cudaErrorInvalidValue;
  if (rows == 1) return launch<1>(x, w, y, rows, n, k, stream);
  if (rows == 2) return launch<2>(x, w, y, rows, n, k, stream);
  if (rows <= 4) return launch<4>(x, w, y, rows, n, k, stream);
  return launch<8>(x, w, y, rows, n, k, stream);
}

int linear_max_rows() { return MAX_ROWS; }
