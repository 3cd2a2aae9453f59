// Task 4, beyond the README's steps: the same fused attention with both products on the tensor
// cores, close to float32's accuracy ("3xTF32"). Not part of the handout and not graded: the
// performance points stay measured against the FFMA reference (../kernels/attention.cu), the
// kernel the steps build. This one shows what the arithmetic of SDPA's float32 kernel buys.
//
// Why: PyTorch's scaled_dot_product_attention in float32 runs CUTLASS's 3xTF32 on the tensor
// cores, also with torch.backends.cuda.matmul.allow_tf32 off (Nsight Compute on an H200: 3x the
// attention's flops as HMMA instructions; notes/task4-performance.md). A tensor core multiplies
// TF32 numbers (float32 with 10 mantissa bits instead of 23), so one pass loses float32's
// accuracy (about 3e-4 error instead of 1e-6 here). Splitting each float x into a TF32 part
// big(x) and the rest small(x) = x - big(x), which TF32 holds to about 2^-21 of x, gives
//   a * b ~= big(a) big(b) + big(a) small(b) + small(a) big(b)
// dropping small(a) small(b), at most about 2^-22 of a b: three tensor-core products for one
// float32 product, still several times the FFMA rate, and errors of 2.5e-6 here against the
// FFMA reference's 1.1e-6 (the checks allow 2e-5 + 1e-4 |expected|).
//
// The layout is FlashAttention-2's: a block of WARPS warps takes 16 WARPS query rows, each warp
// owns 16 of them against every key of the tile, so the online softmax of a row stays inside
// one warp (its 4 lanes that share the row). The products are mma.sync m16n8k8 with TF32
// inputs and float32 accumulators, per warp:
//   S (16 x BLOCK_COLS)  = Q (16 x D) K^T,   D / 8 steps of 8 over head_dim
//   O (16 x D)          += P (16 x BLOCK_COLS) V,  BLOCK_COLS / 8 steps of 8 keys
// In an m16n8k8 product, lane = 4 g + t (g = 0..7, t = 0..3) holds
//   A (16 x 8, row-major): a0 = A[g][t], a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4]
//   B (8 x 8, k x n):      b0 = B[t][g], b1 = B[t + 4][g]
//   C (16 x 8):            c0 = C[g][2t], c1 = C[g][2t + 1], c2 = C[g + 8][2t], c3 = C[g + 8][2t + 1]
// P leaves S's C fragments as A fragments of P V without a trip through shared memory: the sum
// over a step's 8 keys may take them in any order, so A's column t is taken to be key 2t and
// column t + 4 key 2t + 1, which is where C already holds them (a = c0, c2, c1, c3), and V's
// rows are read in that same order.
//
// Measured on an H200 (fp32, TF32 off; notes/task4-performance.md), time and SDPA's time / ours:
//   B8 H32 S4096 D128   42.8 ms (51.3 TFLOP/s, 1.09x)   causal 22.2 ms (1.09x)
//   B16 H32 S1024 D128   5.60 ms (1.08x)                 causal 3.15 ms (1.10x)
//   B4 H32 S2048 D64     3.03 ms (1.32x)                 causal 1.59 ms (1.38x)
//   B32 H32 S512 D80     1.90 ms (1.52x)                 causal 1.19 ms (1.53x)
// where the FFMA reference is at 0.85x, 0.86x, 1.07x and 1.11x (causal 0.87x, 0.88x, 1.11x,
// 1.11x); 1.01x to 1.10x over `python -m task4.test --solution --sweep` (seq 128 to 8192;
// one run each, and runs differ by 1-2%).

#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "device/common.cuh"       // LOG2E, ceil_div, with_head_dim_tile
#include "device/float_tiles.cuh"  // load_tile: asynchronous copies, as in the FFMA reference
#include "device/params.h"       // AttentionParams: what the launcher takes from the binding

constexpr int WARPS = 8;                     // 4, with 32-key tiles and 2 blocks per SM: 20% slower at D128
constexpr int BLOCK_ROWS = 16 * WARPS;       // query rows per block
constexpr int BLOCK_COLS = 64;               // keys per K/V tile (32: 11% slower at D128)
constexpr int NUM_THREADS = 32 * WARPS;
constexpr int STAGES = 2;                    // K/V tiles in shared memory: the next loads during this one
constexpr int MAX_HEAD_DIM = 128;

// Tiles in shared memory have rows of D + 4 floats: lane 4 g + t reads row g, column t of a
// fragment, and with D a multiple of 8 a row is 4 x (an odd number) words long, so the 32 lanes
// hit 32 different banks (the same holds for V, read at rows 2t and columns g).
template <int D>
constexpr size_t smem_bytes() { return sizeof(float) * (BLOCK_ROWS + STAGES * 2 * BLOCK_COLS) * (D + 4); }
static_assert(smem_bytes<MAX_HEAD_DIM>() <= 227 * 1024, "at most 227 KB of shared memory per block on sm_90");

// x = big + small: big is x rounded to TF32; small is the rest, which the tensor core reads as
// TF32 by dropping its low 13 bits (an error of 2^-10 of small, about 2^-21 of x).
__device__ __forceinline__ void split(float x, uint32_t& big, uint32_t& small) {
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
  small = __float_as_uint(x - __uint_as_float(big));
}

// c += a b for one 16 x 8 x 8 step, TF32 inputs, float32 accumulation.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a b in three TF32 products: A already split, B's two floats split here.
__device__ __forceinline__ void mma_3xtf32(float (&c)[4], const uint32_t (&a_big)[4], const uint32_t (&a_small)[4],
                                           float b0, float b1) {
  uint32_t b0_big, b0_small, b1_big, b1_small;
  split(b0, b0_big, b0_small);
  split(b1, b1_big, b1_small);
  mma_tf32(c, a_small, b0_big, b1_big);
  mma_tf32(c, a_big, b0_small, b1_small);
  mma_tf32(c, a_big, b0_big, b1_big);
}

// q, out: (batch * heads, seq_q, head_dim); k, v: (batch * kv_heads, seq_k, head_dim); key_start:
// nullptr or (batch,) first valid keys; D is head_dim padded up to a multiple of 8.
// grid (batch * heads, ceil(seq_q / BLOCK_ROWS)), NUM_THREADS threads, smem_bytes<D>().
// CAUSAL is a template parameter: compiled into the non-causal kernel too, the warps' skipping
// of tiles (below) made it slower (45.6 ms against 42.7-43.6 at D128, one run each).
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(NUM_THREADS, 1)
    flash_attention_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           float* __restrict__ out, int heads, int kv_heads, const int* __restrict__ key_start,
                           int seq_q, int seq_k, int head_dim, float scale_log2) {
  constexpr int LD = D + 4;
  constexpr int D_STEPS = D / 8;          // k-steps of Q K^T, n-tiles of O
  constexpr int KEY_STEPS = BLOCK_COLS / 8;  // n-tiles of S, k-steps of P V
  static_assert(D % 8 == 0, "head_dim is padded to a multiple of 8");

  extern __shared__ float4 smem[];
  float* q_tile = reinterpret_cast<float*>(smem);  // (BLOCK_ROWS, LD)
  float* kv_tiles = q_tile + BLOCK_ROWS * LD;      // [stage][K, V] (BLOCK_COLS, LD)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // As in the FFMA reference: the last query tiles have the most K/V tiles under a causal mask.
  const int q_start = (gridDim.y - 1 - blockIdx.y) * BLOCK_ROWS;

  // The (batch, head), its key/value head and the padding, as in the FFMA reference.
  const int batch = blockIdx.x / heads, kv_head = blockIdx.x % heads / (heads / kv_heads);
  q += (size_t)blockIdx.x * seq_q * head_dim;
  out += (size_t)blockIdx.x * seq_q * head_dim;
  k += ((size_t)batch * kv_heads + kv_head) * seq_k * head_dim;
  v += ((size_t)batch * kv_heads + kv_head) * seq_k * head_dim;
  if (key_start != nullptr) {
    const int padding = key_start[batch];  // keys before the first real one
    const int skip = min(seq_q, max(0, padding - (seq_k - seq_q)));
    for (int idx = threadIdx.x; idx < BLOCK_ROWS * head_dim; idx += NUM_THREADS) {
      const int row = q_start + idx / head_dim;
      if (row < skip) out[(size_t)row * head_dim + idx % head_dim] = 0.0f;
    }
    k += (size_t)padding * head_dim;
    v += (size_t)padding * head_dim;
    seq_k -= padding;
    q += (size_t)skip * head_dim;
    out += (size_t)skip * head_dim;
    seq_q -= skip;
    if (q_start >= seq_q) return;
  }
  const int row0 = q_start + warp * 16 + g;  // this lane's rows of S and O: row0 and row0 + 8
  const int causal_offset = seq_k - seq_q;   // query i sees keys j <= i + causal_offset

  int kv_end = seq_k;
  if (CAUSAL) kv_end = min(seq_k, min(q_start + BLOCK_ROWS, seq_q) + causal_offset);
  const int num_kv_tiles = ceil_div(kv_end, BLOCK_COLS);

  auto load_kv = [&](int tile, int stage) {
    float* k_tile = kv_tiles + stage * 2 * BLOCK_COLS * LD;
    load_tile<BLOCK_COLS, D, LD, NUM_THREADS>(k_tile, k, tile * BLOCK_COLS, seq_k, head_dim);
    load_tile<BLOCK_COLS, D, LD, NUM_THREADS>(k_tile + BLOCK_COLS * LD, v, tile * BLOCK_COLS, seq_k, head_dim);
  };
  load_tile<BLOCK_ROWS, D, LD, NUM_THREADS>(q_tile, q, q_start, seq_q, head_dim);
  load_kv(0, 0);
  __pipeline_commit();

  float o[D_STEPS][4] = {};  // O's C fragments, unnormalised
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows row0 and row0 + 8, log2 units
  float l[2] = {0.0f, 0.0f};            // this lane's share of their running sums

  for (int tile = 0; tile < num_kv_tiles; ++tile) {
    if (tile + 1 < num_kv_tiles) load_kv(tile + 1, (tile + 1) % STAGES);
    __pipeline_commit();       // (empty after the last tile: the groups stay counted alike)
    __pipeline_wait_prior(1);  // this thread's copies of this tile (and Q) landed
    __syncthreads();           // ... and everyone else's
    const float* k_tile = kv_tiles + (tile % STAGES) * 2 * BLOCK_COLS * LD;
    const float* v_tile = k_tile + BLOCK_COLS * LD;
    const int kv_start = tile * BLOCK_COLS;
    // A warp whose 16 rows see none of this tile's keys (the block's last tiles, near the
    // diagonal) skips its work; the condition is the same for the whole warp, so nothing
    // diverges, and every warp still reaches the barrier below.
    if (!CAUSAL || kv_start <= q_start + warp * 16 + 15 + causal_offset) {
      // S = Q K^T. B[d][key] = K[key][d]: b0 = K[n 8 + g][8 ks + t], b1 = the same 4 columns on.
      float s[KEY_STEPS][4] = {};
#pragma unroll
      for (int ks = 0; ks < D_STEPS; ++ks) {
        const float* qr = q_tile + (warp * 16 + g) * LD + ks * 8 + t;
        uint32_t q_big[4], q_small[4];
        split(qr[0], q_big[0], q_small[0]);
        split(qr[8 * LD], q_big[1], q_small[1]);
        split(qr[4], q_big[2], q_small[2]);
        split(qr[8 * LD + 4], q_big[3], q_small[3]);
#pragma unroll
        for (int n = 0; n < KEY_STEPS; ++n) {
          const float* kr = k_tile + (n * 8 + g) * LD + ks * 8 + t;
          mma_3xtf32(s[n], q_big, q_small, kr[0], kr[4]);
        }
      }

      // Scale, and mask (only the tiles that cross the diagonal or the end of the keys).
      // s[n][e] is row row0 + 8 (e / 2), key kv_start + 8 n + 2 t + e % 2.
      const bool needs_mask = kv_start + BLOCK_COLS > seq_k ||
                              (CAUSAL && kv_start + BLOCK_COLS - 1 > q_start + causal_offset);
#pragma unroll
      for (int n = 0; n < KEY_STEPS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] *= scale_log2;
          const int row = row0 + (e / 2) * 8, col = kv_start + n * 8 + 2 * t + e % 2;
          if (needs_mask && (col >= seq_k || (CAUSAL && col > row + causal_offset))) s[n][e] = -INFINITY;
        }

      // Online softmax of the lane's two rows; the 4 lanes of a row (t = 0..3) are neighbours.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float row_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < KEY_STEPS; ++n) row_max = fmaxf(row_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
        // Key 0 is visible to every row, so tile 0 makes m_new finite (as in the FFMA reference).
        const float m_new = fmaxf(m[h], row_max);
        const float alpha = exp2f(m[h] - m_new);
        float row_sum = 0.0f;
#pragma unroll
        for (int n = 0; n < KEY_STEPS; ++n)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            s[n][e] = exp2f(s[n][e] - m_new);  // now P
            row_sum += s[n][e];
          }
        l[h] = l[h] * alpha + row_sum;
        m[h] = m_new;
#pragma unroll
        for (int n = 0; n < D_STEPS; ++n) {
          o[n][2 * h] *= alpha;
          o[n][2 * h + 1] *= alpha;
        }
      }

      // O += P V. Step n takes keys 8 n + 2 t (A's column t) and 8 n + 2 t + 1 (column t + 4):
      // a = c0, c2, c1, c3 of S's n-th tile; b0 = V[8 n + 2 t][8 nd + g], b1 = the next key's.
#pragma unroll
      for (int n = 0; n < KEY_STEPS; ++n) {
        uint32_t p_big[4], p_small[4];
        split(s[n][0], p_big[0], p_small[0]);
        split(s[n][2], p_big[1], p_small[1]);
        split(s[n][1], p_big[2], p_small[2]);
        split(s[n][3], p_big[3], p_small[3]);
        const float* vr = v_tile + (n * 8 + 2 * t) * LD + g;
#pragma unroll
        for (int nd = 0; nd < D_STEPS; ++nd) mma_3xtf32(o[nd], p_big, p_small, vr[nd * 8], vr[LD + nd * 8]);
      }
    }
    __syncthreads();  // everyone is done with this stage before the next iteration's copies reuse it
  }

  // Sum l across the row's 4 lanes, normalise, write the rows and columns that exist.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = row0 + 8 * h;
    if (row >= seq_q) continue;
    const float inv = 1.0f / sum;
    float* out_row = out + (size_t)row * head_dim;
#pragma unroll
    for (int nd = 0; nd < D_STEPS; ++nd) {
      const int col = nd * 8 + 2 * t;
      if (col < head_dim) out_row[col] = o[nd][2 * h] * inv;
      if (col + 1 < head_dim) out_row[col + 1] = o[nd][2 * h + 1] * inv;
    }
  }
}

template <int D, bool CAUSAL>
static cudaError_t launch_as(const AttentionParams& p, cudaStream_t stream) {
  const size_t smem = smem_bytes<D>();
  cudaError_t err = cudaFuncSetAttribute(flash_attention_kernel<D, CAUSAL>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.batch * p.heads, ceil_div(p.seq_q, BLOCK_ROWS));
  flash_attention_kernel<D, CAUSAL><<<grid, NUM_THREADS, smem, stream>>>(
      static_cast<const float*>(p.q), static_cast<const float*>(p.k), static_cast<const float*>(p.v),
      static_cast<float*>(p.out), p.heads, p.kv_heads, p.key_start, p.seq_q, p.seq_k, p.head_dim, p.scale * LOG2E);
  return cudaGetLastError();
}

// The launcher task4/binding.cpp calls, as in the FFMA reference (no lse: this folder has no backward part).
cudaError_t flash_attention_forward(const AttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0 || p.seq_q < 1 || p.seq_k < 1 ||
      p.head_dim < 1 || p.head_dim > MAX_HEAD_DIM || (p.causal && p.seq_q > p.seq_k) || p.lse != nullptr ||
      (p.seq_q - 1) / BLOCK_ROWS >= 65535)
    return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  return with_head_dim_tile(p.head_dim, [&](auto tile) {
    constexpr int D = decltype(tile)::value;
    return p.causal ? launch_as<D, true>(p, stream) : launch_as<D, false>(p, stream);
  });
}

int flash_attention_block_rows() { return BLOCK_ROWS; }
int flash_attention_block_cols() { return BLOCK_COLS; }
int flash_attention_max_head_dim() { return MAX_HEAD_DIM; }
