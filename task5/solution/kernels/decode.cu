// Task 5: the KV cache and the decode kernels.
//
// Generating text runs attention once per new token. The prompt's keys and values are
// computed once (the prefill, task 4's kernel) and kept in a cache; each later step
// projects one token, appends its K and V to the cache (update_cache), and lets its one
// query attend over every cached position (decode):
//
//   out = softmax(scale * q K[0:length]^T) V[0:length]       for every (batch, head)
//
// The cache is (batch, heads, max_seq, head_dim), row-major: the keys of one head are
// max_seq consecutive rows, so reading positions 0 .. length-1 of a head reads one
// contiguous stretch of memory, and neighbouring lanes read neighbouring floats.
//
// A decode step does little arithmetic (two multiply-adds per cached float) and reads
// the whole of K and V once: its speed is the rate it reads memory. So the kernel
// reads with wide (float4), coalesced loads, keeps many loads in flight per thread,
// and, when batch * heads is small next to the number of SMs, splits the keys of one
// head across several blocks (split-KV, "FlashDecoding"): each block writes a partial
// output with its log-sum-exp, and a second kernel combines them.
//
// All tensors are contiguous float32; the kernels trust their arguments:
// task5/binding.cpp checks the tensors, `pos` and `length`.
//
// Build and test:
//   python -m task5.compile            build this file (task5/kernels/decode.cu)
//   python -m task5.test               check it against a float64 reference
// Add --solution to either command to build and test the reference instead.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

// ----------------------------------------------------------------------------
// Sizes (tune here)

// What they trade (README, Task 5, step 4; `python -m task5.tune` measures each choice):
// more warps per block put more rows in flight at once per block but make the final merge of
// the groups longer; UNROLL rows per lane loaded before any is used put more loads in
// flight per warp, for more registers. The skeleton starts untuned.
constexpr int DECODE_WARPS = 8;  // warps per block [skeleton: 4]
// Each lane loads UNROLL rows of K (and of V) before it uses any of them, so a warp has
// UNROLL loads of each in flight instead of one: memory latency is hidden by loads, not
// by arithmetic, in a kernel that does almost none.
constexpr int UNROLL = 2;  // [skeleton: 1]
constexpr int MAX_HEAD_DIM = 128;
constexpr int MAX_SPLITS = 256;  // the binding checks `splits` against this
// With split-KV (step 3), no split is shorter than this many rows: below it, the combining kernel
// and the partial outputs cost more than the split saves.
[[maybe_unused]] constexpr int MIN_KEYS_PER_SPLIT = 512;  // used by decode_splits (step 3)

constexpr int WARP = 32;
static_assert(DECODE_WARPS * WARP >= MAX_HEAD_DIM && DECODE_WARPS * WARP <= 1024,
              "the groups are merged one output column per thread: at least MAX_HEAD_DIM threads, at most 1024");
static_assert(UNROLL >= 1, "at least one row per lane in flight");
constexpr float LOG2E = 1.4426950408889634f;

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

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ----------------------------------------------------------------------------
// Step 1: append new keys and values at position pos.
//
// k_new, v_new: (batch_heads, n_new, head_dim); k_cache, v_cache: (batch_heads, max_seq,
// head_dim). Rows pos .. pos + n_new - 1 of every head are written, nothing else.

__global__ void update_cache_kernel(const float* __restrict__ k_new, const float* __restrict__ v_new,
                                    float* __restrict__ k_cache, float* __restrict__ v_cache,
                                    int batch_heads, int n_new, int max_seq, int head_dim, int pos) {
  // BEGIN SOLUTION "step 1: copy each new row of K and V into the cache at position pos + its index"
  const size_t row_floats = (size_t)n_new * head_dim;  // one head's new rows
  const size_t total = (size_t)batch_heads * row_floats;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t bh = i / row_floats, within = i % row_floats;  // within = t * head_dim + d
    const size_t dst = (bh * max_seq + pos) * head_dim + within;
    k_cache[dst] = k_new[i];
    v_cache[dst] = v_new[i];
  }
  // END SOLUTION
}

// ----------------------------------------------------------------------------
// Steps 2 and 3: one query against rows [begin, end) of one head's cache.
//
// The block's lanes are split into groups of G, each reading one row at a time; group
// `grp` of the block reads rows begin + grp, begin + grp + GROUPS, ...; each group keeps
// its own online softmax (m, l and the unnormalised acc for its lanes' columns), as in
// task 4. At the end the groups' states are merged through shared memory:
//
//   M = max m_grp,   L = sum l_grp exp(m_grp - M),   O = sum acc_grp exp(m_grp - M)
//
// and thread t < head_dim returns (M, L, O[t]) for column t. Scores are kept in base 2
// (q is pre-multiplied by scale * log2 e), so exp2f does the exponentials.

struct Merged {
  float m, l, o;  // row max, row sum, numerator of column threadIdx.x (valid for threadIdx.x < head_dim)
};

template <int VEC, int G>
__device__ Merged attend_rows(const float* __restrict__ q, const float* __restrict__ k,
                              const float* __restrict__ v, int head_dim, int begin, int end,
                              float scale_log2) {
  using Split = RowSplit<VEC, G>;
  constexpr int GROUPS = DECODE_WARPS * Split::ROWS;
  __shared__ float group_m[GROUPS], group_l[GROUPS];
  __shared__ float group_acc[DECODE_WARPS * WARP * 4];  // GROUPS * head_dim <= this

  const int lane = threadIdx.x % WARP, g = lane % G;
  const int grp = threadIdx.x / G;  // this lane's group in the block
  Merged result{-INFINITY, 0.0f, 0.0f};

  // BEGIN SOLUTION "step 2: this group's online softmax over its rows, then merge the groups"
  float qv[4], acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int e = 0; e < 4; ++e) {
    const int c = Split::column(g, e);
    qv[e] = c < head_dim ? q[c] * scale_log2 : 0.0f;
  }
  float m = -INFINITY, l = 0.0f;

  // Rounds are the same for the whole block (shuffles need every lane of a warp); a row
  // past `end` is not loaded and scores -inf.
  for (int round = begin; round < end; round += UNROLL * GROUPS) {
    float kv[UNROLL][4], vv[UNROLL][4], s[UNROLL];
    // Issue every load of this round before using any: UNROLL rows of K and of V.
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int row = round + u * GROUPS + grp;
      const float* k_row = k + (size_t)row * head_dim;
      const float* v_row = v + (size_t)row * head_dim;
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
    // Scores: each lane's part of q . k, summed over the G lanes of the group.
    float round_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) dot = fmaf(qv[e], kv[u][e], dot);
#pragma unroll
      for (int offset = G / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      s[u] = round + u * GROUPS + grp < end ? dot : -INFINITY;
      round_max = fmaxf(round_max, s[u]);
    }
    // Online softmax. m_new is -inf only while this group has had no row at all.
    const float m_new = fmaxf(m, round_max);
    if (m_new == -INFINITY) continue;
    const float alpha = exp2f(m - m_new);  // 0 on the group's first row (m = -inf)
    l *= alpha;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= alpha;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const float p = exp2f(s[u] - m_new);  // 0 for rows past the end
      l += p;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] = fmaf(p, vv[u][e], acc[e]);
    }
    m = m_new;
  }

  // Merge the groups: each writes its state, then thread t merges column t.
  if (g == 0) group_m[grp] = m, group_l[grp] = l;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int c = Split::column(g, e);
    if (c < head_dim) group_acc[grp * head_dim + c] = acc[e];
  }
  __syncthreads();
  if (threadIdx.x < head_dim) {
    float big = -INFINITY;
    for (int i = 0; i < GROUPS; ++i) big = fmaxf(big, group_m[i]);
    float sum = 0.0f, o = 0.0f;
    if (big != -INFINITY) {  // -inf: no group had a row (an empty split)
      for (int i = 0; i < GROUPS; ++i) {
        const float w = exp2f(group_m[i] - big);
        sum = fmaf(group_l[i], w, sum);
        o = fmaf(group_acc[i * head_dim + threadIdx.x], w, o);
      }
    }
    result = Merged{big, sum, o};
  }
  // SKELETON
  // (void)q, (void)k, (void)v, (void)begin, (void)end, (void)scale_log2, (void)group_m, (void)group_l;
  // (void)group_acc, (void)lane, (void)g, (void)grp, (void)UNROLL;
  // END SOLUTION
  return result;
}

// Step 2: one block per (batch, head), over all `length` cached rows.
// q, out: (batch_heads, head_dim); k, v: (batch_heads, max_seq, head_dim).
template <int VEC, int G>
__global__ void __launch_bounds__(DECODE_WARPS * WARP)
    decode_kernel(const float* __restrict__ q, const float* __restrict__ k_cache,
                  const float* __restrict__ v_cache, float* __restrict__ out, int max_seq, int length,
                  int head_dim, float scale_log2) {
  const size_t bh = blockIdx.x;
  const float* k = k_cache + bh * max_seq * head_dim;  // the cache itself: no copy, no slice
  const float* v = v_cache + bh * max_seq * head_dim;
  const Merged r = attend_rows<VEC, G>(q + bh * head_dim, k, v, head_dim, 0, length, scale_log2);
  // BEGIN SOLUTION "step 2: write out = O / L for this block's head"
  if (threadIdx.x < head_dim) out[bh * head_dim + threadIdx.x] = r.o / r.l;
  // SKELETON
  // (void)r, (void)out;
  // END SOLUTION
}

// Step 3 (optional): split-KV. Block (bh, split) attends over its share of the rows and
// writes its normalised partial output and log-sum-exp (base 2); an empty share writes
// lse = -inf, which gives it no weight when the partials are combined.
// partial_out: (batch_heads, splits, head_dim); partial_lse: (batch_heads, splits).
template <int VEC, int G>
__global__ void __launch_bounds__(DECODE_WARPS * WARP)
    decode_split_kernel(const float* __restrict__ q, const float* __restrict__ k_cache,
                        const float* __restrict__ v_cache, float* __restrict__ partial_out,
                        float* __restrict__ partial_lse, int max_seq, int length, int head_dim,
                        float scale_log2, int rows_per_split) {
  const size_t bh = blockIdx.x;
  const int split = blockIdx.y, splits = gridDim.y;
  const int begin = min(length, split * rows_per_split), end = min(length, begin + rows_per_split);
  const float* k = k_cache + bh * max_seq * head_dim;
  const float* v = v_cache + bh * max_seq * head_dim;
  const Merged r = attend_rows<VEC, G>(q + bh * head_dim, k, v, head_dim, begin, end, scale_log2);
  // BEGIN SOLUTION "step 3: write this split's partial output O / L and its log-sum-exp M + log2 L"
  const size_t slot = bh * splits + split;
  if (threadIdx.x < head_dim) partial_out[slot * head_dim + threadIdx.x] = r.l > 0.0f ? r.o / r.l : 0.0f;
  if (threadIdx.x == 0) partial_lse[slot] = r.l > 0.0f ? r.m + log2f(r.l) : -INFINITY;
  // SKELETON
  // (void)r, (void)partial_out, (void)partial_lse, (void)splits;
  // END SOLUTION
}

// Step 3: out = sum_s w_s partial_out_s / sum_s w_s with w_s = 2^(lse_s - max lse).
// One block per (batch, head), one thread per column.
__global__ void combine_splits_kernel(const float* __restrict__ partial_out,
                                      const float* __restrict__ partial_lse, float* __restrict__ out,
                                      int splits, int head_dim) {
  const size_t bh = blockIdx.x;
  const int c = threadIdx.x;
  if (c >= head_dim) return;
  // BEGIN SOLUTION "step 3: combine the splits' partial outputs, weighted by their log-sum-exp"
  const float* lse = partial_lse + bh * splits;
  float big = -INFINITY;
  for (int s = 0; s < splits; ++s) big = fmaxf(big, lse[s]);
  float sum = 0.0f, o = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float w = exp2f(lse[s] - big);  // 0 for an empty split
    sum += w;
    o = fmaf(w, partial_out[(bh * splits + s) * head_dim + c], o);
  }
  out[bh * head_dim + c] = o / sum;
  // SKELETON
  // (void)partial_out, (void)partial_lse, (void)out, (void)splits, (void)bh;
  // END SOLUTION
}

// ----------------------------------------------------------------------------
// Launchers: called by task5/binding.cpp on PyTorch's current stream. Each returns the
// error of its launch; errors inside a kernel surface at the next synchronisation.

cudaError_t update_cache(const float* k_new, const float* v_new, float* k_cache, float* v_cache,
                         int batch_heads, int n_new, int max_seq, int head_dim, int pos,
                         cudaStream_t stream) {
  if (batch_heads < 0 || n_new < 0 || head_dim < 1 || pos < 0 || pos + (long long)n_new > max_seq)
    return cudaErrorInvalidValue;
  const size_t total = (size_t)batch_heads * n_new * head_dim;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int blocks = (int)std::min<size_t>((total + threads - 1) / threads, 65535 * 8);
  update_cache_kernel<<<blocks, threads, 0, stream>>>(k_new, v_new, k_cache, v_cache, batch_heads, n_new,
                                                      max_seq, head_dim, pos);
  return cudaGetLastError();
}

// One launch of the decode kernels for a row split: one block per (batch, head) when
// splits == 1, else `splits` blocks per (batch, head) and the combining kernel.
template <int VEC, int G>
static cudaError_t launch_decode(const float* q, const float* k_cache, const float* v_cache, float* out,
                                 int batch_heads, int max_seq, int length, int head_dim, float scale,
                                 int splits, float* partial_out, float* partial_lse, cudaStream_t stream) {
  const int threads = DECODE_WARPS * WARP;
  if (splits == 1) {
    decode_kernel<VEC, G><<<batch_heads, threads, 0, stream>>>(q, k_cache, v_cache, out, max_seq, length,
                                                                head_dim, scale * LOG2E);
    return cudaGetLastError();
  }
  decode_split_kernel<VEC, G><<<dim3(batch_heads, splits), threads, 0, stream>>>(
      q, k_cache, v_cache, partial_out, partial_lse, max_seq, length, head_dim, scale * LOG2E,
      ceil_div(length, splits));
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  combine_splits_kernel<<<batch_heads, MAX_HEAD_DIM, 0, stream>>>(partial_out, partial_lse, out, splits,
                                                                  head_dim);
  return cudaGetLastError();
}

// Picks the row split from head_dim: float4 loads need head_dim % 4 == 0 and 16-byte
// aligned rows; then G = head_dim / 4 lanes per row, rounded up to a power of two.
static cudaError_t launch(const float* q, const float* k_cache, const float* v_cache, float* out,
                          int batch_heads, int max_seq, int length, int head_dim, float scale, int splits,
                          float* partial_out, float* partial_lse, cudaStream_t stream) {
  if (batch_heads < 0 || length < 1 || length > max_seq || head_dim < 1 || head_dim > MAX_HEAD_DIM ||
      splits < 1 || splits > MAX_SPLITS)
    return cudaErrorInvalidValue;
  if (batch_heads == 0) return cudaSuccess;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec4 = head_dim % 4 == 0 && aligned(q) && aligned(k_cache) && aligned(v_cache);
  const int lanes = (head_dim + 3) / 4;
#define LAUNCH(VEC, G) \
  launch_decode<VEC, G>(q, k_cache, v_cache, out, batch_heads, max_seq, length, head_dim, scale, splits, \
                        partial_out, partial_lse, stream)
  if (!vec4) return LAUNCH(1, 32);
  if (lanes > 16) return LAUNCH(4, 32);
  if (lanes > 8) return LAUNCH(4, 16);
  if (lanes > 4) return LAUNCH(4, 8);
  if (lanes > 2) return LAUNCH(4, 4);
  if (lanes > 1) return LAUNCH(4, 2);
  return LAUNCH(4, 1);
#undef LAUNCH
}

// q, out: (batch_heads, head_dim); k_cache, v_cache: (batch_heads, max_seq, head_dim).
cudaError_t decode_forward(const float* q, const float* k_cache, const float* v_cache, float* out,
                           int batch_heads, int max_seq, int length, int head_dim, float scale,
                           cudaStream_t stream) {
  return launch(q, k_cache, v_cache, out, batch_heads, max_seq, length, head_dim, scale, 1, nullptr, nullptr,
                stream);
}

// The number of splits the launcher would use: enough blocks to keep every SM busy
// with several blocks, but no split shorter than MIN_KEYS_PER_SPLIT rows.
int decode_splits(int batch_heads, int length, int head_dim) {
  // BEGIN SOLUTION "step 3: choose the number of splits from batch * heads, length and the SM count"
  (void)head_dim;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 1;
  const int wanted_blocks = 4 * sms;
  if (batch_heads >= wanted_blocks / 2) return 1;
  int splits = ceil_div(wanted_blocks, std::max(batch_heads, 1));
  splits = std::min(splits, length / MIN_KEYS_PER_SPLIT);
  return std::max(1, std::min(splits, MAX_SPLITS));
  // SKELETON
  // (void)batch_heads, (void)length, (void)head_dim;
  // return 1;  // one block per (batch, head) until step 3 is written
  // END SOLUTION
}

// As decode_forward, over `splits` blocks per (batch, head). partial_out holds
// batch_heads * splits * head_dim floats, partial_lse batch_heads * splits (the binding
// allocates them).
cudaError_t decode_split_forward(const float* q, const float* k_cache, const float* v_cache, float* out,
                                 int batch_heads, int max_seq, int length, int head_dim, float scale,
                                 int splits, float* partial_out, float* partial_lse, cudaStream_t stream) {
  if (splits < 2) return cudaErrorInvalidValue;
  return launch(q, k_cache, v_cache, out, batch_heads, max_seq, length, head_dim, scale, splits, partial_out,
                partial_lse, stream);
}

int decode_max_head_dim() { return MAX_HEAD_DIM; }
int decode_max_splits() { return MAX_SPLITS; }
