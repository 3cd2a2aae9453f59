// Task 5: the KV cache and the decode kernels.
//
// Generating text runs attention once per new token. The prompt's keys and values are
// computed once (the prefill, task 4's kernel) and kept in a cache; each later step
// projects one token, appends its K and V to the cache (update_cache), and lets its one
// query attend over every cached position (decode):
//
//   out = softmax(scale * q K[0:length]^T) V[0:length]       for every (batch, head)
//
// Each sequence of the batch has its own length, and the positions and lengths live in
// GPU memory (int32, one per sequence), read by the kernels themselves: a generation loop
// captured as a CUDA graph replays the same launches with the same arguments every step,
// so what changes from one step to the next must be in memory, not in an argument.
//
// The cache is (batch, kv_heads, max_seq, head_dim), row-major: the keys of one head are
// max_seq consecutive rows, so reading positions 0 .. length-1 of a head reads one
// contiguous stretch of memory, and neighbouring lanes read neighbouring floats.
//
// With grouped-query attention (Llama 3, Mistral, Qwen) the cache has fewer heads than the
// queries: kv_heads divides heads, and the heads / kv_heads query heads of a group share
// one key/value head (query head h reads h / (heads / kv_heads)). A block then attends
// with up to MAX_QUERIES query heads of one group at once, so each row of the cache it loads
// serves all of them: the cache is read once per group, not once per query head. That is
// what makes GQA decode fast, and kv_heads == heads is the plain case (one query a block).
//
// A decode step does little arithmetic (two multiply-adds per cached float) and reads
// the whole of K and V once: its speed is the rate it reads memory. So the kernel
// reads with wide (float4), coalesced loads, keeps many loads in flight per thread,
// and, when batch * heads is small next to the number of SMs, splits the keys of one
// head across several blocks (split-KV, "FlashDecoding"): each block writes a partial
// output with its log-sum-exp, and a second kernel combines them.
//
// Step 5 (optional) keeps the cache in pages instead, as inference engines do (PagedAttention):
// a pool of pages of page_size positions, handed out as sequences grow, and a block table per
// sequence that says which page holds which of its positions. The same kernels read it: only
// where a cached row lies changes (CacheRows below).
//
// All tensors are contiguous float32; the kernels trust their arguments: task5/binding.cpp
// checks the tensors, and the values of `pos`, `length` and `key_start` when they come from
// the host. Values in GPU memory are checked here, where they are read (reading them back to
// check them would stop the GPU every step): a write outside the cache is skipped, and a
// sequence whose length or key_start is out of range gets NaN, so it shows.
//
// Build and test:
//   python -m task5.compile            build this file (task5/kernels/decode.cu)
//   python -m task5.test               check it against a float64 reference
// Add --solution to either command to build and test the reference instead.  [reference only]

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "device/common.cuh"  // WARP, LOG2E, ceil_div
#include "device/decode.cuh"  // first_position, sum_over_group, Merged, block_rows, Paging, sequence_pages (given)
#include "device/params.h"  // CacheUpdateParams, DecodeParams: what the launchers below take from the binding

// ----------------------------------------------------------------------------
// Sizes (tune here)

// What they trade (README, Task 5, step 4; `python -m task5.tune` measures each choice):
// more warps per block put more rows in flight at once per block but make the final merge of
// the groups longer; UNROLL rows per lane loaded before any is used put more loads in
// flight per warp, for more registers. The skeleton starts untuned.
constexpr int DECODE_WARPS = 16;  // warps per block [skeleton: 4]
// Each lane loads UNROLL rows of K (and of V) before it uses any of them, so a warp has
// UNROLL loads of each in flight instead of one: memory latency is hidden by loads, not
// by arithmetic, in a kernel that does almost none.
constexpr int UNROLL = 4;  // [skeleton: 1]
// Query heads a block attends with at once (grouped-query attention): the launcher takes the
// group's size rounded up to a power of two, at most this (1, 2, 4 or 8). Each lane keeps an
// online softmax per query, about 20 registers each, so a larger group takes several blocks,
// each reading the group's cache once: 8 query heads per cached head read it twice at 4. That is
// still the faster choice here (H100, 32 query heads over 4 cached ones: 78% of the copy bandwidth
// counting each byte once, against 60% with 8 queries a block, which needs 8 warps: with 16 a
// thread may use at most 128 registers, and 8 queries spill; H200, batch 16: 52% against 42%, and
// 46% at 16 warps with 2 rows per lane ahead). Scoring each row against 8 queries, the kernel is
// bound by its instructions (shuffles, exponentials), not by memory. README, Task 5, step 4.
constexpr int MAX_QUERIES = 4;
constexpr int MAX_HEAD_DIM = 128;
constexpr int MAX_SPLITS = 256;  // the binding checks `splits` against this
constexpr int COMBINE_PARTS = 8;  // threads per column in the kernel that combines the splits
// With split-KV (step 3), no split is shorter than this many rows: below it, the combining kernel
// and the partial outputs cost more than the split saves.
[[maybe_unused]] constexpr int MIN_KEYS_PER_SPLIT = 512;  // used by decode_splits (step 3)

static_assert(DECODE_WARPS * WARP >= MAX_HEAD_DIM && DECODE_WARPS * WARP <= 1024,
              "the groups are merged one output column per thread: at least MAX_HEAD_DIM threads, at most 1024");
static_assert(UNROLL >= 1, "at least one row per lane in flight");
static_assert(MAX_QUERIES == 1 || MAX_QUERIES == 2 || MAX_QUERIES == 4 || MAX_QUERIES == 8,
              "the launcher compiles blocks of 1, 2, 4 or 8 queries");

// A lane works on up to 4 elements of a row. With float4 loads (head_dim a multiple of
// 4), a row is read by G lanes, each one float4 (G = head_dim / 4 rounded up to a power
// of two), and a warp reads 32 / G rows at once; otherwise by all 32 lanes, element e of
// lane g being column g + 32 e.
template <int VEC, int G>
struct RowSplit {
  static constexpr int ROWS = WARP / G;  // rows a warp reads at once
  static_assert(VEC == 4 || (VEC == 1 && G == WARP), "scalar loads use the whole warp per row");
  __device__ static int column(int g, int e) { return VEC == 4 ? 4 * g + e : g + WARP * e; }
};

// ----------------------------------------------------------------------------
// Step 1: append new keys and values at each sequence's position.
//
// k_new, v_new: (batch * kv_heads, n_new, head_dim); k_cache, v_cache: (batch * kv_heads,
// max_seq, head_dim); pos: (batch,), sequence b's new rows go to positions pos[b] ..
// pos[b] + n_new - 1 of each of its kv_heads heads. Nothing else is written. The given
// first_position(pos, b, n_new, max_seq) (device/decode.cuh) reads pos[b], or says -1 when those
// rows would not all fit in the cache (a value from GPU memory nobody checked): then that sequence
// writes nothing.

__global__ void update_cache_kernel(const float* __restrict__ k_new, const float* __restrict__ v_new,
                                    float* __restrict__ k_cache, float* __restrict__ v_cache, int batch,
                                    int kv_heads, int n_new, int max_seq, int head_dim,
                                    const int* __restrict__ pos) {
  // BEGIN SOLUTION "step 1: copy each new row of K and V into the cache at position pos[b] + its index"
  const size_t row_floats = (size_t)n_new * head_dim;  // one head's new rows
  const size_t total = (size_t)batch * kv_heads * row_floats;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t bh = i / row_floats, within = i % row_floats;  // within = t * head_dim + d
    const int p = first_position(pos, (int)(bh / kv_heads), n_new, max_seq);
    if (p < 0) continue;
    const size_t dst = (bh * max_seq + p) * head_dim + within;
    k_cache[dst] = k_new[i];
    v_cache[dst] = v_new[i];
  }
  // END SOLUTION
}

// ----------------------------------------------------------------------------
// Where one head's cached rows lie. A contiguous cache keeps a head's max_seq rows one after
// another. A paged cache (step 5) keeps a pool of pages, (num_pages, kv_heads, page_size,
// head_dim), and a block table per sequence: its position p lies in page table[p / page_size], at
// row p % page_size of its head's part of the page (page_size is a power of two: p >> page_shift
// and p & (page_size - 1)). Call offset(row) only for a row the sequence holds (row < end): a
// paged cache reads the block table there.
struct CacheRows {
  const float* k;      // contiguous: the head's row 0; paged: the head's row 0 of page 0 of the pool
  const float* v;
  const int* table;    // nullptr: contiguous; paged: the sequence's block table
  int page_shift;      // paged: log2(page_size)
  size_t page_floats;  // paged: floats from one page of the pool to the next (kv_heads * page_size * head_dim)
  int head_dim;

  // Where cached row `row` starts, in floats from k (and from v).
  __device__ __forceinline__ size_t offset(int row) const {
    if (table == nullptr) return (size_t)row * head_dim;
    // BEGIN SOLUTION "step 5: look the row's page up in the block table, then the row within the page"
    const int page = table[row >> page_shift], within = row & ((1 << page_shift) - 1);
    return (size_t)page * page_floats + (size_t)within * head_dim;
    // SKELETON
    // return (size_t)row * head_dim;
    // END SOLUTION
  }
};

// Step 5 (optional): append new keys and values to a paged cache, at each sequence's position.
// k_new, v_new: (batch * kv_heads, n_new, head_dim); k_pages, v_pages: (num_pages, kv_heads,
// page_size, head_dim); table: (batch, max_pages); pos: (batch,). Sequence b's new row t goes to
// position pos[b] + t: page table[b * max_pages + (pos[b] + t) / page_size]. A sequence whose rows
// would not fit in its max_pages pages writes nothing (first_position), and a row whose page is
// not in the pool (a table entry outside 0 .. num_pages - 1) is not written.
__global__ void update_paged_kernel(const float* __restrict__ k_new, const float* __restrict__ v_new,
                                    float* __restrict__ k_pages, float* __restrict__ v_pages,
                                    const int* __restrict__ table, int max_pages, int num_pages, int page_shift,
                                    int batch, int kv_heads, int n_new, int head_dim, const int* __restrict__ pos) {
  // BEGIN SOLUTION "step 5: copy each new row into its page: the block table gives the page of position pos[b] + t"
  const int page_size = 1 << page_shift;
  const size_t row_floats = (size_t)n_new * head_dim;
  const size_t total = (size_t)batch * kv_heads * row_floats;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t bh = i / row_floats, within = i % row_floats;
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

// ----------------------------------------------------------------------------
// Steps 2 and 3: Q queries (query heads of one group) against rows [begin, end) of
// their key/value head's cache.
//
// The block's lanes are split into groups of G, each reading one row at a time; group
// `grp` of the block reads rows begin + grp, begin + grp + GROUPS, ...; each group keeps
// its own online softmax per query (m, l and the unnormalised acc for its lanes' columns),
// as in task 4: a row, once loaded, is scored against every query. At the end the groups'
// states are merged through shared memory, for each query:
//
//   M = max m_grp,   L = sum l_grp exp(m_grp - M),   O = sum acc_grp exp(m_grp - M)
//
// and thread t < head_dim returns (M, L, O[t]) of each query for column t. Scores are kept
// in base 2 (q is pre-multiplied by scale * log2 e), so exp2f does the exponentials.

// Merged<Q> (device/decode.cuh): per query, the row max m, the row sum l and the numerator o of
// column threadIdx.x (valid for threadIdx.x < head_dim).
// q: `queries` (at most Q) consecutive rows of head_dim floats; the slots past them are
// computed on zeros and never written. rows: where the head's cached rows lie (row r of K at
// rows.k + rows.offset(r), of V at rows.v + the same; CacheRows above).
template <int VEC, int G, int Q>
__device__ Merged<Q> attend_rows(const float* __restrict__ q, int queries, const CacheRows& rows, int head_dim,
                                 int begin, int end, float scale_log2) {
  using Split = RowSplit<VEC, G>;
  constexpr int GROUPS = DECODE_WARPS * Split::ROWS;
  // One query's states at a time (the merge goes query by query): Q times this would not fit.
  __shared__ float group_m[GROUPS], group_l[GROUPS];
  __shared__ float group_acc[DECODE_WARPS * WARP * 4];  // GROUPS * head_dim <= this

  const int lane = threadIdx.x % WARP, g = lane % G;
  const int grp = threadIdx.x / G;  // this lane's group in the block
  Merged<Q> result;
#pragma unroll
  for (int i = 0; i < Q; ++i) result.m[i] = -INFINITY, result.l[i] = 0.0f, result.o[i] = 0.0f;

  // BEGIN SOLUTION "step 2: this group's online softmax over its rows, then merge the groups"
  float qv[Q][4], acc[Q][4], m[Q], l[Q];
#pragma unroll
  for (int i = 0; i < Q; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = Split::column(g, e);
      qv[i][e] = i < queries && c < head_dim ? q[i * head_dim + c] * scale_log2 : 0.0f;
      acc[i][e] = 0.0f;
    }
    m[i] = -INFINITY, l[i] = 0.0f;
  }

  // Rounds are the same for the whole block (shuffles need every lane of a warp); a row
  // past `end` is not loaded and scores -inf.
  for (int round = begin; round < end; round += UNROLL * GROUPS) {
    float kv[UNROLL][4], vv[UNROLL][4], s[Q][UNROLL];
    // Issue every load of this round before using any: UNROLL rows of K and of V.
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int row = round + u * GROUPS + grp;
      const size_t at = row < end ? rows.offset(row) : 0;  // where the row lies (rows past end: not loaded)
      const float* k_row = rows.k + at;
      const float* v_row = rows.v + at;
      if constexpr (VEC == 4) {
        const bool ok = row < end && 4 * g < head_dim;
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 kf = ok ? *reinterpret_cast<const float4*>(k_row + 4 * g) : zero;
        const float4 vf = ok ? *reinterpret_cast<const float4*>(v_row + 4 * g) : zero;
        kv[u][0] = kf.x, kv[u][1] = kf.y, kv[u][2] = kf.z, kv[u][3] = kf.w;
        vv[u][0] = vf.x, vv[u][1] = vf.y, vv[u][2] = vf.z, vv[u][3] = vf.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = Split::column(g, e);
          const bool ok = row < end && c < head_dim;
          kv[u][e] = ok ? k_row[c] : 0.0f;
          vv[u][e] = ok ? v_row[c] : 0.0f;
        }
      }
    }
    // Scores: each lane's part of q_i . k for every query, summed over the G lanes of the group
    // (every lane of the warp takes part in the shuffles, rows past the end included).
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float dot[Q];
#pragma unroll
      for (int i = 0; i < Q; ++i) {
        dot[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) dot[i] = fmaf(qv[i][e], kv[u][e], dot[i]);
      }
      sum_over_group<G, Q>(dot, g);
      const bool valid = round + u * GROUPS + grp < end;
#pragma unroll
      for (int i = 0; i < Q; ++i) s[i][u] = valid ? dot[i] : -INFINITY;
    }
#pragma unroll
    for (int i = 0; i < Q; ++i) {
      float round_max = -INFINITY;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) round_max = fmaxf(round_max, s[i][u]);
      // Online softmax of query i. m_new is -inf only while this group has had no row at all.
      const float m_new = fmaxf(m[i], round_max);
      if (m_new == -INFINITY) continue;
      const float alpha = exp2f(m[i] - m_new);  // 0 on the group's first row (m = -inf)
      l[i] *= alpha;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] *= alpha;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const float p = exp2f(s[i][u] - m_new);  // 0 for rows past the end
        l[i] += p;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = fmaf(p, vv[u][e], acc[i][e]);
      }
      m[i] = m_new;
    }
  }

  // Merge the groups, one query at a time: each group writes its state, then thread t merges
  // column t.
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    if (g == 0) group_m[grp] = m[i], group_l[grp] = l[i];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = Split::column(g, e);
      if (c < head_dim) group_acc[grp * head_dim + c] = acc[i][e];
    }
    __syncthreads();
    if (threadIdx.x < head_dim) {
      float big = -INFINITY;
      for (int j = 0; j < GROUPS; ++j) big = fmaxf(big, group_m[j]);
      float sum = 0.0f, o = 0.0f;
      if (big != -INFINITY) {  // -inf: no group had a row (an empty split)
        for (int j = 0; j < GROUPS; ++j) {
          const float w = exp2f(group_m[j] - big);
          sum = fmaf(group_l[j], w, sum);
          o = fmaf(group_acc[j * head_dim + threadIdx.x], w, o);
        }
      }
      result.m[i] = big, result.l[i] = sum, result.o[i] = o;
    }
    __syncthreads();  // every thread has read query i's states before query i + 1's overwrite them
  }
  // SKELETON
  // (void)q, (void)queries, (void)rows, (void)begin, (void)end, (void)scale_log2, (void)group_m;
  // (void)group_l, (void)group_acc, (void)lane, (void)g, (void)grp, (void)UNROLL;
  // END SOLUTION
  return result;
}

// Where a block's queries and cache rows are: block_rows<Q>(...) and its BlockRows, given (device/decode.cuh).
// blockIdx.x counts (batch, kv_head, chunk), a chunk being up to Q of the group's query heads;
//   q, out:  (batch, heads, head_dim);  k_cache, v_cache: (batch, kv_heads, max_seq, head_dim).

// Given: NaN in `count` consecutive rows of head_dim floats, from every thread of the block:
// the output of a sequence whose length or key_start is out of range.
__device__ __forceinline__ void write_nan(float* __restrict__ rows, int count, int head_dim) {
  for (int i = threadIdx.x; i < count * head_dim; i += blockDim.x) rows[i] = NAN;
}

// Given: where the block's head's rows lie (CacheRows), contiguous or paged (Paging, device/decode.cuh); with
// pages, a sequence whose table names a page outside the pool for a row it holds becomes invalid (every
// thread of the block calls this: it ends with a barrier).
__device__ __forceinline__ CacheRows cache_rows(BlockRows& b, const float* k_cache, const float* v_cache, int kv_heads,
                                int max_seq, int head_dim, const Paging& paging) {
  if (paging.table == nullptr) {
    const size_t at = b.cache_head * max_seq * head_dim;  // the cache itself: no copy, no slice
    return CacheRows{k_cache + at, v_cache + at, nullptr, 0, 0, head_dim};
  }
  const int head = (int)(b.cache_head % kv_heads);
  const int* table = sequence_pages(b, kv_heads, paging);  // given (device/decode.cuh): pages outside the pool
  const size_t page_floats = ((size_t)kv_heads << paging.page_shift) * head_dim;
  const size_t at = ((size_t)head << paging.page_shift) * head_dim;
  return CacheRows{k_cache + at, v_cache + at, table, paging.page_shift, page_floats, head_dim};
}

// Step 2: one block per (batch, key/value head, chunk of its query heads), over the cached
// rows [begin, length). __launch_bounds__'s second number is the blocks an SM must be able to
// hold at once, which caps the registers a thread may use: two blocks of one query (64 registers
// a thread at 16 warps), so that one block's start and final merge overlap the other's loads
// (H200: batch 64, 8 heads, 1000 cached tokens from 91% to 97% of the copy bandwidth); one block of
// more queries, which need up to 128 registers, and of scalar loads or rows of at most 4 floats,
// which would spill a few registers at 64.
template <int VEC, int G, int Q>
constexpr int MIN_BLOCKS_PER_SM = Q == 1 && VEC == 4 && G > 1 ? 2 : 1;

template <int VEC, int G, int Q>
__global__ void __launch_bounds__(DECODE_WARPS * WARP, MIN_BLOCKS_PER_SM<VEC, G, Q>)
    decode_kernel(const float* __restrict__ q, const float* __restrict__ k_cache,
                  const float* __restrict__ v_cache, float* __restrict__ out, int heads, int kv_heads,
                  const int* __restrict__ length, const int* __restrict__ key_start, int max_seq, int head_dim,
                  float scale_log2, Paging paging) {
  BlockRows b = block_rows<Q>(heads, kv_heads, length, key_start, max_seq);
  const CacheRows rows = cache_rows(b, k_cache, v_cache, kv_heads, max_seq, head_dim, paging);
  if (b.invalid) return write_nan(out + b.first_query * head_dim, b.queries, head_dim);
  const Merged<Q> r =
      attend_rows<VEC, G, Q>(q + b.first_query * head_dim, b.queries, rows, head_dim, b.begin, b.end, scale_log2);
  // BEGIN SOLUTION "step 2: write out = O / L for each of this block's query heads"
#pragma unroll
  for (int i = 0; i < Q; ++i)
    if (i < b.queries && threadIdx.x < head_dim) out[(b.first_query + i) * head_dim + threadIdx.x] = r.o[i] / r.l[i];
  // SKELETON
  // (void)r, (void)out;
  // END SOLUTION
}

// Step 3 (optional): split-KV. Block (x, split) attends over its share of the rows and
// writes, for each of its queries, the normalised partial output and log-sum-exp (base 2);
// an empty share writes lse = -inf, which gives it no weight when the partials are combined.
// The number of splits is fixed at launch (chosen from max_seq when the lengths are in GPU
// memory), the rows of each split from its sequence's own length: a short sequence's later
// splits are empty.
// partial_out: (batch * heads, splits, head_dim); partial_lse: (batch * heads, splits).
template <int VEC, int G, int Q>
__global__ void __launch_bounds__(DECODE_WARPS * WARP, MIN_BLOCKS_PER_SM<VEC, G, Q>)
    decode_split_kernel(const float* __restrict__ q, const float* __restrict__ k_cache,
                        const float* __restrict__ v_cache, float* __restrict__ partial_out,
                        float* __restrict__ partial_lse, int heads, int kv_heads,
                        const int* __restrict__ length, const int* __restrict__ key_start, int max_seq,
                        int head_dim, float scale_log2, Paging paging) {
  BlockRows b = block_rows<Q>(heads, kv_heads, length, key_start, max_seq);
  const CacheRows rows = cache_rows(b, k_cache, v_cache, kv_heads, max_seq, head_dim, paging);
  const int split = blockIdx.y, splits = gridDim.y;
  if (b.invalid) {  // NaN partial outputs of weight 1 (lse 0): the combined output is NaN too
    for (int i = 0; i < b.queries; ++i) {
      const size_t slot = (b.first_query + i) * splits + split;
      write_nan(partial_out + slot * head_dim, 1, head_dim);
      if (threadIdx.x == 0) partial_lse[slot] = 0.0f;
    }
    return;
  }
  const int rows_per_split = (b.end - b.begin + splits - 1) / splits;
  const int begin = min(b.end, b.begin + split * rows_per_split), end = min(b.end, begin + rows_per_split);
  const Merged<Q> r = attend_rows<VEC, G, Q>(q + b.first_query * head_dim, b.queries, rows, head_dim, begin,
                                             end, scale_log2);
  // BEGIN SOLUTION "step 3: write each query's partial output O / L and its log-sum-exp M + log2 L"
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    if (i >= b.queries) break;
    const size_t slot = (b.first_query + i) * splits + split;
    if (threadIdx.x < head_dim)
      partial_out[slot * head_dim + threadIdx.x] = r.l[i] > 0.0f ? r.o[i] / r.l[i] : 0.0f;
    if (threadIdx.x == 0) partial_lse[slot] = r.l[i] > 0.0f ? r.m[i] + log2f(r.l[i]) : -INFINITY;
  }
  // SKELETON
  // (void)r, (void)partial_out, (void)partial_lse, (void)splits;
  // END SOLUTION
}

// Step 3: out = sum_s w_s partial_out_s / sum_s w_s with w_s = 2^(lse_s - max lse).
// One block per (batch, head) of MAX_HEAD_DIM x COMBINE_PARTS threads: thread (c, part) sums
// column c over splits part, part + COMBINE_PARTS, ... With one thread per column summing every
// split, a long cache of one head (132 splits) waits on 132 loads one after another, longer than
// the splits took to read the cache.
__global__ void __launch_bounds__(MAX_HEAD_DIM * COMBINE_PARTS)
    combine_splits_kernel(const float* __restrict__ partial_out, const float* __restrict__ partial_lse,
                          float* __restrict__ out, int splits, int head_dim) {
  const size_t bh = blockIdx.x;
  const int c = threadIdx.x, part = threadIdx.y;
  // BEGIN SOLUTION "step 3: combine the splits' partial outputs, weighted by their log-sum-exp"
  __shared__ float weight[MAX_SPLITS];                     // the splits' lse, then their weights w_s
  __shared__ float part_sum[COMBINE_PARTS][MAX_HEAD_DIM];  // each part's sum for each column
  const int thread = part * blockDim.x + c;
  for (int s = thread; s < splits; s += blockDim.x * blockDim.y) weight[s] = partial_lse[bh * splits + s];
  __syncthreads();
  float big = -INFINITY;
  for (int s = 0; s < splits; ++s) big = fmaxf(big, weight[s]);
  __syncthreads();  // every thread has its max before the lse turn into weights
  for (int s = thread; s < splits; s += blockDim.x * blockDim.y) weight[s] = exp2f(weight[s] - big);  // 0: empty
  __syncthreads();
  float o = 0.0f;
  if (c < head_dim)
    for (int s = part; s < splits; s += COMBINE_PARTS)
      o = fmaf(weight[s], partial_out[(bh * splits + s) * head_dim + c], o);
  part_sum[part][c] = o;
  __syncthreads();
  if (part == 0 && c < head_dim) {
    float sum = 0.0f, total = 0.0f;
    for (int s = 0; s < splits; ++s) sum += weight[s];
    for (int p = 0; p < COMBINE_PARTS; ++p) total += part_sum[p][c];
    out[bh * head_dim + c] = total / sum;
  }
  // SKELETON
  // (void)partial_out, (void)partial_lse, (void)out, (void)splits, (void)bh, (void)c, (void)part;
  // END SOLUTION
}

// ----------------------------------------------------------------------------
// Launchers: called by task5/binding.cpp on PyTorch's current stream. Each returns the
// error of its launch; errors inside a kernel surface at the next synchronisation.

// The new rows of every sequence into its cache, contiguous or (p.block_table, step 5) paged; the
// parameters are described in device/params.h.
cudaError_t update_cache(const CacheUpdateParams& p, cudaStream_t stream) {
  const bool paged = p.block_table != nullptr;
  const int page_shift = paged ? page_shift_of(p.page_size) : 0;
  if (p.batch < 0 || p.kv_heads < 1 || p.n_new < 0 || p.head_dim < 1 || (!paged && p.n_new > p.max_seq) ||
      (paged && (page_shift < 0 || p.max_pages < 1 || p.num_pages < 1)))
    return cudaErrorInvalidValue;
  const size_t total = (size_t)p.batch * p.kv_heads * p.n_new * p.head_dim;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int blocks = (int)std::min<size_t>((total + threads - 1) / threads, 65535 * 8);
  const float* k_new = static_cast<const float*>(p.k_new);
  const float* v_new = static_cast<const float*>(p.v_new);
  float* k_cache = static_cast<float*>(p.k_cache);
  float* v_cache = static_cast<float*>(p.v_cache);
  if (paged)
    update_paged_kernel<<<blocks, threads, 0, stream>>>(k_new, v_new, k_cache, v_cache, p.block_table, p.max_pages,
                                                        p.num_pages, page_shift, p.batch, p.kv_heads, p.n_new,
                                                        p.head_dim, p.pos);
  else
    update_cache_kernel<<<blocks, threads, 0, stream>>>(k_new, v_new, k_cache, v_cache, p.batch, p.kv_heads,
                                                        p.n_new, p.max_seq, p.head_dim, p.pos);
  return cudaGetLastError();
}

// Query heads per block for a group of `group` query heads per key/value head: the group
// rounded up to a power of two (a compiled size), at most MAX_QUERIES.
static int queries_per_block(int group) {
  int q = 1;
  while (q < group && q < MAX_QUERIES) q *= 2;
  return q;
}

// Blocks of the decode without splits: one per (batch, key/value head, chunk of its group).
static int decode_blocks(int batch, int heads, int kv_heads) {
  const int group = heads / kv_heads;
  return batch * kv_heads * ceil_div(group, queries_per_block(group));
}

// One launch of the decode kernels for a row split and Q queries per block: one block per
// (batch, kv_head, chunk) when p.splits == 1, else p.splits of them and the combining kernel.
template <int VEC, int G, int Q>
static cudaError_t launch_decode(const DecodeParams& p, const Paging& paging, cudaStream_t stream) {
  const float* q = static_cast<const float*>(p.q);
  const float* k_cache = static_cast<const float*>(p.k_cache);
  const float* v_cache = static_cast<const float*>(p.v_cache);
  float* out = static_cast<float*>(p.out);
  const int threads = DECODE_WARPS * WARP, blocks = decode_blocks(p.batch, p.heads, p.kv_heads);
  if (p.splits == 1) {
    decode_kernel<VEC, G, Q><<<blocks, threads, 0, stream>>>(q, k_cache, v_cache, out, p.heads, p.kv_heads,
                                                              p.length, p.key_start, p.max_seq, p.head_dim,
                                                              p.scale * LOG2E, paging);
    return cudaGetLastError();
  }
  decode_split_kernel<VEC, G, Q><<<dim3(blocks, p.splits), threads, 0, stream>>>(
      q, k_cache, v_cache, p.partial_out, p.partial_lse, p.heads, p.kv_heads, p.length, p.key_start, p.max_seq,
      p.head_dim, p.scale * LOG2E, paging);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  combine_splits_kernel<<<p.batch * p.heads, dim3(MAX_HEAD_DIM, COMBINE_PARTS), 0, stream>>>(
      p.partial_out, p.partial_lse, out, p.splits, p.head_dim);
  return cudaGetLastError();
}

// A decode step over the cache, contiguous or (p.block_table, step 5) paged, in p.splits blocks per
// (batch, kv_head, chunk) (step 3); the parameters are described in device/params.h. Picks the row
// split from head_dim (float4 loads need head_dim % 4 == 0 and 16-byte aligned rows; then G =
// head_dim / 4 lanes per row, rounded up to a power of two), and the queries per block from the
// group size.
cudaError_t decode_forward(const DecodeParams& p, cudaStream_t stream) {
  const bool paged = p.block_table != nullptr;
  const int page_shift = paged ? page_shift_of(p.page_size) : 0;
  if (p.batch < 0 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0 || p.length == nullptr ||
      p.max_seq < 1 || p.head_dim < 1 || p.head_dim > MAX_HEAD_DIM || p.splits < 1 || p.splits > MAX_SPLITS ||
      (p.splits > 1 && (p.partial_out == nullptr || p.partial_lse == nullptr)) ||
      (paged && (page_shift < 0 || p.max_pages < 1 || p.num_pages < 1 || p.max_seq != p.max_pages * p.page_size)))
    return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  const Paging paging{p.block_table, p.max_pages, p.num_pages, page_shift};
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const bool vec4 = p.head_dim % 4 == 0 && aligned(p.q) && aligned(p.k_cache) && aligned(p.v_cache);
  const int lanes = (p.head_dim + 3) / 4, queries = queries_per_block(p.heads / p.kv_heads);
#define LAUNCH_Q(VEC, G, Q) launch_decode<VEC, G, Q>(p, paging, stream)
#define LAUNCH(VEC, G)                                             \
  (queries == 1   ? LAUNCH_Q(VEC, G, 1)                            \
   : queries == 2 ? LAUNCH_Q(VEC, G, (MAX_QUERIES < 2 ? 1 : 2))    \
   : queries == 4 ? LAUNCH_Q(VEC, G, (MAX_QUERIES < 4 ? 1 : 4))    \
                  : LAUNCH_Q(VEC, G, MAX_QUERIES))
  if (!vec4) return LAUNCH(1, 32);
  if (lanes > 16) return LAUNCH(4, 32);
  if (lanes > 8) return LAUNCH(4, 16);
  if (lanes > 4) return LAUNCH(4, 8);
  if (lanes > 2) return LAUNCH(4, 4);
  if (lanes > 1) return LAUNCH(4, 2);
  return LAUNCH(4, 1);
#undef LAUNCH
#undef LAUNCH_Q
}

// The number of splits the launcher would use: enough blocks to keep every SM reading, in rounds
// that end together, and no split shorter than MIN_KEYS_PER_SPLIT rows. The lengths are in GPU
// memory, out of the host's sight: max_length is the longest any sequence may be (the length
// itself when it came from the host, else max_seq), and the splits are chosen for it.
int decode_splits(int batch, int heads, int kv_heads, int max_length, int head_dim) {
  const int blocks = decode_blocks(batch, heads, kv_heads);  // without splitting
  // BEGIN SOLUTION "step 3: choose the number of splits from the blocks, max_length and the SM count"
  (void)head_dim;
  int device = 0, sms = 0;
  if (blocks < 1 || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 1;
  // One block of DECODE_WARPS = 16 warps per SM already reads at about the copy bandwidth, so the
  // blocks take about ceil(blocks / SMs) times as long as one (an SM given two blocks takes twice as
  // long): a last round only partly full leaves SMs idle, and 135 blocks on 132 SMs take as long as
  // 264. With `splits` splits the time goes as ceil(blocks * splits / SMs) / splits: take more
  // splits while that falls by 5% or more (each costs a partial output and its share of the
  // combine), none of them shorter than MIN_KEYS_PER_SPLIT rows.
  const int most = std::max(1, std::min(MAX_SPLITS, max_length / MIN_KEYS_PER_SPLIT));
  int splits = 1;
  double best = ceil_div(blocks, sms);
  for (int s = 2; s <= most; ++s) {
    const double time = (double)ceil_div(blocks * s, sms) / s;
    if (time < 0.95 * best) splits = s, best = time;
  }
  return splits;
  // SKELETON
  // (void)blocks, (void)max_length, (void)head_dim;
  // return 1;  // one block per (batch, key/value head) until step 3 is written
  // END SOLUTION
}

int decode_max_head_dim() { return MAX_HEAD_DIM; }
int decode_max_splits() { return MAX_SPLITS; }
