// The device library (see common.cuh): the two 16-bit types, bfloat16 and float16, as the kernels over them
// (task 4's kernels/attention_half.cu, task 5's kernels/decode_half.cu) convert them. Half<T> is written
// once for each type, so a kernel is written once, as a template over T.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

template <typename T>
struct Half;

template <>
struct Half<__nv_bfloat16> {
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  // Two floats as the 32-bit register mma's operands are made of (lo in the low half).
  __device__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  // The 8 values of a 16-byte load as floats, two at a time (one instruction converts a pair).
  __device__ static void unpack8(const uint4& raw, float (&out)[8]) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(pairs[j]);
      out[2 * j] = f.x, out[2 * j + 1] = f.y;
    }
  }
};

template <>
struct Half<__half> {
  __device__ static float to_float(__half x) { return __half2float(x); }
  __device__ static __half from_float(float x) { return __float2half_rn(x); }
  __device__ static uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ static void unpack8(const uint4& raw, float (&out)[8]) {
    const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(pairs[j]);
      out[2 * j] = f.x, out[2 * j + 1] = f.y;
    }
  }
};
