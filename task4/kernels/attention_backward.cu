// Task 4, steps 12-16 (optional): the backward pass of FlashAttention-2 (Algorithm 2 of the paper), in float32.
//
// The forward pass saved q, k, v, out and, for every query row, L = log(sum_j exp(scale q k_j)) (step 12, in
// kernels/attention.cu). Given dO = dLoss/d(out), the gradients are
//
//   P  = exp(scale Q K^T - L)        the probabilities, recomputed a tile at a time from L
//   dV = P^T dO
//   dP = dO V^T
//   dS = P * (dP - D)                D = rowsum(dO * O), one number per query row
//   dQ = scale dS K
//   dK = scale dS^T Q
//
// and, as in the forward pass, no (seq_q, seq_k) matrix ever exists: P and dS live one tile at a time. Three kernels:
//   1. delta_kernel (step 13): D for every query row.
//   2. dkdv_kernel (steps 14-15): a block owns BLOCK_ROWS keys of one (batch, key/value head). It keeps their K and
//      V in shared memory and their dK and dV in registers, and walks every query tile that sees them (of every
//      query head that shares them, with grouped-query attention), adding each tile's P^T dO and dS^T Q.
//   3. dq_kernel (step 16): a block owns BLOCK_ROWS queries of one (batch, head). It keeps their Q and dO in
//      shared memory and dQ in registers, and walks the key tiles they see, adding each tile's dS K.
// Kernels 2 and 3 both recompute P and dP: 7 tile products a pair of tiles instead of 5. FlashAttention-2 instead
// adds dQ from kernel 2 with atomicAdd on global memory; README, Task 4, step 16, weighs the two.
//
// Step 26 (optional, after steps 23-24): the masks beyond causal here too, in MASKS instances of kernels 2 and 3: each
// walks only the tiles its rows' masks leave, and with soft-capped scores dS goes back through the cap's slope.
//
// All tensors are row-major, contiguous float32; plain FP32 FFMA, like the forward kernel. The kernels trust their
// arguments: task4/binding.cpp checks the tensors.
//
// Build and test:
//   python -m task4.compile            build the kernels (this file too)
//   python -m task4.test --backward    check them against float64 autograd, then time them against PyTorch's

#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "device/common.cuh"
#include "device/float_tiles.cuh"
#include "device/masks.cuh"
#include "device/params.h"

// ----------------------------------------------------------------------------
// Tile sizes (tune here)

// A block owns BLOCK_ROWS rows (keys in kernel 2, queries in kernel 3) and walks the other side in tiles of
// BLOCK_COLS rows. Thread (ty, tx) owns the THREAD_ROWS rows ty, ty + ROW_THREADS, ... of its block's rows, and of
// each BLOCK_ROWS x BLOCK_COLS tile of S (or S^T) the THREAD_COLS columns tx, tx + COL_THREADS, ... as in the
// forward kernel; of its accumulators (dK and dV, or dQ) it owns the same rows.
constexpr int BLOCK_ROWS = 64;
constexpr int BLOCK_COLS = 64;
constexpr int THREAD_ROWS = 4;
constexpr int THREAD_COLS = 4;

constexpr int ROW_THREADS = BLOCK_ROWS / THREAD_ROWS;
constexpr int COL_THREADS = BLOCK_COLS / THREAD_COLS;  // neighbouring lanes that share a row
constexpr int NUM_THREADS = ROW_THREADS * COL_THREADS;
constexpr int MAX_HEAD_DIM = 128;

// Rows of the Q, K, V and dO tiles are padded by PAD floats (as in the forward kernel); rows of the P and dS tiles
// by P_PAD: with 16 lanes to a row, the two rows a warp writes then start 16 banks apart.
constexpr int PAD = 4;
constexpr int P_PAD = 16;

static_assert(THREAD_ROWS * ROW_THREADS == BLOCK_ROWS && THREAD_COLS * COL_THREADS == BLOCK_COLS,
              "the threads' micro-tiles cover the block's tile exactly");
static_assert(32 % COL_THREADS == 0, "the COL_THREADS lanes that share a row sit in one warp");
static_assert(NUM_THREADS % 32 == 0 && NUM_THREADS <= 1024, "whole warps, at most 1024 threads");
static_assert(BLOCK_COLS % 4 == 0, "P and dS are read as float4 along their rows");

// Shared memory of kernels 2 and 3, in floats: four (rows, D + PAD) tiles (K, V and Q, dO: the block's own two and
// the walked two), two (BLOCK_ROWS, BLOCK_COLS + P_PAD) tiles (P and dS; kernel 3 needs only dS), and L and D of the
// walked query tile (kernel 2).
template <int D>
__host__ __device__ constexpr int own_tile_floats() { return BLOCK_ROWS * (D + PAD); }
template <int D>
__host__ __device__ constexpr int walked_tile_floats() { return BLOCK_COLS * (D + PAD); }
constexpr int P_TILE_FLOATS = BLOCK_ROWS * (BLOCK_COLS + P_PAD);
template <int D>
constexpr size_t backward_smem_bytes() {
  return sizeof(float) * (2 * own_tile_floats<D>() + 2 * walked_tile_floats<D>() + 2 * P_TILE_FLOATS + 2 * BLOCK_COLS);
}
static_assert(backward_smem_bytes<MAX_HEAD_DIM>() <= 227 * 1024,
              "a block may have at most 227 KB of shared memory on sm_90: smaller tiles");

// ----------------------------------------------------------------------------
// Helpers (given: the loops of steps 3 and 5 of the forward kernel, as functions; load_tile, fma_vec, scaled and
// store_first are in common/csrc/device/float_tiles.cuh, LOG2E, ceil_div and with_head_dim_tile in device/common.cuh)

// s[i][j] += dot(a row ty + i ROW_THREADS, b row tx + j COL_THREADS), both tiles (rows, D + PAD): step 3's loop.
template <int D>
__device__ __forceinline__ void tile_dots(const float* a, const float* b, float (&s)[THREAD_ROWS][THREAD_COLS],
                                          int ty, int tx) {
  constexpr int LD = D + PAD;
#pragma unroll 4
  for (int d = 0; d < D; d += 4) {
    float4 a4[THREAD_ROWS];
#pragma unroll
    for (int i = 0; i < THREAD_ROWS; ++i)
      a4[i] = *reinterpret_cast<const float4*>(&a[(ty + i * ROW_THREADS) * LD + d]);
#pragma unroll
    for (int j = 0; j < THREAD_COLS; ++j) {
      const float4 b4 = *reinterpret_cast<const float4*>(&b[(tx + j * COL_THREADS) * LD + d]);
#pragma unroll
      for (int i = 0; i < THREAD_ROWS; ++i) {
        s[i][j] += a4[i].x * b4.x;
        s[i][j] += a4[i].y * b4.y;
        s[i][j] += a4[i].z * b4.z;
        s[i][j] += a4[i].w * b4.w;
      }
    }
  }
}

// The accumulators' vectors: float4, float2 or float, as the forward kernel's O.
template <int D>
using acc_vec = std::conditional_t<D % (4 * COL_THREADS) == 0, float4,
                                   std::conditional_t<D % (2 * COL_THREADS) == 0, float2, float>>;
template <int D>
constexpr int ACC_VECS = D / (sizeof(acc_vec<D>) / sizeof(float) * COL_THREADS);  // vectors per row per thread
template <int D>
constexpr bool acc_covers_rows() { return ACC_VECS<D> * (sizeof(acc_vec<D>) / sizeof(float)) * COL_THREADS == D; }
static_assert(acc_covers_rows<32>() && acc_covers_rows<64>() && acc_covers_rows<80>() && acc_covers_rows<96>() &&
                  acc_covers_rows<128>(),
              "a row's COL_THREADS lanes must own whole vectors of every compiled head_dim (32, 64, 80, 96, 128): "
              "another COL_THREADS (BLOCK_COLS / THREAD_COLS)");

// acc[i][c] += sum over r < BLOCK_COLS of p[row ty + i ROW_THREADS][r] * b[r][columns of vector c]: step 5's loop.
// p is (BLOCK_ROWS, BLOCK_COLS + P_PAD), b is (BLOCK_COLS, D + PAD).
template <int D>
__device__ __forceinline__ void tile_accumulate(const float* p, const float* b,
                                                acc_vec<D> (&acc)[THREAD_ROWS][ACC_VECS<D>], int ty, int tx) {
  using vec = acc_vec<D>;
  constexpr int VEC = sizeof(vec) / sizeof(float);
  constexpr int LD = D + PAD, LDP = BLOCK_COLS + P_PAD;
#pragma unroll 4
  for (int r = 0; r < BLOCK_COLS; r += 4) {
    float4 p4[THREAD_ROWS];
#pragma unroll
    for (int i = 0; i < THREAD_ROWS; ++i)
      p4[i] = *reinterpret_cast<const float4*>(&p[(ty + i * ROW_THREADS) * LDP + r]);
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
#pragma unroll
      for (int c = 0; c < ACC_VECS<D>; ++c) {
        const vec b_vec = *reinterpret_cast<const vec*>(&b[(r + rr) * LD + VEC * (tx + c * COL_THREADS)]);
#pragma unroll
        for (int i = 0; i < THREAD_ROWS; ++i) fma_vec(acc[i][c], component(p4[i], rr), b_vec);
      }
    }
  }
}

// Writes scale * acc to the thread's rows of dst ((n_rows, head_dim), rows from row0), the columns below head_dim.
template <int D>
__device__ __forceinline__ void store_rows(float* dst, const acc_vec<D> (&acc)[THREAD_ROWS][ACC_VECS<D>], float scale,
                                           int row0, int n_rows, int head_dim, int ty, int tx) {
  using vec = acc_vec<D>;
  constexpr int VEC = sizeof(vec) / sizeof(float);
  const bool whole = head_dim % VEC == 0 && reinterpret_cast<uintptr_t>(dst) % sizeof(vec) == 0;
#pragma unroll
  for (int i = 0; i < THREAD_ROWS; ++i) {
    const int row = row0 + ty + i * ROW_THREADS;
    if (row >= n_rows) continue;
#pragma unroll
    for (int c = 0; c < ACC_VECS<D>; ++c) {
      const int col = VEC * (tx + c * COL_THREADS);
      if (col >= head_dim) continue;
      const vec x = scaled(acc[i][c], scale);
      if (whole)
        *reinterpret_cast<vec*>(&dst[(size_t)row * head_dim + col]) = x;
      else
        store_first(&dst[(size_t)row * head_dim + col], x, head_dim - col);
    }
  }
}

// Step 26 (given: steps 23-24's ranges, without padding): the keys query `row` sees, [lo, hi), causal's end included.
__device__ __forceinline__ int2 keys_of(const AttentionMasks& masks, bool causal, int row, int seq_q, int seq_k) {
  row = min(row, seq_q - 1);  // a row past the end takes the last one's
  const int diagonal = row + seq_k - seq_q;
  int lo = masks.window_left >= 0 ? diagonal - masks.window_left : 0, hi = causal ? diagonal + 1 : seq_k;
  if (masks.cu_seqlens != nullptr) {
    const int doc = document_of(masks.cu_seqlens, masks.documents, row);
    lo = max(lo, masks.cu_seqlens[doc]);
    hi = min(hi, masks.cu_seqlens[doc + 1]);
  }
  return make_int2(max(lo, 0), hi);
}

// Step 26: the probability of a score (`dot` = q . k) under the masks, and the slope dS is multiplied by: the scale,
// the soft-cap (cap > 0; its slope 1 - (capped / cap)^2, else 1), then 0 for a key outside [keys.x, keys.y).
// lse_log2: the row's L in log2 units.
__device__ __forceinline__ float masked_probability(float dot, float scale, float cap, float lse_log2, int key,
                                                    int2 keys, float& slope) {
  // TODO (README, Task 4, step 26: P of one score under the masks, and the cap's slope for dS)
  slope = 1.0f;
  return 0.0f;
}

// ----------------------------------------------------------------------------
// Kernel 1: D = rowsum(dO * O), one warp a row. out, dout: (rows, head_dim); delta: (rows,).
__global__ void delta_kernel(const float* __restrict__ out, const float* __restrict__ dout, float* __restrict__ delta,
                             long long rows, int head_dim) {
  const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp: one row a warp
  // TODO (README, Task 4, step 13: D = rowsum(dO * O), one warp a row)
}

// ----------------------------------------------------------------------------
// Kernel 2: dK and dV for BLOCK_ROWS keys of one (batch, key/value head).
// q, dout: (batch * heads, seq_q, head_dim); k, v, dk, dv: (batch * kv_heads, seq_k, head_dim); lse, delta:
// (batch * heads, seq_q). grid (batch * kv_heads, ceil(seq_k / BLOCK_ROWS)), NUM_THREADS threads,
// backward_smem_bytes<D>() (and the walked queries' key ranges where MASKS). scale_log2 = scale * log2(e). MASKS:
// step 26's instance, with `masks` (no padding here).
template <int D, bool MASKS>
__global__ void __launch_bounds__(NUM_THREADS, 1)
    flash_attention_dkdv_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                const float* __restrict__ v, const float* __restrict__ dout,
                                const float* __restrict__ lse, const float* __restrict__ delta,
                                float* __restrict__ dk, float* __restrict__ dv, int heads, int kv_heads, int seq_q,
                                int seq_k, int head_dim, float scale, float scale_log2, bool causal,
                                AttentionMasks masks) {
  constexpr int LDP = BLOCK_COLS + P_PAD;
  using vec = acc_vec<D>;
  extern __shared__ float4 smem[];
  float* k_tile = reinterpret_cast<float*>(smem);      // (BLOCK_ROWS, D + PAD): this block's keys
  float* v_tile = k_tile + own_tile_floats<D>();       // (BLOCK_ROWS, D + PAD)
  float* q_tile = v_tile + own_tile_floats<D>();       // (BLOCK_COLS, D + PAD): the walked queries
  float* do_tile = q_tile + walked_tile_floats<D>();   // (BLOCK_COLS, D + PAD)
  float* p_tile = do_tile + walked_tile_floats<D>();   // (BLOCK_ROWS, LDP): P^T, keys by queries
  float* ds_tile = p_tile + P_TILE_FLOATS;             // (BLOCK_ROWS, LDP): dS^T
  float* lse_tile = ds_tile + P_TILE_FLOATS;           // (BLOCK_COLS,): L of the walked queries, in log2 units
  float* delta_tile = lse_tile + BLOCK_COLS;           // (BLOCK_COLS,): their D
  __shared__ int2 query_keys[MASKS ? BLOCK_COLS : 1];  // step 26: the keys each walked query sees

  const int tx = threadIdx.x % COL_THREADS, ty = threadIdx.x / COL_THREADS;
  const int kv_start = blockIdx.y * BLOCK_ROWS;  // with a causal mask the first keys have the most queries
  const int batch = blockIdx.x / kv_heads, kv_head = blockIdx.x % kv_heads;
  const int group = heads / kv_heads;  // the query heads kv_head .. that share this key/value head
  const size_t kv_offset = (size_t)blockIdx.x * seq_k * head_dim;
  k += kv_offset, v += kv_offset, dk += kv_offset, dv += kv_offset;
  const int causal_offset = seq_k - seq_q;  // query i sees keys j <= i + causal_offset

  vec dk_acc[THREAD_ROWS][ACC_VECS<D>], dv_acc[THREAD_ROWS][ACC_VECS<D>];
#pragma unroll
  for (int i = 0; i < THREAD_ROWS; ++i)
#pragma unroll
    for (int c = 0; c < ACC_VECS<D>; ++c) dk_acc[i][c] = dv_acc[i][c] = vec{};

  load_tile<BLOCK_ROWS, D, D + PAD, NUM_THREADS>(k_tile, k, kv_start, seq_k, head_dim);
  load_tile<BLOCK_ROWS, D, D + PAD, NUM_THREADS>(v_tile, v, kv_start, seq_k, head_dim);
  __pipeline_commit();  // waited for with the first query tile

  // TODO (README, Task 4, step 14: the first query tile that sees these keys (causal: the diagonal's))
  const int first_query = seq_q;
  int query_begin = first_query, query_end = seq_q;  // the query tiles walked: from query_begin, before query_end
  if constexpr (MASKS) {
    // TODO (README, Task 4, step 26: the queries that see some key of the block: from the first key's first to the last key's last)
    query_end = 0;  // until step 26 is written: no query tile, dK and dV zeros
  }

  for (int g = 0; g < group; ++g) {
    // the query heads kv_head * group .. kv_head * group + group - 1 read this key/value head in place
    const size_t head = (size_t)batch * heads + kv_head * group + g;
    const float* q_head = q + head * seq_q * head_dim;
    const float* do_head = dout + head * seq_q * head_dim;
    const float* lse_head = lse + head * seq_q;
    const float* delta_head = delta + head * seq_q;
    for (int q_start = query_begin; q_start < query_end; q_start += BLOCK_COLS) {
      // Two groups: S^T needs Q (with K), dP^T needs dO (with V), so dO keeps arriving while S^T is computed.
      load_tile<BLOCK_COLS, D, D + PAD, NUM_THREADS>(q_tile, q_head, q_start, seq_q, head_dim);
      __pipeline_commit();
      load_tile<BLOCK_COLS, D, D + PAD, NUM_THREADS>(do_tile, do_head, q_start, seq_q, head_dim);
      __pipeline_commit();
      // Queries past seq_q: L = +infinity makes their P exactly 0 (their Q and dO rows are zeros: S = 0), so they
      // add nothing to dK or dV.
      for (int idx = threadIdx.x; idx < BLOCK_COLS; idx += NUM_THREADS) {
        const int row = q_start + idx;
        lse_tile[idx] = row < seq_q ? lse_head[row] * LOG2E : INFINITY;
        delta_tile[idx] = row < seq_q ? delta_head[row] : 0.0f;
        if constexpr (MASKS) query_keys[idx] = keys_of(masks, causal, row, seq_q, seq_k);
      }
      __pipeline_wait_prior(1);  // K, V (the first time) and Q landed
      __syncthreads();

      // st[i][j]: key kv_start + ty + i ROW_THREADS against query q_start + tx + j COL_THREADS (P^T, once computed);
      // slope[i][j]: what dS is multiplied by there, 1 but for step 26's soft-cap (its slope)
      float st[THREAD_ROWS][THREAD_COLS] = {}, slope[THREAD_ROWS][THREAD_COLS];
#pragma unroll
      for (int i = 0; i < THREAD_ROWS; ++i)
#pragma unroll
        for (int j = 0; j < THREAD_COLS; ++j) slope[i][j] = 1.0f;
      if constexpr (!MASKS) {
      // TODO (README, Task 4, step 14: recompute this tile's P^T = exp(scale K Q^T - L), masked past the diagonal)
      } else {  // step 26: P^T from the dot products under the masks (masked_probability), with the cap's slopes
        tile_dots<D>(k_tile, q_tile, st, ty, tx);
#pragma unroll
        for (int i = 0; i < THREAD_ROWS; ++i)
#pragma unroll
          for (int j = 0; j < THREAD_COLS; ++j)
            st[i][j] = masked_probability(st[i][j], scale, masks.softcap, lse_tile[tx + j * COL_THREADS],
                                          kv_start + ty + i * ROW_THREADS, query_keys[tx + j * COL_THREADS],
                                          slope[i][j]);
      }

      __pipeline_wait_prior(0);  // dO landed
      __syncthreads();

      // TODO (README, Task 4, step 15: dP^T = V dO^T, dS^T = P^T slope (dP^T - D); then dV += P^T dO and dK += dS^T Q)
      __syncthreads();  // everyone is done with Q, dO, P^T and dS^T before the next tile overwrites them
    }
  }
  __pipeline_wait_prior(0);  // a block that saw no query tile still waits for its own copies

  // TODO (README, Task 4, step 15: write dV and dK = scale dS^T Q for this block's keys)
}

// ----------------------------------------------------------------------------
// Kernel 3: dQ for BLOCK_ROWS queries of one (batch, head). Shapes as kernel 2's; dq like q.
// grid (batch * heads, ceil(seq_q / BLOCK_ROWS)), NUM_THREADS threads, backward_smem_bytes<D>(). MASKS: step 26's
// instance, with `masks`.
template <int D, bool MASKS>
__global__ void __launch_bounds__(NUM_THREADS, 1)
    flash_attention_dq_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                              const float* __restrict__ dout, const float* __restrict__ lse,
                              const float* __restrict__ delta, float* __restrict__ dq, int heads, int kv_heads,
                              int seq_q, int seq_k, int head_dim, float scale, float scale_log2, bool causal,
                              AttentionMasks masks) {
  constexpr int LDP = BLOCK_COLS + P_PAD;
  using vec = acc_vec<D>;
  extern __shared__ float4 smem[];
  float* q_tile = reinterpret_cast<float*>(smem);      // (BLOCK_ROWS, D + PAD): this block's queries
  float* do_tile = q_tile + own_tile_floats<D>();      // (BLOCK_ROWS, D + PAD)
  float* k_tile = do_tile + own_tile_floats<D>();      // (BLOCK_COLS, D + PAD): the walked keys
  float* v_tile = k_tile + walked_tile_floats<D>();    // (BLOCK_COLS, D + PAD)
  float* ds_tile = v_tile + walked_tile_floats<D>();   // (BLOCK_ROWS, LDP): dS, queries by keys

  const int tx = threadIdx.x % COL_THREADS, ty = threadIdx.x / COL_THREADS;
  // blockIdx.y counts down: with a causal mask the last queries see the most keys; they start first.
  const int q_start = (gridDim.y - 1 - blockIdx.y) * BLOCK_ROWS;
  const int batch = blockIdx.x / heads, head = blockIdx.x % heads;
  const int kv_head = head / (heads / kv_heads);
  const size_t q_offset = (size_t)blockIdx.x * seq_q * head_dim;
  q += q_offset, dout += q_offset, dq += q_offset;
  lse += (size_t)blockIdx.x * seq_q;
  delta += (size_t)blockIdx.x * seq_q;
  k += ((size_t)batch * kv_heads + kv_head) * seq_k * head_dim;
  v += ((size_t)batch * kv_heads + kv_head) * seq_k * head_dim;
  const int causal_offset = seq_k - seq_q;

  load_tile<BLOCK_ROWS, D, D + PAD, NUM_THREADS>(q_tile, q, q_start, seq_q, head_dim);
  load_tile<BLOCK_ROWS, D, D + PAD, NUM_THREADS>(do_tile, dout, q_start, seq_q, head_dim);
  __pipeline_commit();

  // L (in log2 units) and D of the thread's rows; rows past seq_q get L = +infinity, so P = 0 there.
  float lse_i[THREAD_ROWS], delta_i[THREAD_ROWS];
#pragma unroll
  for (int i = 0; i < THREAD_ROWS; ++i) {
    const int row = q_start + ty + i * ROW_THREADS;
    lse_i[i] = row < seq_q ? lse[row] * LOG2E : INFINITY;
    delta_i[i] = row < seq_q ? delta[row] : 0.0f;
  }
  vec dq_acc[THREAD_ROWS][ACC_VECS<D>];
#pragma unroll
  for (int i = 0; i < THREAD_ROWS; ++i)
#pragma unroll
    for (int c = 0; c < ACC_VECS<D>; ++c) dq_acc[i][c] = vec{};

  if constexpr (!MASKS) {
  // TODO (README, Task 4, step 16: dQ = scale dS K over the key tiles these queries see; write scale dQ)
  } else {
  // TODO (README, Task 4, step 26: step 16's loop over the key tiles the rows' masks leave, P and dS under them; write scale dQ)
  }
  __pipeline_wait_prior(0);  // a skeleton's copies of Q and dO, never waited for above
}

// ----------------------------------------------------------------------------
// Launcher: called by task4/binding.cpp on PyTorch's current stream. Returns the error of the launches.

// Kernels 2 and 3 for head_dim's tile width D, with the masks (step 26) or without.
template <int D, bool MASKS>
static cudaError_t launch_backward(const AttentionBackwardParams& p, cudaStream_t stream) {
  const size_t smem = backward_smem_bytes<D>();
  cudaError_t err = cudaFuncSetAttribute(flash_attention_dkdv_kernel<D, MASKS>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(flash_attention_dq_kernel<D, MASKS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)smem);
  if (err != cudaSuccess) return err;
  const float scale_log2 = p.scale * LOG2E;
  flash_attention_dkdv_kernel<D, MASKS><<<dim3(p.batch * p.kv_heads, ceil_div(p.seq_k, BLOCK_ROWS)), NUM_THREADS,
                                          smem, stream>>>(p.q, p.k, p.v, p.dout, p.lse, p.delta, p.dk, p.dv, p.heads,
                                                          p.kv_heads, p.seq_q, p.seq_k, p.head_dim, p.scale,
                                                          scale_log2, p.causal, p.masks);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  flash_attention_dq_kernel<D, MASKS><<<dim3(p.batch * p.heads, ceil_div(p.seq_q, BLOCK_ROWS)), NUM_THREADS, smem,
                                        stream>>>(p.q, p.k, p.v, p.dout, p.lse, p.delta, p.dq, p.heads, p.kv_heads,
                                                  p.seq_q, p.seq_k, p.head_dim, p.scale, scale_log2, p.causal,
                                                  p.masks);
  return cudaGetLastError();
}

// The backward pass: dq, dk and dv (overwritten) from dout and what the forward saved; the parameters are
// described in device/params.h (p.masks: step 26's, a window needing causal and documents seq_q == seq_k).
cudaError_t flash_attention_backward(const AttentionBackwardParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0 || p.seq_q < 1 || p.seq_k < 1 ||
      p.head_dim < 1 || p.head_dim > MAX_HEAD_DIM || (p.causal && p.seq_q > p.seq_k) ||
      (p.seq_q - 1) / BLOCK_ROWS >= 65535 || (p.seq_k - 1) / BLOCK_ROWS >= 65535 ||
      (p.masks.window_left >= 0 && !p.causal) || !(p.masks.softcap >= 0.0f) ||
      (p.masks.cu_seqlens != nullptr && (p.masks.documents < 1 || p.seq_q != p.seq_k)))
    return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;

  const long long rows = (long long)p.batch * p.heads * p.seq_q;
  constexpr int ROWS_PER_BLOCK = 256 / 32;
  delta_kernel<<<(unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), 256, 0, stream>>>(p.out, p.dout, p.delta,
                                                                                             rows, p.head_dim);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  return with_head_dim_tile(p.head_dim, [&](auto tile) {
    constexpr int D = decltype(tile)::value;
    return has_masks(p.masks) ? launch_backward<D, true>(p, stream) : launch_backward<D, false>(p, stream);
  });
}
