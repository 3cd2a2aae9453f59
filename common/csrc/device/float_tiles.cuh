// The device library (see common.cuh): task 4's float32 kernels, the forward (kernels/attention.cu) and
// the backward (kernels/attention_backward.cu), share these: a tile's asynchronous load, and the small
// vector operations their inner loops use on float4, float2 or float.
#pragma once

#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// Starts copying rows [row0, row0 + ROWS) of src, an (n_rows, head_dim) row-major matrix, into tile,
// ROWS rows of LD floats (LD >= D: rows padded in shared memory), with the block's THREADS threads. Rows
// past n_rows and columns past head_dim (up to D) become zeros, so the padding adds nothing to Q K^T (and
// P V gets 0 * 0, never 0 * garbage). Consecutive threads read consecutive float4 of a row: coalesced.
//
// The copies are asynchronous (cp.async, Ampere and later): they go from global to shared memory without
// passing through registers, so all of a tile's loads are in flight at once and the threads carry on.
// __pipeline_commit() closes a group of copies; __pipeline_wait_prior(n) waits until at most the n latest
// groups are still in flight. Only then, after a __syncthreads(), may the tile be read.
template <int ROWS, int D, int LD, int THREADS>
__device__ __forceinline__ void load_tile(float* tile, const float* src, int row0, int n_rows, int head_dim) {
  constexpr int VECS = D / 4;  // float4 per tile row
  // 16-byte copies need every row to start on 16 bytes.
  const bool vec = head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  for (int idx = threadIdx.x; idx < ROWS * VECS; idx += THREADS) {
    const int r = idx / VECS, c = (idx % VECS) * 4;
    float* dst = &tile[r * LD + c];
    const bool row_ok = row0 + r < n_rows;
    const float* from = src + (size_t)(row0 + r) * head_dim + c;  // read only if row_ok
    if (vec && row_ok && c < head_dim) {
      __pipeline_memcpy_async(dst, from, 16);
    } else {
      for (int e = 0; e < 4; ++e) {
        if (row_ok && c + e < head_dim)
          __pipeline_memcpy_async(dst + e, from + e, 4);
        else
          dst[e] = 0.0f;
      }
    }
  }
}

// Component i of a float4; i is a compile-time constant after unrolling, so this is a register, not a
// memory access.
__device__ __forceinline__ float component(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// acc += a * b, x *= a and a * x, for each of the vector types a thread's accumulators use (float4,
// float2 or float, depending on the head size the kernel is compiled for).
__device__ __forceinline__ void fma_vec(float4& acc, float a, const float4& b) {
  acc.x += a * b.x;
  acc.y += a * b.y;
  acc.z += a * b.z;
  acc.w += a * b.w;
}
__device__ __forceinline__ void fma_vec(float2& acc, float a, const float2& b) {
  acc.x += a * b.x;
  acc.y += a * b.y;
}
__device__ __forceinline__ void fma_vec(float& acc, float a, float b) { acc += a * b; }
__device__ __forceinline__ void scale_vec(float4& x, float a) { x.x *= a, x.y *= a, x.z *= a, x.w *= a; }
__device__ __forceinline__ void scale_vec(float2& x, float a) { x.x *= a, x.y *= a; }
__device__ __forceinline__ void scale_vec(float& x, float a) { x *= a; }
__device__ __forceinline__ float4 scaled(float4 x, float a) { return {x.x * a, x.y * a, x.z * a, x.w * a}; }
__device__ __forceinline__ float2 scaled(float2 x, float a) { return {x.x * a, x.y * a}; }
__device__ __forceinline__ float scaled(float x, float a) { return x * a; }

// Stores the first n (at most the vector's width) floats of x at dst: the last vector of a row whose
// head_dim is not a multiple of the width.
__device__ __forceinline__ void store_first(float* dst, const float4& x, int n) {
  dst[0] = x.x;
  if (n > 1) dst[1] = x.y;
  if (n > 2) dst[2] = x.z;
  if (n > 3) dst[3] = x.w;
}
__device__ __forceinline__ void store_first(float* dst, const float2& x, int n) {
  dst[0] = x.x;
  if (n > 1) dst[1] = x.y;
}
__device__ __forceinline__ void store_first(float* dst, float x, int) { dst[0] = x; }
