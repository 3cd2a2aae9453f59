// Given: not graded; edits here are not submitted. Compiled into task 5's extension beside your
// kernels, for task 6's decode step.
//
// y = x W^T for the few rows of a decode step (one token per sequence: rows = batch), W an
// nn.Linear weight (n, k), row-major. A decode step reads every weight of the model once and
// does two flops per weight and row, so, like decode, it is bound by how fast it reads W.
// cuBLAS's float32 product reads W at 62-75% of the copy bandwidth at 4 rows (H200 and H100, the
// 97 products of the handout model's decode step in one CUDA graph); this kernel's layout read
// them at 90% on an H100:
// - a warp takes ROWS rows of W at once, each lane 16 bytes of each, AHEAD such loads per row
//   before any is used (ROWS * AHEAD 16-byte loads in flight per lane), marked streaming (__ldcs:
//   W is read once per step, so it should not push x out of the caches);
// - each 16 bytes of x it loads (through L1: every warp reads the same x) serve ROWS rows of W;
// - the warps take rows of W grid-stride, with a grid of BLOCKS_PER_SM blocks per SM, so each
//   block streams many rows and the grid launches once per product.
// x (rows, k), w and y (rows, n) are contiguous, all float32 or all bfloat16 or float16 (a model in 16
// bits: then each 16-byte load holds 8 values, and the sums are float32); k fills whole 16-byte loads
// and every pointer is 16-byte aligned (the binding checks); at most MAX_ROWS rows.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace {

constexpr int WARP = 32;
constexpr int WARPS = 8;          // warps per block
constexpr int ROWS = 2;           // rows of W a warp takes at once
constexpr int AHEAD = 2;          // 16-byte loads of each row each lane issues before using any
constexpr int BLOCKS_PER_SM = 4;  // the grid: enough warps per SM to keep the loads in flight
constexpr int MAX_ROWS = 8;       // rows of x (one per sequence of the batch)

// 16 bytes of T: 4 floats, or 8 bfloat16 or float16 values.
template <typename T>
constexpr int PER_LOAD = 16 / sizeof(T);

// Two 16-bit values packed in 32 bits, widened to float2 (exactly: both types fit in a float).
template <typename T>
__device__ inline float2 widen(uint32_t pair) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xffff0000u));
  else
    return __half22float2(__halves2half2(__ushort_as_half(pair & 0xffffu), __ushort_as_half(pair >> 16)));
}

// The dot product of two 16-byte loads of T, in float32. (Templates with `if constexpr`, not
// specializations: those would also be compiled for the host, as stubs that call exit.)
template <typename T>
__device__ inline float dot16(uint4 a, uint4 b) {
  if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(a.x) * __uint_as_float(b.x) + __uint_as_float(a.y) * __uint_as_float(b.y) +
           __uint_as_float(a.z) * __uint_as_float(b.z) + __uint_as_float(a.w) * __uint_as_float(b.w);
  } else {  // bfloat16 or float16: four pairs
    const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 xf = widen<T>(x[i]), yf = widen<T>(y[i]);
      sum += xf.x * yf.x + xf.y * yf.y;
    }
    return sum;
  }
}

template <typename T>
__device__ inline T from_float(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(v);
  else
    return __float2half(v);
}

// B rows of x, compiled for 1, 2, 4 and 8 (the launcher rounds `rows` up; the rows past it are
// computed on the last row again and never written).
template <typename T, int B>
__global__ void __launch_bounds__(WARPS * WARP) linear_rows_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                   T* __restrict__ y, int rows, int n, int k) {
  const int lane = threadIdx.x % WARP, warps = gridDim.x * WARPS;
  const int loads = k / PER_LOAD<T>;  // 16-byte loads a row
  const uint4* x16 = reinterpret_cast<const uint4*>(x);
  for (int first = (blockIdx.x * WARPS + threadIdx.x / WARP) * ROWS; first < n; first += warps * ROWS) {
    float acc[ROWS][B] = {};
    for (int c = lane; c < loads; c += WARP * AHEAD) {
      uint4 wv[ROWS][AHEAD];
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int u = 0; u < AHEAD; ++u) {
          const bool inside = first + r < n && c + WARP * u < loads;
          wv[r][u] = inside ? __ldcs(reinterpret_cast<const uint4*>(w + (size_t)(first + r) * k) + c + WARP * u)
                            : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
      for (int u = 0; u < AHEAD; ++u) {
        if (c + WARP * u >= loads) break;
#pragma unroll
        for (int b = 0; b < B; ++b) {
          // Rows past `rows` read the last row again (their sums are never written): no branch here,
          // which would keep the compiler from issuing every load of the loop before the first use.
          const uint4 xv = __ldg(x16 + (size_t)min(b, rows - 1) * loads + c + WARP * u);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) acc[r][b] += dot16<T>(wv[r][u], xv);
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
        if (lane == 0 && b < rows && first + r < n) y[(size_t)b * n + first + r] = from_float<T>(v);
      }
  }
}

template <typename T, int B>
cudaError_t launch(const T* x, const T* w, T* y, int rows, int n, int k, cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int blocks_for_all = (n + WARPS * ROWS - 1) / (WARPS * ROWS);
  const int grid = std::max(1, std::min(blocks_for_all, sms * BLOCKS_PER_SM));
  linear_rows_kernel<T, B><<<grid, WARPS * WARP, 0, stream>>>(x, w, y, rows, n, k);
  return cudaGetLastError();
}

template <typename T>
cudaError_t linear_rows_typed(const T* x, const T* w, T* y, int rows, int n, int k, cudaStream_t stream) {
  if (rows < 1 || rows > MAX_ROWS || n < 1 || k < PER_LOAD<T> || k % PER_LOAD<T> != 0) return cudaErrorInvalidValue;
  if (rows == 1) return launch<T, 1>(x, w, y, rows, n, k, stream);
  if (rows == 2) return launch<T, 2>(x, w, y, rows, n, k, stream);
  if (rows <= 4) return launch<T, 4>(x, w, y, rows, n, k, stream);
  return launch<T, 8>(x, w, y, rows, n, k, stream);
}

}  // namespace

// y (rows, n) = x (rows, k) @ w^T, w (n, k); returns the launch's error.
cudaError_t linear_rows(const float* x, const float* w, float* y, int rows, int n, int k, cudaStream_t stream) {
  return linear_rows_typed(x, w, y, rows, n, k, stream);
}

// The same in 16 bits (bf16: true for bfloat16, else float16), every tensor of the one type.
cudaError_t linear_rows_half(const void* x, const void* w, void* y, bool bf16, int rows, int n, int k,
                             cudaStream_t stream) {
  if (bf16)
    return linear_rows_typed(static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
                             static_cast<__nv_bfloat16*>(y), rows, n, k, stream);
  return linear_rows_typed(static_cast<const __half*>(x), static_cast<const __half*>(w), static_cast<__half*>(y), rows,
                           n, k, stream);
}

int linear_max_rows() { return MAX_ROWS; }
