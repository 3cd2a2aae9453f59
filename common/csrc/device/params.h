// The device library (see common.cuh): the parameters of each kernel family, declared once. The binding
// (taskN/binding.cpp) fills one from the tensors it has checked and passes it to the launcher in the kernel
// file, which reads it by name: no launcher takes a long list of positional arguments, and a new parameter
// is added in one place. Plain C++ (the binding is compiled without nvcc); the tensors' pointers are void
// where a family has a float32 and a 16-bit kernel, and each launcher casts them to its type.
#pragma once

#include <cuda_runtime.h>

// Task 5: append new rows of keys and values to the cache (kernels/decode.cu's update_cache, and
// decode_half.cu's update_cache_half for a 16-bit cache).
struct CacheUpdateParams {
  const void* k_new = nullptr;  // (batch * kv_heads, n_new, head_dim)
  const void* v_new = nullptr;
  void* k_cache = nullptr;      // (batch, kv_heads, max_seq, head_dim); a paged cache's pool: (num_pages, kv_heads,
  void* v_cache = nullptr;      // page_size, head_dim)
  bool bf16 = false;  // 16-bit kernels: bfloat16 (true) or float16 (false), every tensor the same type
  int batch = 0, kv_heads = 0, n_new = 0, max_seq = 0, head_dim = 0;
  const int* pos = nullptr;  // (batch,) in GPU memory: sequence b's new rows go to pos[b] .. pos[b] + n_new - 1
  // step 5, a paged cache: the block table (batch, max_pages) in GPU memory, or nullptr for a contiguous cache
  const int* block_table = nullptr;
  int max_pages = 0, num_pages = 0, page_size = 0;
};

// Task 5: one decode step, each sequence's query heads against its cache (kernels/decode.cu's
// decode_forward, decode_half.cu's decode_half_forward).
struct DecodeParams {
  const void* q = nullptr;        // (batch, heads, head_dim)
  const void* k_cache = nullptr;  // as CacheUpdateParams's
  const void* v_cache = nullptr;
  void* out = nullptr;            // (batch, heads, head_dim)
  bool bf16 = false;
  int batch = 0, heads = 0, kv_heads = 0, max_seq = 0, head_dim = 0;
  const int* length = nullptr;     // (batch,) in GPU memory: sequence b's rows are [key_start[b], length[b])
  const int* key_start = nullptr;  // nullptr (no padding) or (batch,) in GPU memory
  float scale = 1.0f;
  // step 3, split-KV: splits blocks per (batch, kv_head, chunk of query heads); with more than one, their
  // partial outputs (batch * heads * splits * head_dim floats) and log-sum-exps (batch * heads * splits)
  int splits = 1;
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  // step 5, a paged cache: as CacheUpdateParams's (max_seq is then max_pages * page_size)
  const int* block_table = nullptr;
  int max_pages = 0, num_pages = 0, page_size = 0;
};

// Task 4's masks beyond causal (kernels/attention.cu's flash_attention_forward_masks, steps 23-24, optional), in
// the positions of the whole sequence (before any left padding is skipped), each combinable with causal, grouped
// heads and key_start. The binding checks them.
struct AttentionMasks {
  int window_left = -1;  // >= 0 (with causal): query i sees keys i + (seq_k - seq_q) - window_left .. its diagonal
  float softcap = 0.0f;  // > 0: every score S (after the scale) becomes softcap * tanh(S / softcap), before the masks
  // packed documents (seq_q == seq_k): nullptr, or the documents + 1 cumulative lengths 0 = c_0 < ... < c_n = seq_k,
  // int32 in GPU memory, shared by the batch; a query sees the keys of its own document only
  const int* cu_seqlens = nullptr;
  int documents = 0;
};

// Whether any of the masks is given (a launcher sends those to its MASKS instance).
inline bool has_masks(const AttentionMasks& m) {
  return m.window_left >= 0 || m.softcap > 0.0f || m.cu_seqlens != nullptr;
}

// Task 4: attention over a whole sequence, the forward pass (kernels/attention.cu's flash_attention_forward
// and, with lse, flash_attention_forward_lse; attention_half.cu's flash_attention_half_forward).
struct AttentionParams {
  const void* q = nullptr;  // (batch, heads, seq_q, head_dim)
  const void* k = nullptr;  // (batch, kv_heads, seq_k, head_dim), heads a multiple of kv_heads
  const void* v = nullptr;
  void* out = nullptr;      // (batch, heads, seq_q, head_dim)
  bool bf16 = false;  // the 16-bit kernel: bfloat16 (true) or float16 (false), every tensor the same type
  int batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  const int* key_start = nullptr;  // nullptr (no padding) or (batch,) in GPU memory: each sequence's first key
  float scale = 1.0f;
  bool causal = false;
  float* lse = nullptr;  // step 12 (the backward part): (batch, heads, seq_q), each row's log-sum-exp, written
  AttentionMasks masks;  // steps 23-24 (flash_attention_forward_masks only): none by default
};

// Task 4's Hopper part (kernels/attention_hopper.cu, steps 17-22): the forward's parameters, head_dim a multiple
// of 8 (the binding pads it), and the tensor maps TMA copies Q, K and V through. The binding makes them
// (cuTensorMapEncodeTiled: a kernel file may not call the driver): each views its tensor as 3-d, (head_dim, seq,
// batch * heads) innermost first, in boxes of 64 columns (128 bytes) x HOPPER_Q_BOX_ROWS rows (q: a block's
// queries) or HOPPER_KV_BOX_ROWS rows (k and v: a K/V tile is one or more boxes, so its width is the kernel's
// choice), written to shared memory with the 128-byte swizzle; elements outside the tensor arrive as zeros. The
// launcher passes the struct to the kernel as a __grid_constant__ parameter, so TMA reads the maps where the
// kernel's parameters live.
// CUtensorMap is CUDA 12's: with an older toolkit the struct is left out, and so is the part.
#if CUDART_VERSION >= 12000
#include <cuda.h>

constexpr int HOPPER_BOX_COLS = 64;
constexpr int HOPPER_Q_BOX_ROWS = 128;
constexpr int HOPPER_KV_BOX_ROWS = 64;
struct HopperAttentionParams {
  AttentionParams p;
  CUtensorMap q_map, k_map, v_map;
};
#endif

// Task 4: the backward pass (kernels/attention_backward.cu's flash_attention_backward), float32; shapes as
// AttentionParams's, dq like q, dk and dv like k.
struct AttentionBackwardParams {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* out = nullptr;
  const float* dout = nullptr;  // the loss's gradient with respect to out
  const float* lse = nullptr;   // (batch, heads, seq_q), from the forward pass (step 12)
  float* delta = nullptr;       // (batch, heads, seq_q): scratch for D = rowsum(dout * out)
  float* dq = nullptr;          // written
  float* dk = nullptr;
  float* dv = nullptr;
  int batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  float scale = 1.0f;
  bool causal = false;
  AttentionMasks masks;  // step 26 (optional): the forward's masks, lse from its forward_masks; none by default
};

// Task 4: the backward pass in bf16 or fp16 (kernels/attention_backward_half.cu's flash_attention_backward_half, steps
// 27-30, optional); shapes as AttentionBackwardParams's, head_dim a multiple of 8 and every tensor 16-byte aligned
// (the binding pads and copies where a caller's are not: the kernels copy 16 bytes at a time).
struct AttentionBackwardHalfParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;  // (batch, heads, seq_q), from the 16-bit forward (step 27)
  float* delta = nullptr;      // (batch, heads, seq_q): scratch for D = rowsum(dout * out), in float32
  float* dq_accum = nullptr;   // like q, float32, zeros: dQ summed over the key blocks before it is rounded (step 29)
  void* dq = nullptr;          // written
  void* dk = nullptr;
  void* dv = nullptr;
  bool bf16 = false;  // bfloat16 (true) or float16 (false), every 16-bit tensor the same type
  int batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  float scale = 1.0f;
  bool causal = false;
};
