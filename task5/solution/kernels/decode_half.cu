// Task 5, optional part (README, Task 5, step 6): the KV cache in bf16 or fp16.
//
// The same decode as decode.cu, over a cache of 16-bit values: q, the new keys and values, the
// cache and out all bfloat16 or all float16; the scores, the online softmax and the accumulators
// stay in float32. A decode step reads the whole cache once and does little else, so its time is
// the cache's size over the memory bandwidth: 16-bit values halve the bytes per cached position,
// and with them the time of a step (and let a GPU hold twice the positions).
//
// What changes from decode.cu is how a row is read. A lane still loads 16 bytes at a time, but
// these are 8 values, not 4: with head_dim a multiple of 8 (and rows 16-byte aligned), a row is
// read by G = head_dim / 8 lanes (rounded up to a power of two), each converting its 8 values to
// float32 in registers; otherwise by all 32 lanes, one value at a time (4 per lane at most).
// Everything after the conversion is decode.cu's: the groups of G lanes, UNROLL rows of K and V
// in flight per lane (half as many in a block of 4 query heads: its registers), up to MAX_QUERIES
// query heads of a group per block, the merge of the groups,
// and split-KV with a combining kernel (the partial outputs in float32, the output in 16 bits).
// Step 7 (optional) reads a paged cache of 16-bit values, as decode.cu's step 5 does for float32: the
// same pool of pages and block table, the same lookup (CacheRows below).
//
// The kernels trust their arguments (task5/binding.cpp checks the tensors, and the values from
// the host); values read from GPU memory are checked where they are read, as in decode.cu: a
// write outside the cache is skipped, and a sequence whose length or key_start is out of range
// gets NaN.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "device/common.cuh"  // WARP, LOG2E, ceil_div
#include "device/decode.cuh"  // first_position, sum_over_group, Merged, block_rows, Paging, sequence_pages
#include "device/half.cuh"    // Half<T>: bf16 and fp16 to and from float, unpack8 (a 16-byte load to 8 floats)
#include "device/params.h"    // CacheUpdateParams, DecodeParams: what the launchers take from the binding

namespace {  // decode.cu has kernels and helpers of the same names: these stay in this file

constexpr int DECODE_WARPS = 16;  // warps per block
constexpr int UNROLL = 4;         // rows of K (and of V) each lane has in flight (a block of 4 query heads: half)
constexpr int MAX_QUERIES = 4;    // query heads of one group a block attends with at once
constexpr int MAX_HEAD_DIM = 128;
constexpr int MAX_SPLITS = 256;
constexpr int COMBINE_PARTS = 8;
static_assert(DECODE_WARPS * WARP >= MAX_HEAD_DIM && DECODE_WARPS * WARP <= 1024,
              "the groups are merged one output column per thread");

// A lane works on E values of a row: with 16-byte loads (VEC = 8) the 8 columns 8 g .. 8 g + 7
// of lane g of its group of G; with scalar loads (VEC = 1, G = 32) columns g + 32 e, e < 4.
template <int VEC, int G>
struct RowSplit {
  static constexpr int ROWS = WARP / G;            // rows a warp reads at once
  static constexpr int E = VEC == 8 ? 8 : 4;       // values per lane
  static_assert(VEC == 8 || (VEC == 1 && G == WARP), "scalar loads use the whole warp per row");
  __device__ static int column(int g, int e) { return VEC == 8 ? 8 * g + e : g + WARP * e; }
};

// k_new, v_new: (batch * kv_heads, n_new, head_dim); k_cache, v_cache: (batch * kv_heads, max_seq,
// head_dim); sequence b's new rows go to positions pos[b] .. pos[b] + n_new - 1. As decode.cu's
// update, for 16-bit values.
template <typename T>
__global__ void update_cache_kernel(const T* __restrict__ k_new, const T* __restrict__ v_new,
                                    T* __restrict__ k_cache, T* __restrict__ v_cache, int batch, int kv_heads,
                                    int n_new, int max_seq, int head_dim, const int* __restrict__ pos) {
  // BEGIN SOLUTION "step 6: copy each new 16-bit row of K and V into the cache at position pos[b] + its index"
  const size_t row_values = (size_t)n_new * head_dim;
  const size_t total = (size_t)batch * kv_heads * row_values;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const size_t bh = i / row_values, within = i % row_values;
    const int p = first_position(pos, (int)(bh / kv_heads), n_new, max_seq);
    if (p < 0) continue;
    const size_t dst = (bh * max_seq + p) * head_dim + within;
    k_cache[dst] = k_new[i];
    v_cache[dst] = v_new[i];
  }
  // END SOLUTION
}

// Step 7 (optional): append new 16-bit keys and values to a paged cache, as decode.cu's
// update_paged_kernel (step 5) does for float32. k_new, v_new: (batch * kv_heads, n_new, head_dim);
// k_pages, v_pages: (num_pages, kv_heads, page_size, head_dim); table: (batch, max_pages); pos: (batch,).
// Sequence b's new row t goes to position pos[b] + t: page table[b * max_pages + (pos[b] + t) / page_size].
// A sequence whose rows would not fit in its max_pages pages writes nothing (first_position), and a row
// whose page is not in the pool (a table entry outside 0 .. num_pages - 1) is not written.
template <typename T>
__global__ void update_paged_kernel(const T* __restrict__ k_new, const T* __restrict__ v_new,
                                    T* __restrict__ k_pages, T* __restrict__ v_pages, const int* __restrict__ table,
                                    int max_pages, int num_pages, int page_shift, int batch, int kv_heads, int n_new,
                                    int head_dim, const int* __restrict__ pos) {
  // BEGIN SOLUTION "step 7: copy each new 16-bit row into its page: the block table gives the page of pos[b] + t"
  const int page_size = 1 << page_shift;
  const size_t row_values = (size_t)n_new * head_dim;
  const size_t total = (size_t)batch * kv_heads * row_values;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const size_t bh = i / row_values, within = i % row_values;
    const int b = (int)(bh / kv_heads), h = (int)(bh % kv_heads), t = (int)(within / head_dim);
    const int p = first_position(pos, b, n_new, max_pages * page_size);
    if (p < 0) continue;
    const int page = table[(size_t)b * max_pages + ((p + t) >> page_shift)];
    if (page < 0 || page >= num_pages) continue;
    const size_t dst = (((size_t)page * kv_heads + h) * page_size + ((p + t) & (page_size - 1))) * head_dim +
                       within % head_dim;
    k_pages[dst] = k_new[i];
    v_pages[dst] = v_new[i];
  }
  // END SOLUTION
}

// Where one head's cached rows lie, as decode.cu's CacheRows, in 16-bit values: a contiguous cache keeps
// a head's max_seq rows one after another; a paged one (step 7) a pool of pages and the sequence's block
// table. Call offset(row) only for a row the sequence holds (row < end): a paged cache reads the block
// table there. PAGED is a compiled choice here (the kernels come in both): the paged fields' registers would
// push the contiguous kernels of 4 queries a block past their 128 registers a thread.
template <typename T, bool PAGED>
struct CacheRows {
  const T* k;          // contiguous: the head's row 0; paged: the head's row 0 of page 0 of the pool
  const T* v;
  const int* table;    // paged: the sequence's block table
  int page_shift;      // paged: log2(page_size)
  size_t page_values;  // paged: values from one page of the pool to the next (kv_heads * page_size * head_dim)
  int head_dim;

  // Where cached row `row` starts, in values from k (and from v).
  __device__ __forceinline__ size_t offset(int row) const {
    if constexpr (!PAGED) return (size_t)row * head_dim;
    // BEGIN SOLUTION "step 7: step 5's lookup, the row's page from the block table, then the row in the page"
    const int page = table[row >> page_shift], within = row & ((1 << page_shift) - 1);
    return (size_t)page * page_values + (size_t)within * head_dim;
    // SKELETON
    // return (size_t)row * head_dim;
    // END SOLUTION
  }
};

// Given: where the block's head's rows lie, contiguous or paged (as decode.cu's cache_rows; every thread
// of the block calls it: it ends with a barrier when paged).
template <typename T, bool PAGED>
__device__ __forceinline__ CacheRows<T, PAGED> cache_rows(BlockRows& b, const T* k_cache, const T* v_cache,
                                                          int kv_heads, int max_seq, int head_dim,
                                                          const Paging& paging) {
  if constexpr (!PAGED) {
    const size_t at = b.cache_head * max_seq * head_dim;
    return CacheRows<T, PAGED>{k_cache + at, v_cache + at, nullptr, 0, 0, head_dim};
  }
  const int head = (int)(b.cache_head % kv_heads);
  const int* table = sequence_pages(b, kv_heads, paging);
  const size_t page_values = ((size_t)kv_heads << paging.page_shift) * head_dim;
  const size_t at = ((size_t)head << paging.page_shift) * head_dim;
  return CacheRows<T, PAGED>{k_cache + at, v_cache + at, table, paging.page_shift, page_values, head_dim};
}

// Q queries against rows [begin, end) of one head's cache (`rows`: where they lie), as decode.cu's
// attend_rows: groups of G lanes, each with its own online softmax per query, merged at the end.
template <typename T, int VEC, int G, int Q, bool PAGED>
__device__ Merged<Q> attend_rows(const T* __restrict__ q, int queries, const CacheRows<T, PAGED>& rows, int head_dim,
                                 int begin, int end, float scale_log2) {
  // Given: a block of 4 query heads holds half the rows in flight. Paged, the lookups' registers would push it past
  // a thread's 128 (16 warps a block) and ptxas would spill; contiguous too, so that both sum the rows in the same
  // order (step 7's decode is step 6's, bit for bit)
  constexpr int UNROLL = Q > 2 && ::UNROLL > 1 ? ::UNROLL / 2 : ::UNROLL;
  using Split = RowSplit<VEC, G>;
  constexpr int E = Split::E;
  constexpr int GROUPS = DECODE_WARPS * Split::ROWS;
  __shared__ float group_m[GROUPS], group_l[GROUPS];
  __shared__ float group_acc[DECODE_WARPS * WARP * 8];  // GROUPS * head_dim <= this

  const int g = threadIdx.x % G;     // this lane's place in its group (G divides the warp)
  const int grp = threadIdx.x / G;  // this lane's group in the block
  Merged<Q> result;
#pragma unroll
  for (int i = 0; i < Q; ++i) result.m[i] = -INFINITY, result.l[i] = 0.0f, result.o[i] = 0.0f;

  float qv[Q][E], acc[Q][E], m[Q], l[Q];
#pragma unroll
  for (int i = 0; i < Q; ++i) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int c = Split::column(g, e);
      qv[i][e] = i < queries && c < head_dim ? Half<T>::to_float(q[i * head_dim + c]) * scale_log2 : 0.0f;
      acc[i][e] = 0.0f;
    }
    m[i] = -INFINITY, l[i] = 0.0f;
  }

  for (int round = begin; round < end; round += UNROLL * GROUPS) {
    // Issue every load of this round before using any: UNROLL rows of K and of V, 16 bytes a lane
    // (VEC = 8) or one value per column (VEC = 1), kept as loaded until they are used.
    uint4 k_raw[UNROLL], v_raw[UNROLL];
    float kv[VEC == 8 ? 1 : UNROLL][4], vv[VEC == 8 ? 1 : UNROLL][4];
    // BEGIN SOLUTION "step 6: load UNROLL rows of K and V, 16 bytes (8 values) a lane, zeros for rows past the end"
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int row = round + u * GROUPS + grp;
      const size_t at = row < end ? rows.offset(row) : 0;  // where the row lies (rows past end: not loaded)
      const T* k_row = rows.k + at;
      const T* v_row = rows.v + at;
      if constexpr (VEC == 8) {
        const bool ok = row < end && 8 * g < head_dim;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        k_raw[u] = ok ? *reinterpret_cast<const uint4*>(k_row + 8 * g) : zero;
        v_raw[u] = ok ? *reinterpret_cast<const uint4*>(v_row + 8 * g) : zero;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = Split::column(g, e);
          const bool ok = row < end && c < head_dim;
          kv[u][e] = ok ? Half<T>::to_float(k_row[c]) : 0.0f;
          vv[u][e] = ok ? Half<T>::to_float(v_row[c]) : 0.0f;
        }
      }
    }
    // END SOLUTION
    float s[Q][UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float key[E];
      // BEGIN SOLUTION "step 6: each row's values as float32, then decode.cu's scores"
      if constexpr (VEC == 8) {
        Half<T>::unpack8(k_raw[u], key);
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) key[e] = kv[u][e];
      }
      float dot[Q];
#pragma unroll
      for (int i = 0; i < Q; ++i) {
        dot[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) dot[i] = fmaf(qv[i][e], key[e], dot[i]);
      }
      sum_over_group<G, Q>(dot, g);
      const bool valid = round + u * GROUPS + grp < end;
#pragma unroll
      for (int i = 0; i < Q; ++i) s[i][u] = valid ? dot[i] : -INFINITY;
      // END SOLUTION
    }
#pragma unroll
    for (int i = 0; i < Q; ++i) {
      float round_max = -INFINITY;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) round_max = fmaxf(round_max, s[i][u]);
      const float m_new = fmaxf(m[i], round_max);
      if (m_new == -INFINITY) continue;
      const float alpha = exp2f(m[i] - m_new);
      l[i] *= alpha;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[i][e] *= alpha;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const float p = exp2f(s[i][u] - m_new);
        l[i] += p;
        float value[E];
        // BEGIN SOLUTION "step 6: the row of V as float32 too"
        if constexpr (VEC == 8) {
          Half<T>::unpack8(v_raw[u], value);
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) value[e] = vv[u][e];
        }
        // END SOLUTION
#pragma unroll
        for (int e = 0; e < E; ++e) acc[i][e] = fmaf(p, value[e], acc[i][e]);
      }
      m[i] = m_new;
    }
  }

  // Merge the groups, one query at a time (decode.cu's).
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    if (g == 0) group_m[grp] = m[i], group_l[grp] = l[i];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int c = Split::column(g, e);
      if (c < head_dim) group_acc[grp * head_dim + c] = acc[i][e];
    }
    __syncthreads();
    if (threadIdx.x < head_dim) {
      float big = -INFINITY;
      for (int j = 0; j < GROUPS; ++j) big = fmaxf(big, group_m[j]);
      float sum = 0.0f, o = 0.0f;
      if (big != -INFINITY) {
        for (int j = 0; j < GROUPS; ++j) {
          const float w = exp2f(group_m[j] - big);
          sum = fmaf(group_l[j], w, sum);
          o = fmaf(group_acc[j * head_dim + threadIdx.x], w, o);
        }
      }
      result.m[i] = big, result.l[i] = sum, result.o[i] = o;
    }
    __syncthreads();
  }
  return result;
}

template <typename T>
__device__ __forceinline__ void write_nan(T* __restrict__ rows, int count, int head_dim) {
  for (int i = threadIdx.x; i < count * head_dim; i += blockDim.x) rows[i] = Half<T>::from_float(NAN);
}

// Two blocks per SM for one query a block (as decode.cu), else one.
template <int VEC, int G, int Q>
constexpr int MIN_BLOCKS_PER_SM = Q == 1 && VEC == 8 && G > 1 ? 2 : 1;

// q, out: (batch, heads, head_dim); k_cache, v_cache: (batch, kv_heads, max_seq, head_dim), or the pools of a
// paged cache (paging.table set, step 7).
template <typename T, int VEC, int G, int Q, bool PAGED>
__global__ void __launch_bounds__(DECODE_WARPS * WARP, MIN_BLOCKS_PER_SM<VEC, G, Q>)
    decode_kernel(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                  T* __restrict__ out, int heads, int kv_heads, const int* __restrict__ length,
                  const int* __restrict__ key_start, int max_seq, int head_dim, float scale_log2, Paging paging) {
  BlockRows b = block_rows<Q>(heads, kv_heads, length, key_start, max_seq);
  const CacheRows<T, PAGED> rows = cache_rows<T, PAGED>(b, k_cache, v_cache, kv_heads, max_seq, head_dim, paging);
  if (b.invalid) return write_nan(out + b.first_query * head_dim, b.queries, head_dim);
  const Merged<Q> r = attend_rows<T, VEC, G, Q, PAGED>(q + b.first_query * head_dim, b.queries, rows, head_dim,
                                                       b.begin, b.end, scale_log2);
  // BEGIN SOLUTION "step 6: write out = O / L in the 16-bit type"
#pragma unroll
  for (int i = 0; i < Q; ++i)
    if (i < b.queries && threadIdx.x < head_dim)
      out[(b.first_query + i) * head_dim + threadIdx.x] = Half<T>::from_float(r.o[i] / r.l[i]);
  // SKELETON
  // (void)r, (void)out;
  // END SOLUTION
}

// Split-KV (decode.cu's step 3): the partial outputs and log-sum-exps in float32.
// partial_out: (batch * heads, splits, head_dim); partial_lse: (batch * heads, splits).
template <typename T, int VEC, int G, int Q, bool PAGED>
__global__ void __launch_bounds__(DECODE_WARPS * WARP, MIN_BLOCKS_PER_SM<VEC, G, Q>)
    decode_split_kernel(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                        float* __restrict__ partial_out, float* __restrict__ partial_lse, int heads, int kv_heads,
                        const int* __restrict__ length, const int* __restrict__ key_start, int max_seq,
                        int head_dim, float scale_log2, Paging paging) {
  BlockRows b = block_rows<Q>(heads, kv_heads, length, key_start, max_seq);
  const CacheRows<T, PAGED> rows = cache_rows<T, PAGED>(b, k_cache, v_cache, kv_heads, max_seq, head_dim, paging);
  const int split = blockIdx.y, splits = gridDim.y;
  if (b.invalid) {  // NaN partial outputs of weight 1: the combined output is NaN too
    for (int i = 0; i < b.queries; ++i) {
      const size_t slot = (b.first_query + i) * splits + split;
      for (int c = threadIdx.x; c < head_dim; c += blockDim.x) partial_out[slot * head_dim + c] = NAN;
      if (threadIdx.x == 0) partial_lse[slot] = 0.0f;
    }
    return;
  }
  const int rows_per_split = (b.end - b.begin + splits - 1) / splits;
  const int begin = min(b.end, b.begin + split * rows_per_split), end = min(b.end, begin + rows_per_split);
  const Merged<Q> r = attend_rows<T, VEC, G, Q, PAGED>(q + b.first_query * head_dim, b.queries, rows, head_dim,
                                                       begin, end, scale_log2);
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    if (i >= b.queries) break;
    const size_t slot = (b.first_query + i) * splits + split;
    if (threadIdx.x < head_dim)
      partial_out[slot * head_dim + threadIdx.x] = r.l[i] > 0.0f ? r.o[i] / r.l[i] : 0.0f;
    if (threadIdx.x == 0) partial_lse[slot] = r.l[i] > 0.0f ? r.m[i] + log2f(r.l[i]) : -INFINITY;
  }
}

// decode.cu's combining kernel, writing the 16-bit output.
template <typename T>
__global__ void __launch_bounds__(MAX_HEAD_DIM * COMBINE_PARTS)
    combine_splits_kernel(const float* __restrict__ partial_out, const float* __restrict__ partial_lse,
                          T* __restrict__ out, int splits, int head_dim) {
  const size_t bh = blockIdx.x;
  const int c = threadIdx.x, part = threadIdx.y;
  __shared__ float weight[MAX_SPLITS];
  __shared__ float part_sum[COMBINE_PARTS][MAX_HEAD_DIM];
  const int thread = part * blockDim.x + c;
  for (int s = thread; s < splits; s += blockDim.x * blockDim.y) weight[s] = partial_lse[bh * splits + s];
  __syncthreads();
  float big = -INFINITY;
  for (int s = 0; s < splits; ++s) big = fmaxf(big, weight[s]);
  __syncthreads();
  for (int s = thread; s < splits; s += blockDim.x * blockDim.y) weight[s] = exp2f(weight[s] - big);
  __syncthreads();
  float o = 0.0f;
  if (c < head_dim)
    for (int s = part; s < splits; s += COMBINE_PARTS) o = fmaf(weight[s], partial_out[(bh * splits + s) * head_dim + c], o);
  part_sum[part][c] = o;
  __syncthreads();
  if (part == 0 && c < head_dim) {
    float sum = 0.0f, total = 0.0f;
    for (int s = 0; s < splits; ++s) sum += weight[s];
    for (int p = 0; p < COMBINE_PARTS; ++p) total += part_sum[p][c];
    out[bh * head_dim + c] = Half<T>::from_float(total / sum);
  }
}

int queries_per_block(int group) {
  int q = 1;
  while (q < group && q < MAX_QUERIES) q *= 2;
  return q;
}

template <typename T, int VEC, int G, int Q, bool PAGED>
cudaError_t launch_decode(const DecodeParams& p, const Paging& paging, cudaStream_t stream) {
  const T* q = static_cast<const T*>(p.q);
  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);
  T* out = static_cast<T*>(p.out);
  const int group = p.heads / p.kv_heads;
  const int threads = DECODE_WARPS * WARP, blocks = p.batch * p.kv_heads * ceil_div(group, Q);
  if (p.splits == 1) {
    decode_kernel<T, VEC, G, Q, PAGED><<<blocks, threads, 0, stream>>>(q, k_cache, v_cache, out, p.heads, p.kv_heads,
                                                                 p.length, p.key_start, p.max_seq, p.head_dim,
                                                                 p.scale * LOG2E, paging);
    return cudaGetLastError();
  }
  decode_split_kernel<T, VEC, G, Q, PAGED><<<dim3(blocks, p.splits), threads, 0, stream>>>(
      q, k_cache, v_cache, p.partial_out, p.partial_lse, p.heads, p.kv_heads, p.length, p.key_start, p.max_seq,
      p.head_dim, p.scale * LOG2E, paging);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  combine_splits_kernel<T><<<p.batch * p.heads, dim3(MAX_HEAD_DIM, COMBINE_PARTS), 0, stream>>>(
      p.partial_out, p.partial_lse, out, p.splits, p.head_dim);
  return cudaGetLastError();
}

// The row split from head_dim (16-byte loads need head_dim % 8 == 0 and 16-byte aligned rows),
// the queries per block from the group size.
template <typename T>
cudaError_t launch(const DecodeParams& p, const Paging& paging, cudaStream_t stream) {
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const bool vec8 = p.head_dim % 8 == 0 && aligned(p.q) && aligned(p.k_cache) && aligned(p.v_cache);
  const int lanes = (p.head_dim + 7) / 8, queries = queries_per_block(p.heads / p.kv_heads);
#define LAUNCH_Q(VEC, G, Q)                                                                            \
  (paging.table != nullptr ? launch_decode<T, VEC, G, Q, true>(p, paging, stream)                           \
                           : launch_decode<T, VEC, G, Q, false>(p, paging, stream))
#define LAUNCH(VEC, G) \
  (queries == 1 ? LAUNCH_Q(VEC, G, 1) : queries == 2 ? LAUNCH_Q(VEC, G, 2) : LAUNCH_Q(VEC, G, MAX_QUERIES))
  if (!vec8) return LAUNCH(1, 32);
  if (lanes > 8) return LAUNCH(8, 16);
  if (lanes > 4) return LAUNCH(8, 8);
  if (lanes > 2) return LAUNCH(8, 4);
  if (lanes > 1) return LAUNCH(8, 2);
  return LAUNCH(8, 1);
#undef LAUNCH
#undef LAUNCH_Q
}

// One launch of the update kernels: step 6's into a contiguous cache, step 7's into a paged one.
template <typename T>
void launch_update(const CacheUpdateParams& p, int page_shift, int blocks, cudaStream_t stream) {
  const T* k_new = static_cast<const T*>(p.k_new);
  const T* v_new = static_cast<const T*>(p.v_new);
  T* k_cache = static_cast<T*>(p.k_cache);
  T* v_cache = static_cast<T*>(p.v_cache);
  if (p.block_table != nullptr)
    update_paged_kernel<T><<<blocks, 256, 0, stream>>>(k_new, v_new, k_cache, v_cache, p.block_table, p.max_pages,
                                                       p.num_pages, page_shift, p.batch, p.kv_heads, p.n_new,
                                                       p.head_dim, p.pos);
  else
    update_cache_kernel<T><<<blocks, 256, 0, stream>>>(k_new, v_new, k_cache, v_cache, p.batch, p.kv_heads, p.n_new,
                                                       p.max_seq, p.head_dim, p.pos);
}

}  // namespace

// Launchers, called by task5/binding.cpp on PyTorch's current stream; bf16: true for bfloat16,
// false for float16 (every tensor of a call the same type).

// The new rows into a 16-bit cache, contiguous or (p.block_table, step 7) paged; the parameters are
// described in device/params.h.
cudaError_t update_cache_half(const CacheUpdateParams& p, cudaStream_t stream) {
  const bool paged = p.block_table != nullptr;
  const int page_shift = paged ? page_shift_of(p.page_size) : 0;
  if (p.batch < 0 || p.kv_heads < 1 || p.n_new < 0 || p.head_dim < 1 || (!paged && p.n_new > p.max_seq) ||
      (paged && (page_shift < 0 || p.max_pages < 1 || p.num_pages < 1)))
    return cudaErrorInvalidValue;
  const size_t total = (size_t)p.batch * p.kv_heads * p.n_new * p.head_dim;
  if (total == 0) return cudaSuccess;
  const int blocks = (int)std::min<size_t>((total + 255) / 256, 65535 * 8);
  if (p.bf16)
    launch_update<__nv_bfloat16>(p, page_shift, blocks, stream);
  else
    launch_update<__half>(p, page_shift, blocks, stream);
  return cudaGetLastError();
}

// A decode step over a 16-bit cache, contiguous or (p.block_table, step 7) paged, in p.splits blocks per
// (batch, kv_head, chunk): 1, or decode.cu's decode_splits, with the partial outputs in float32; the
// parameters are described in device/params.h.
cudaError_t decode_half_forward(const DecodeParams& p, cudaStream_t stream) {
  const bool paged = p.block_table != nullptr;
  const int page_shift = paged ? page_shift_of(p.page_size) : 0;
  if (p.batch < 0 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0 || p.length == nullptr ||
      p.max_seq < 1 || p.head_dim < 1 || p.head_dim > MAX_HEAD_DIM || p.splits < 1 || p.splits > MAX_SPLITS ||
      (p.splits > 1 && (p.partial_out == nullptr || p.partial_lse == nullptr)) ||
      (paged && (page_shift < 0 || p.max_pages < 1 || p.num_pages < 1 || p.max_seq != p.max_pages * p.page_size)))
    return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  const Paging paging{p.block_table, p.max_pages, p.num_pages, page_shift};
  return p.bf16 ? launch<__nv_bfloat16>(p, paging, stream) : launch<__half>(p, paging, stream);
}
