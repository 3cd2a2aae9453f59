// The device library (see common.cuh): what task 5's decode kernels share, the float32 cache's
// (kernels/decode.cu) and the 16-bit cache's (kernels/decode_half.cu).
#pragma once

#include <cuda_runtime.h>

// The position sequence b's new rows start at, or -1 when they would not all fit in the cache (a value
// from GPU memory nobody checked): then that sequence writes nothing.
__device__ __forceinline__ int first_position(const int* __restrict__ pos, int b, int n_new, int max_seq) {
  const int p = pos[b];
  return p >= 0 && p <= max_seq - n_new ? p : -1;
}

// sum_over_group<G, Q>(dot, g), below: one row's Q partial dot products (this lane's columns of q_i . k),
// each summed over the G lanes of the group, the Q sums in every lane of it. One butterfly per query would take
// Q log2(G) shuffles per row, and with 4 or 8 queries that, not memory, bounds the kernel. So
// while there are several values, each pair of lanes splits them: the lane with the bit of O
// set keeps the upper half and adds its partner's copy of it, the other lane the lower half
// (Q - 1 shuffles in all, halving the values per lane each time). Then lane g holds query
// g / (G / Q)'s sum over the bits it split on; a butterfly over the remaining lanes completes
// it, and each query's sum is broadcast from a lane that holds it: Q - 1 + log2(G / Q) + Q
// shuffles (10 instead of 20 for 4 queries at G = 32). Every lane of the warp must call it.

// One split: of the first N values of v: the lanes with the bit O of g set keep (and complete) the upper half.
template <int N, int O>
__device__ __forceinline__ void keep_half(float* v, int g) {
  const bool upper = (g & O) != 0;
#pragma unroll
  for (int j = 0; j < N / 2; ++j) {
    const float keep = upper ? v[j + N / 2] : v[j];
    const float send = upper ? v[j] : v[j + N / 2];
    v[j] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}

template <int G, int Q>
__device__ __forceinline__ void sum_over_group(float (&dot)[Q], int g) {
  if constexpr (Q == 1 || G < Q) {  // a butterfly per query (too few lanes to split Q values)
#pragma unroll
    for (int i = 0; i < Q; ++i)
#pragma unroll
      for (int offset = G / 2; offset > 0; offset /= 2) dot[i] += __shfl_xor_sync(0xffffffffu, dot[i], offset);
  } else {
    float v[Q];
#pragma unroll
    for (int i = 0; i < Q; ++i) v[i] = dot[i];
    static_assert(Q <= 8, "sum_over_group splits at most 8 values");
    keep_half<Q, G / 2>(v, g);  // v[j]: query (g & G/2 ? Q/2 : 0) + j
    if constexpr (Q >= 4) keep_half<Q / 2, G / 4>(v, g);
    if constexpr (Q >= 8) keep_half<Q / 4, G / 8>(v, g);
#pragma unroll
    for (int offset = G / Q / 2; offset > 0; offset /= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
#pragma unroll
    for (int i = 0; i < Q; ++i) dot[i] = __shfl_sync(0xffffffffu, v[0], i * (G / Q), G);
  }
}

// The groups' online-softmax states merged (steps 2 and 3): per query, the row max m, the row sum l
// and the numerator o of column threadIdx.x (valid for threadIdx.x < head_dim).
template <int Q>
struct Merged {
  float m[Q], l[Q], o[Q];
};

// Where a block's queries and cache rows are: blockIdx.x counts (batch, kv_head,
// chunk), a chunk being up to Q of the group's query heads.
//   q, out:  (batch, heads, head_dim);  k_cache, v_cache: (batch, kv_heads, max_seq, head_dim)
// length: one int per sequence, the positions of its cache written so far. key_start (nullptr,
// or one int per sequence): a batch padded on the left; sequence b's keys start at
// key_start[b] and the rows before it never take weight. So sequence b's rows are
// [key_start[b], length[b]); values from GPU memory outside 0 <= key_start < length <= max_seq
// make the block `invalid`: it reads nothing and writes NaN.
struct BlockRows {
  size_t first_query;  // index of the block's first query head in (batch * heads)
  int queries;         // how many query heads it has (at most Q)
  size_t cache_head;   // index of the key/value head in (batch * kv_heads)
  int begin, end;      // the cached rows that count: [key_start (or 0), length)
  bool invalid;        // the sequence's length or key_start is out of range
};

template <int Q>
__device__ BlockRows block_rows(int heads, int kv_heads, const int* length, const int* key_start, int max_seq) {
  const int group = heads / kv_heads, chunks = (group + Q - 1) / Q;
  const int cache_head = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int batch = cache_head / kv_heads, kv_head = cache_head % kv_heads;
  const int head = kv_head * group + chunk * Q;  // the first query head, within its sequence
  const int begin = key_start != nullptr ? key_start[batch] : 0, end = length[batch];
  const bool invalid = !(0 <= begin && begin < end && end <= max_seq);
  return BlockRows{(size_t)batch * heads + head, min(Q, group - chunk * Q), (size_t)cache_head,
                   invalid ? 0 : begin, invalid ? 0 : end, invalid};
}

// A paged cache (steps 5 and 7): a pool of pages (num_pages, kv_heads, page_size, head_dim), page_size
// a power of two (page_shift its log2), and the block table (batch, max_pages): sequence b's position p
// lies in page table[b * max_pages + p / page_size]. table == nullptr: a contiguous cache.
struct Paging {
  const int* table;
  int max_pages, num_pages, page_shift;
};

// page_size's log2, or -1 when it is not a power of two (the launchers' check).
inline int page_shift_of(int page_size) {
  int shift = 0;
  while (shift < 30 && (1 << shift) < page_size) ++shift;
  return (1 << shift) == page_size ? shift : -1;
}

// The block table of block b's sequence. A sequence whose table names a page outside the pool for a
// row it holds makes b invalid (it reads nothing and writes NaN). Every thread of the block calls
// this: it ends with a barrier.
__device__ __forceinline__ const int* sequence_pages(BlockRows& b, int kv_heads, const Paging& paging) {
  const int* table = paging.table + (b.cache_head / kv_heads) * paging.max_pages;
  bool outside = false;
  if (!b.invalid)
    for (int i = (b.begin >> paging.page_shift) + threadIdx.x; i <= (b.end - 1) >> paging.page_shift; i += blockDim.x)
      outside |= table[i] < 0 || table[i] >= paging.num_pages;
  if (__syncthreads_or(outside)) b.invalid = true, b.begin = b.end = 0;
  return table;
}
