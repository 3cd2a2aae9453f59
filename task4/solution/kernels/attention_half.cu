// Task 4, optional part (README, Task 4, steps 8-11): the fused kernel in bf16 and fp16 on the tensor cores.
//
//   out = softmax(scale * Q K^T + mask) V        q, k, v, out in bf16 or fp16; scores, the online
//                                                softmax and the accumulator in float32
//
// FlashAttention-2's forward as it runs on Ampere and Hopper (mma.sync, not Hopper's wgmma):
// - a block of WARPS warps takes WARPS * WARP_ROWS query rows of one (batch, head); each warp owns WARP_ROWS
//   of them, M_TILES tiles of 16 (FlashAttention-2's split: no warp waits on another's softmax), so
//   that each K or V fragment a warp reads from shared memory feeds M_TILES mmas: with one tile of 16
//   rows, shared memory, not the tensor cores, sets the pace;
// - Q's tile is loaded once into shared memory; its mma operands stay in registers for head_dim up
//   to 64, and are read again at each tile for larger ones (registers are short there);
// - K and V come in tiles of BLOCK_COLS rows (BLOCK_COLS_SMALL where shared memory is short: see
//   launch) through cp.async, two stages: tile j + 1 is on its way while tile j is used;
// - S = Q K^T with mma.sync.m16n8k16 (K read by ldmatrix: its rows are the B operand's columns);
// - the online softmax on S's accumulator fragments (a thread holds 2 rows x 2 columns per 8-key
//   n-tile; a row's maximum and sum are shuffled over the 4 threads that share it);
// - P stays in registers: the accumulator layout of two neighbouring n-tiles is the A operand
//   layout of one k16 step, so P V needs only a conversion to 16 bits;
// - V read by ldmatrix.trans (V's rows are keys: the B operand wants keys along k);
// - tiles past the causal diagonal are never loaded.
// Shared memory rows are padded by 16 bytes: 8 rows read at the same column by ldmatrix then fall
// in 8 different groups of 4 banks for every head_dim that is a multiple of 16 (no conflict).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "device/common.cuh"  // WARP, LOG2E, ceil_div, with_head_dim_tile
#include "device/half.cuh"    // Half<T>: bf16 and fp16 to and from float, pack (two floats in one register)
#include "device/params.h"    // AttentionParams: what the launcher takes from the binding
#include "device/mma.cuh"     // mma16816, ldmatrix_x4(_trans), cp_async16, cp_async_commit/wait, fast_exp2

namespace {

constexpr int M_TILES = 2;                     // m16 tiles of query rows per warp
constexpr int WARP_ROWS = 16 * M_TILES;        // query rows per warp
constexpr int BLOCK_WARPS = 4;                 // warps per block (two blocks an SM)
constexpr int BLOCK_WARPS_LARGE_D = 8;         // above head_dim 96 where such a block fits (one an SM)
constexpr int BLOCK_COLS = 64;                 // keys per K/V tile
constexpr int BLOCK_COLS_SMALL = 32;           // above head_dim 96 where an 8-warp block does not fit
constexpr int Q_IN_REGISTERS_UP_TO = 64;       // head_dim tiles that keep Q's operands in registers
constexpr int LOADS_UNROLLED_UP_TO = 64;       // head_dim tiles whose K/V tile loads are unrolled
constexpr int Q_STEPS_UNROLLED = 8;            // k16 steps unrolled where Q's operands are read per step (8: all)
constexpr bool SKIP_SETTLED_RESCALE = true;    // skip O's rescale where no row of the warp has a new maximum
constexpr int MAX_HEAD_DIM = 128;
constexpr int PAD = 8;                         // halves (16 bytes) after each shared-memory row
// rows x D of a (rows_valid x head_dim, row-major) matrix into a padded shared tile, zeros past the
// valid rows and columns. VEC: head_dim % 8 == 0 and 16-byte aligned rows, so cp.async 16 bytes at
// a time; else element by element (synchronous).
template <typename T, int D, int ROWS, int THREADS, bool VEC>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int rows_valid, int head_dim) {
  constexpr int LD = D + PAD, CHUNKS = D / 8;
  // BEGIN SOLUTION "step 8: copy the tile 16 bytes at a time (cp.async), zeros past the valid rows and columns"
  // A trip count known at compile time: the loop runs without the checks a loop from threadIdx.x needs. Unrolled,
  // each copy's address is computed once for all tiles and kept: registers that, past head_dim 64, O needs.
#pragma unroll(D <= LOADS_UNROLLED_UP_TO ? ceil_div(ROWS * CHUNKS, THREADS) : 1)
  for (int i = 0; i < ceil_div(ROWS * CHUNKS, THREADS); ++i) {
    const int idx = threadIdx.x + i * THREADS;
    if (ROWS * CHUNKS % THREADS != 0 && idx >= ROWS * CHUNKS) break;
    const int row = idx / CHUNKS, col = (idx % CHUNKS) * 8;
    T* dst = tile + row * LD + col;
    if constexpr (VEC) {
      const bool inside = row < rows_valid && col < head_dim;
      cp_async16(dst, src + (inside ? row * head_dim + col : 0), inside ? 16 : 0);  // int: row < ROWS
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        dst[e] = row < rows_valid && col + e < head_dim ? src[(size_t)row * head_dim + col + e] : Half<T>::from_float(0.0f);
    }
  }
  // END SOLUTION
}

// One k16 step of S = Q K^T for a warp: s[mt][n] += a[mt] (16 rows x 16 of head_dim) times keys n*8..n*8+7
// (16 of head_dim each, read from shared memory at k_rows by ldmatrix); each K fragment serves every m16 tile.
template <typename T, int M, int N, int LD>
__device__ __forceinline__ void qk_step(float (&s)[M][N][4], const uint32_t (&a)[M][4], const T* k_rows) {
  // BEGIN SOLUTION "step 9: one k16 step of S = Q K^T: K's B operands by ldmatrix_x4, each serving every m16 tile"
#pragma unroll
  for (int n = 0; n < N; n += 2) {
    uint32_t b[4];  // keys n*8.. (b[0], b[1]) and n*8+8.. (b[2], b[3])
    ldmatrix_x4(b, k_rows + n * 8 * LD);
#pragma unroll
    for (int mt = 0; mt < M; ++mt) {
      mma16816<T>(s[mt][n], a[mt], b[0], b[1]);
      mma16816<T>(s[mt][n + 1], a[mt], b[2], b[3]);
    }
  }
  // END SOLUTION
}

// grid (batch * heads, ceil(seq_q / (WARPS * WARP_ROWS))), WARPS * 32 threads, smem_bytes<T, D, COLS, WARPS>() of
// shared memory.
// q, out: (batch * heads, seq_q, head_dim); k, v: (batch * kv_heads, seq_k, head_dim); D is head_dim
// rounded up to a multiple of 16. scale_log2 = scale * log2(e).
template <typename T, int D, int COLS, int WARPS, bool VEC>
__global__ void __launch_bounds__(WARPS * WARP)
    flash_attention_half_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                T* __restrict__ out, float* __restrict__ lse, int heads, int kv_heads,
                                const int* __restrict__ key_start,
                                int seq_q, int seq_k, int head_dim, float scale_log2, bool causal) {
  static_assert(D % 16 == 0 && D <= MAX_HEAD_DIM, "D is a multiple of the mma's k (16)");
  constexpr int THREADS = WARPS * WARP, BLOCK_ROWS = WARPS * WARP_ROWS;
  constexpr int LD = D + PAD;
  constexpr int K_STEPS = D / 16;      // k16 steps of Q K^T
  constexpr int S_TILES = COLS / 8;    // n8 tiles of S (keys)
  constexpr int O_TILES = D / 8;       // n8 tiles of O (head_dim)
  extern __shared__ uint4 smem_raw[];
  T* q_tile = reinterpret_cast<T*>(smem_raw);  // (BLOCK_ROWS, LD)
  T* k_tiles = q_tile + BLOCK_ROWS * LD;       // 2 x (COLS, LD)
  T* v_tiles = k_tiles + 2 * COLS * LD;        // 2 x (COLS, LD)

  const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
  const int q_start = (gridDim.y - 1 - blockIdx.y) * BLOCK_ROWS;  // the longest causal rows first
  const int batch = blockIdx.x / heads, head = blockIdx.x % heads;
  const int kv_head = head / (heads / kv_heads);
  q += (size_t)blockIdx.x * seq_q * head_dim;
  out += (size_t)blockIdx.x * seq_q * head_dim;
  if (lse != nullptr) lse += (size_t)blockIdx.x * seq_q;  // step 27
  k += ((size_t)batch * kv_heads + kv_head) * seq_k * head_dim;
  v += ((size_t)batch * kv_heads + kv_head) * seq_k * head_dim;
  if (key_start != nullptr) {  // as the float32 kernel: padded queries get zeros, the rest skip the padding
    const int padding = key_start[batch];  // keys before the first real one
    const int skip = min(seq_q, max(0, padding - (seq_k - seq_q)));
    for (int idx = threadIdx.x; idx < BLOCK_ROWS * head_dim; idx += THREADS) {
      const int row = q_start + idx / head_dim;
      if (row < skip) out[(size_t)row * head_dim + idx % head_dim] = Half<T>::from_float(0.0f);
    }
    k += (size_t)padding * head_dim;
    v += (size_t)padding * head_dim;
    seq_k -= padding;
    q += (size_t)skip * head_dim;
    out += (size_t)skip * head_dim;
    if (lse != nullptr) lse += skip;
    seq_q -= skip;
    if (q_start >= seq_q) return;
  }
  const int causal_offset = seq_k - seq_q;  // query i sees keys j <= i + causal_offset
  // The K/V tiles this block visits: all, or up to the diagonal of its last row.
  const int last_key = causal ? min(seq_k, q_start + BLOCK_ROWS + causal_offset) : seq_k;
  const int num_tiles = last_key > 0 ? ceil_div(last_key, COLS) : 0;

  load_tile<T, D, BLOCK_ROWS, THREADS, VEC>(q_tile, q + (size_t)q_start * head_dim, seq_q - q_start, head_dim);
  if (num_tiles > 0) {
    load_tile<T, D, COLS, THREADS, VEC>(k_tiles, k, seq_k, head_dim);
    load_tile<T, D, COLS, THREADS, VEC>(v_tiles, v, seq_k, head_dim);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // This warp's rows of Q as A operands, one per m16 tile and k16 step: kept in registers for small head_dims;
  // for large ones O alone takes 4 * M_TILES * D / 8 registers, and Q's are read again from shared memory at
  // each k16 step of each tile instead.
  constexpr bool Q_IN_REGISTERS = D <= Q_IN_REGISTERS_UP_TO;
  const T* q_rows = q_tile + (warp * WARP_ROWS + (lane / 8 % 2) * 8 + lane % 8) * LD + (lane / 16) * 8;
  uint32_t q_frag[Q_IN_REGISTERS ? K_STEPS : 1][M_TILES][4] = {};
  // BEGIN SOLUTION "step 9: this warp's Q rows as A operands into q_frag (ldmatrix_x4), when they stay in registers"
  if constexpr (Q_IN_REGISTERS) {
#pragma unroll
    for (int st = 0; st < K_STEPS; ++st)
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) ldmatrix_x4(q_frag[st][mt], q_rows + mt * 16 * LD + st * 16);
  }
  // END SOLUTION

  float o[M_TILES][O_TILES][4] = {};
  float row_max[M_TILES][2], row_sum[M_TILES][2] = {};  // of rows lane / 4 and lane / 4 + 8 of each m16 tile
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) row_max[mt][0] = row_max[mt][1] = -INFINITY;
  const int row0 = q_start + warp * WARP_ROWS + lane / 4;  // row (mt, r) is row0 + mt * 16 + r * 8

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % 2;
    const T* k_tile = k_tiles + stage * COLS * LD;
    const T* v_tile = v_tiles + stage * COLS * LD;
    if (tile + 1 < num_tiles) {  // the next tile on its way while this one is used
      const int next = (tile + 1) * COLS;
      load_tile<T, D, COLS, THREADS, VEC>(k_tiles + (1 - stage) * COLS * LD, k + (size_t)next * head_dim,
                                       seq_k - next, head_dim);
      load_tile<T, D, COLS, THREADS, VEC>(v_tiles + (1 - stage) * COLS * LD, v + (size_t)next * head_dim,
                                       seq_k - next, head_dim);
    }
    cp_async_commit();

    // S = Q K^T for this warp's rows and the tile's keys: each K fragment read serves all M_TILES row tiles.
    float s[M_TILES][S_TILES][4] = {};
    // BEGIN SOLUTION "step 9: S = Q K^T for the tile: qk_step per k16 step, with q_frag's operands or ones read again"
    const T* k_rows = k_tile + ((lane / 16) * 8 + lane % 8) * LD + (lane / 8 % 2) * 8;
    if constexpr (Q_IN_REGISTERS) {
#pragma unroll
      for (int st = 0; st < K_STEPS; ++st) qk_step<T, M_TILES, S_TILES, LD>(s, q_frag[st], k_rows + st * 16);
    } else {
#pragma unroll Q_STEPS_UNROLLED  // unrolled, the compiler loads Q's operands for every step early
      for (int st = 0; st < K_STEPS; ++st) {
        uint32_t a[M_TILES][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) ldmatrix_x4(a[mt], q_rows + mt * 16 * LD + st * 16);
        qk_step<T, M_TILES, S_TILES, LD>(s, a, k_rows + st * 16);
      }
    }
    // END SOLUTION

    // Scale, mask the tiles that need it, and fold into the online softmax.
    uint32_t p[M_TILES][S_TILES / 2][4] = {};  // P as A operands of P V, one per m16 tile and k16 step (16 keys)
    const int col_start = tile * COLS;
    // Only the last tile (keys past seq_k) and, causal, the tiles across this warp's diagonal need a mask: a pass of
    // its own there, that the whole warp takes or none does (two comparisons per score on every tile were over a third
    // of a tile's instructions at head_dim 64).
    const bool masked = col_start + COLS > seq_k ||
                        (causal && col_start + COLS - 1 > q_start + warp * WARP_ROWS + causal_offset);
    // s[mt][n][e] is key col_start + key_offset + n * 8 + e % 2 of row row0 + mt * 16 + (e / 2) * 8. It is masked
    // when n * 8 + e % 2 >= keys_left (past seq_k) or, causal, > diagonal + mt * 16 + (e / 2) * 8 (the future):
    // constants (once unrolled) against two numbers per thread.
    const int key_offset = (lane % 4) * 2;
    const int keys_left = seq_k - col_start - key_offset;
    const int diagonal = row0 + causal_offset - col_start - key_offset;
    // BEGIN SOLUTION "step 10: the online softmax on S's fragments, P packed as the A operands of P V"
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
      for (int n = 0; n < S_TILES; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][n][e] *= scale_log2;
    if (masked) {
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int n = 0; n < S_TILES; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n * 8 + e % 2;
            if (key >= keys_left || (causal && key > diagonal + mt * 16 + (e / 2) * 8)) s[mt][n][e] = -INFINITY;
          }
    }
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < S_TILES; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[mt][n][e]);
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        const float new_max = fmaxf(row_max[mt][r], tile_max[r]);
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row with no key yet: no NaN
        alpha[r] = fast_exp2(row_max[mt][r] - base);
        row_max[mt][r] = new_max;
        row_sum[mt][r] *= alpha[r];
        tile_max[r] = base;
      }
#pragma unroll
      for (int n = 0; n < S_TILES; ++n) {
        const float p0 = fast_exp2(s[mt][n][0] - tile_max[0]), p1 = fast_exp2(s[mt][n][1] - tile_max[0]);
        const float p2 = fast_exp2(s[mt][n][2] - tile_max[1]), p3 = fast_exp2(s[mt][n][3] - tile_max[1]);
        row_sum[mt][0] += p0 + p1;
        row_sum[mt][1] += p2 + p3;
        p[mt][n / 2][(n % 2) * 2] = Half<T>::pack(p0, p1);
        p[mt][n / 2][(n % 2) * 2 + 1] = Half<T>::pack(p2, p3);
      }
      // O's rescale costs 4 * O_TILES multiplies a tile (2 a score at head_dim 128), and once the maxima settle
      // most tiles leave every row's alone (alpha == 1 exactly): the warp skips it then, all lanes together.
      if (!SKIP_SETTLED_RESCALE || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int d = 0; d < O_TILES; ++d) {
          o[mt][d][0] *= alpha[0];
          o[mt][d][1] *= alpha[0];
          o[mt][d][2] *= alpha[1];
          o[mt][d][3] *= alpha[1];
        }
      }
    }
    // END SOLUTION

    // O += P V: each V fragment read serves all M_TILES row tiles.
    // BEGIN SOLUTION "step 11: O += P V: V's B operands by ldmatrix_x4_trans, each serving every m16 tile"
    const T* v_rows = v_tile + ((lane / 8 % 2) * 8 + lane % 8) * LD + (lane / 16) * 8;
#pragma unroll
    for (int st = 0; st < COLS / 16; ++st)
#pragma unroll
      for (int d = 0; d < O_TILES; d += 2) {
        uint32_t b[4];  // keys st*16.. : head_dim d*8.. (b[0], b[1]) and d*8+8.. (b[2], b[3])
        ldmatrix_x4_trans(b, v_rows + st * 16 * LD + d * 8);
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
          mma16816<T>(o[mt][d], p[mt][st], b[0], b[1]);
          mma16816<T>(o[mt][d + 1], p[mt][st], b[2], b[3]);
        }
      }
    // END SOLUTION
    cp_async_wait<0>();
    __syncthreads();  // the next tile has landed, and nobody reads this stage any more
  }

  // out = O / l: the row sums are still split over the 4 threads of each row.
  // BEGIN SOLUTION "step 11: out = O / l, l summed over the row's 4 threads; zeros for a row that saw no key"
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = row0 + mt * 16 + r * 8;
      if (row >= seq_q) continue;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row that saw no key: zeros
      T* out_row = out + (size_t)row * head_dim;
#pragma unroll
      for (int d = 0; d < O_TILES; ++d) {
        const int col = d * 8 + (lane % 4) * 2;
        if (col < head_dim) out_row[col] = Half<T>::from_float(o[mt][d][r * 2] * inv);
        if (col + 1 < head_dim) out_row[col + 1] = Half<T>::from_float(o[mt][d][r * 2 + 1] * inv);
      }
    }
  // END SOLUTION
  if (lse == nullptr) return;
  // BEGIN SOLUTION "step 27: lse = L = (m + log2 l) ln 2 for each row, m in the scaled log2 units of the softmax"
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mt][r];  // split over the row's 4 threads, as above; their row_max is one
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = row0 + mt * 16 + r * 8;
      if (row < seq_q && lane % 4 == 0) lse[row] = sum > 0.0f ? (row_max[mt][r] + log2f(sum)) * LN2 : -INFINITY;
    }
  // END SOLUTION
}

template <typename T, int D, int COLS, int WARPS>
constexpr size_t smem_bytes() {
  return (size_t)(WARPS * WARP_ROWS + 4 * COLS) * (D + PAD) * sizeof(T);
}

template <typename T, int D, int COLS, int WARPS>
cudaError_t launch_tiles(const AttentionParams& p, cudaStream_t stream) {
  const bool vec = p.head_dim % 8 == 0 &&
                   ((reinterpret_cast<uintptr_t>(p.q) | reinterpret_cast<uintptr_t>(p.k) |
                     reinterpret_cast<uintptr_t>(p.v)) % 16) == 0;
  const size_t smem = smem_bytes<T, D, COLS, WARPS>();
  const dim3 grid(p.batch * p.heads, ceil_div(p.seq_q, WARPS * WARP_ROWS));
  auto kernel = vec ? flash_attention_half_kernel<T, D, COLS, WARPS, true>
                    : flash_attention_half_kernel<T, D, COLS, WARPS, false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return err;
  kernel<<<grid, WARPS * WARP, smem, stream>>>(static_cast<const T*>(p.q), static_cast<const T*>(p.k),
                                          static_cast<const T*>(p.v), static_cast<T*>(p.out), p.lse, p.heads, p.kv_heads,
                                          p.key_start, p.seq_q, p.seq_k, p.head_dim, p.scale * LOG2E, p.causal);
  return cudaGetLastError();
}

// Above head_dim 96 a block of 8 warps and 64-key tiles (139 KB of shared memory at head_dim 128) runs faster than
// two of 4 warps (102 KB each): each K/V tile serves 256 query rows, not 128. It fits an H100's SM (227 KB a block)
// and an A100's (163 KB), not the 99 KB a block of an RTX 30xx/40xx, L4 or L40: there a block has 4 warps and 32-key
// tiles (68 KB). Up to head_dim 96, 4 warps and 64-key tiles fit everywhere and are the faster.
template <typename T, int D>
cudaError_t launch(const AttentionParams& p, cudaStream_t stream) {
#define LAUNCH_TILES(COLS, WARPS) launch_tiles<T, D, COLS, WARPS>(p, stream)
  if constexpr (D > 96) {
    int device = 0, per_block = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    if (smem_bytes<T, D, BLOCK_COLS, BLOCK_WARPS_LARGE_D>() <= (size_t)per_block)
      return LAUNCH_TILES(BLOCK_COLS, BLOCK_WARPS_LARGE_D);
    return LAUNCH_TILES(BLOCK_COLS_SMALL, BLOCK_WARPS);
  } else {
    return LAUNCH_TILES(BLOCK_COLS, BLOCK_WARPS);
  }
#undef LAUNCH_TILES
}

}  // namespace

// The forward pass in bf16 or fp16; the parameters are described in device/params.h (p.bf16 picks the type; p.lse,
// for the backward part of steps 27-30: nullptr, or where each row's log-sum-exp goes).
cudaError_t flash_attention_half_forward(const AttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0 || p.seq_q < 1 || p.seq_k < 1 ||
      p.head_dim < 1 || p.head_dim > MAX_HEAD_DIM || (p.causal && p.seq_q > p.seq_k) ||
      (p.seq_q - 1) / (BLOCK_WARPS * WARP_ROWS) >= 65535)  // grid.y, at the smaller block
    return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  return with_head_dim_tile(p.head_dim, [&](auto tile) {
    constexpr int D = decltype(tile)::value;
    return p.bf16 ? launch<__nv_bfloat16, D>(p, stream) : launch<__half, D>(p, stream);
  });
}
