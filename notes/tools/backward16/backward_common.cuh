// What the two 16-bit backward experiments (bwd16.cu, mma.sync; hopper_bwd.cu, wgmma) share beside their dK/dV
// kernels: D, dQ's float32 adds, and dq from dq_accum. The kit's own are the student's steps 28 and 30
// (task4/kernels/attention_backward_half.cu), so they stay there apart from these.
#pragma once

#include <cuda_runtime.h>

#include "device/common.cuh"  // WARP
#include "device/half.cuh"    // Half<T>

namespace backward_experiment {

// *dst += a, dst[1] += b, atomically: one vector reduction on 9.0 (red.global.add.v2.f32; dst 8-byte aligned),
// two atomicAdds before it.
__device__ __forceinline__ void add_pair(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// D = rowsum(dO * O) in float32, one warp a row.
template <typename T>
__global__ void delta_kernel(const T* __restrict__ out, const T* __restrict__ dout, float* __restrict__ delta,
                             long long rows, int head_dim) {
  const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
  const int lane = threadIdx.x % WARP;
  if (row >= rows) return;
  float sum = 0.0f;
  for (int d = lane; d < head_dim; d += WARP)
    sum += Half<T>::to_float(out[row * head_dim + d]) * Half<T>::to_float(dout[row * head_dim + d]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) delta[row] = sum;
}

// dq = scale dq_accum, in 16 bits (a grid-stride loop).
template <typename T>
__global__ void dq_kernel(const float* __restrict__ dq_accum, T* __restrict__ dq, long long n, float scale) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dq[i] = Half<T>::from_float(dq_accum[i] * scale);
}

}  // namespace backward_experiment
