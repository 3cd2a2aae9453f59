// The Hopper backward experiment's parameters (hopper_bwd.cu), made by hopper_bwd_binding.cpp.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

struct HopperBackwardParams {
  CUtensorMap q_map, k_map, v_map, do_map;  // (head_dim, seq, batch * heads) in boxes of 64 columns x 64 rows
  const void *q, *k, *v, *out, *dout;
  const float* lse;  // natural-log units
  float *delta, *dq_accum;  // delta: written here; dq_accum: zeros
  void *dq, *dk, *dv;
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  float scale;
  bool causal, bf16;
};

cudaError_t hopper_backward(const HopperBackwardParams& p, cudaStream_t stream);
