// The experiment's parameters (bwd16.cu), shared with its binding (binding.cpp).
#pragma once

#include <cuda_runtime.h>

struct Backward16Params {
  const void *q, *k, *v, *out, *dout;
  const float* lse;
  float *delta, *dq_accum;
  void *dq, *dk, *dv;
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  float scale;
  bool causal, bf16;
  int block_m;  // queries a walked tile: 32 or 64
};

cudaError_t backward16(const Backward16Params& p, cudaStream_t stream);
