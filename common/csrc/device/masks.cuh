// The device library (see common.cuh): the masks beyond causal (task 4, steps 23-25, optional), the part every
// kernel that takes them shares. The masks themselves (AttentionMasks in params.h) are the kernel's to apply.
#pragma once

#include "device/common.cuh"  // LOG2E
#include "device/params.h"

// The document that holds position `pos`: the d with cu_seqlens[d] <= pos < cu_seqlens[d + 1], found by bisection
// over the documents + 1 cumulative lengths (0 = c_0 < c_1 < ... < c_documents = seq: the binding checks them).
// A position past the last document is given the last one.
__device__ __forceinline__ int document_of(const int* __restrict__ cu_seqlens, int documents, int pos) {
  int lo = 0, hi = documents - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= pos) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// cap * tanh(x / cap) (inv_cap = 1 / cap), with CUDA's tanhf: within 2 units in the last place at any cap. Neither
// tanh.approx.f32 (2^-11 relative: half a unit of an fp16 P) nor 1 - 2 / (1 + e^(2y)) on the fast exp2 (its error is
// about 2.5e-7 of the cap whatever the score: at a cap of 1e8 the scores 1, 5 and 10 all come out 0) holds that.
__device__ __forceinline__ float soft_cap(float x, float cap, float inv_cap) { return cap * tanhf(x * inv_cap); }
