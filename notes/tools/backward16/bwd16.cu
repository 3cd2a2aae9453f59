// Experiment (issue 58, notes/backward16-plan.md steps 24-26): FlashAttention-2's backward in bf16/fp16 on mma.sync.
// Not the kit's file yet: checked and timed by bwd16.py on the device before it becomes README steps.
//
//   P  = exp(scale Q K^T - L)      dV = P^T dO      dP = dO V^T      dS = P (dP - D)      dQ = scale dS K
//   dK = scale dS^T Q              D = rowsum(dO * O), L saved by the forward
//
// Three kernels: delta_kernel (D), dkdv_kernel (a block owns BLOCK_N = 16 WARPS keys of one (batch, key/value head):
// K and V in shared memory, dK and dV in registers; it walks the query tiles of every query head of its group, Q and
// dO double-buffered by cp.async; warp w owns keys 16w .. 16w + 15 of S^T, dP^T, dK and dV; P^T and dS^T go from the
// accumulators to A operands in registers; dS^T also goes to shared memory, from where the warps split the tile's
// dQ += dS K and add it to a float32 dq_accum with atomics), and dq_kernel (dq = scale dq_accum, in 16 bits).
// Layouts: q, out, dout, dq (batch * heads, seq_q, head_dim); k, v, dk, dv (batch * kv_heads, seq_k, head_dim);
// lse, delta (batch * heads, seq_q) float32 (lse in natural-log units); dq_accum like q, float32, zeroed first.
// head_dim == D here (64 or 128); any seq_q, seq_k; causal aligned to the end (seq_q <= seq_k).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "device/common.cuh"  // WARP, LOG2E, ceil_div
#include "device/half.cuh"    // Half<T>
#include "device/mma.cuh"     // mma16816, ldmatrix_x4(_trans), cp_async16, cp_async_commit/wait, fast_exp2

#include "backward_common.cuh"  // add_pair, delta_kernel, dq_kernel
#include "bwd16.h"             // Backward16Params

namespace {

using backward_experiment::add_pair, backward_experiment::delta_kernel, backward_experiment::dq_kernel;

constexpr int PAD = 8;  // 16-bit values after each shared-memory row: ldmatrix's 8 rows in 8 bank groups

// rows x D of (rows_valid x D) rows into a padded shared tile, zeros past rows_valid; 16 bytes a copy.
template <typename T, int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int rows_valid) {
  constexpr int CHUNKS = D / 8, LD = D + PAD;
#pragma unroll
  for (int i = 0; i < ceil_div(ROWS * CHUNKS, THREADS); ++i) {
    const int idx = threadIdx.x + i * THREADS;
    if (ROWS * CHUNKS % THREADS != 0 && idx >= ROWS * CHUNKS) break;
    const int row = idx / CHUNKS, col = (idx % CHUNKS) * 8;
    const bool inside = row < rows_valid;
    cp_async16(tile + row * LD + col, src + (inside ? (size_t)row * D + col : 0), inside ? 16 : 0);
  }
}

// c[n] (16 rows x N*8) += rows of `a` (16 x D, row-major at a_rows, this lane's ldmatrix address) times the N*8 rows
// of `b` (N*8 x D, row-major at b_rows) transposed: S^T = K Q^T and dP^T = V dO^T.
template <typename T, int D, int N, int LD>
__device__ __forceinline__ void rows_times_rows_t(float (&c)[N][4], const T* a_rows, const T* b_rows) {
#pragma unroll
  for (int st = 0; st < D / 16; ++st) {
    uint32_t a[4];
    ldmatrix_x4(a, a_rows + st * 16);
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, b_rows + n * 8 * LD + st * 16);
      mma16816<T>(c[n], a, b[0], b[1]);
      mma16816<T>(c[n + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x D) += A (16 x K, as K/16 A operands in registers) times B (K x D, row-major in shared memory at b_rows,
// read transposed): dV += P^T dO and dK += dS^T Q.
template <typename T, int D, int KSTEPS, int LD>
__device__ __forceinline__ void frags_times_rows(float (&acc)[D / 8][4], const uint32_t (&a)[KSTEPS][4],
                                                 const T* b_rows) {
#pragma unroll
  for (int st = 0; st < KSTEPS; ++st)
#pragma unroll
    for (int d = 0; d < D / 8; d += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_rows + st * 16 * LD + d * 8);
      mma16816<T>(acc[d], a[st], b[0], b[1]);
      mma16816<T>(acc[d + 1], a[st], b[2], b[3]);
    }
}

// The accumulator of a 16 x (2 KSTEPS * 8) product as KSTEPS A operands (mma.sync's C layout to its A layout, as
// steps 10-11 pack P).
template <typename T, int KSTEPS>
__device__ __forceinline__ void pack_a(uint32_t (&a)[KSTEPS][4], const float (&c)[2 * KSTEPS][4]) {
#pragma unroll
  for (int st = 0; st < KSTEPS; ++st) {
    a[st][0] = Half<T>::pack(c[2 * st][0], c[2 * st][1]);
    a[st][1] = Half<T>::pack(c[2 * st][2], c[2 * st][3]);
    a[st][2] = Half<T>::pack(c[2 * st + 1][0], c[2 * st + 1][1]);
    a[st][3] = Half<T>::pack(c[2 * st + 1][2], c[2 * st + 1][3]);
  }
}

template <typename T, int D, int BLOCK_M, int WARPS>
constexpr size_t dkdv_smem_bytes() {
  constexpr int BLOCK_N = 16 * WARPS;
  return sizeof(T) * ((2 * BLOCK_N + 4 * BLOCK_M) * (D + PAD) + BLOCK_N * (BLOCK_M + PAD)) +
         sizeof(float) * 4 * BLOCK_M;
}

// grid (batch * kv_heads, ceil(seq_k / BLOCK_N)), WARPS * 32 threads, dkdv_smem_bytes().
template <typename T, int D, int BLOCK_M, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP, 1) dkdv_kernel(const Backward16Params p) {
  constexpr int BLOCK_N = 16 * WARPS, THREADS = WARPS * WARP, LD = D + PAD, LDS = BLOCK_M + PAD;
  constexpr int QT = BLOCK_M / 8;  // n8 tiles of S^T (queries)
  constexpr int M16 = BLOCK_M / 16, COL_GROUPS = WARPS / M16, DQ_COLS = D / COL_GROUPS;  // dQ's split
  static_assert(WARPS % M16 == 0 && DQ_COLS % 16 == 0, "the warps split dQ's tile in whole 16 x 16 pieces");
  extern __shared__ uint4 smem_raw[];
  T* k_tile = reinterpret_cast<T*>(smem_raw);  // (BLOCK_N, LD)
  T* v_tile = k_tile + BLOCK_N * LD;           // (BLOCK_N, LD)
  T* q_tiles = v_tile + BLOCK_N * LD;          // 2 x (BLOCK_M, LD)
  T* do_tiles = q_tiles + 2 * BLOCK_M * LD;    // 2 x (BLOCK_M, LD)
  T* ds_tile = do_tiles + 2 * BLOCK_M * LD;    // (BLOCK_N, LDS): dS^T, keys by queries
  float* lse_tiles = reinterpret_cast<float*>(ds_tile + BLOCK_N * LDS);  // 2 x BLOCK_M, log2 units
  float* delta_tiles = lse_tiles + 2 * BLOCK_M;                         // 2 x BLOCK_M

  const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
  const int batch = blockIdx.x / p.kv_heads, kv_head = blockIdx.x % p.kv_heads, group = p.heads / p.kv_heads;
  const int n0 = blockIdx.y * BLOCK_N, seq_q = p.seq_q, seq_k = p.seq_k;
  const int causal_offset = seq_k - seq_q;  // query i sees keys j <= i + causal_offset
  const size_t kv_offset = (size_t)blockIdx.x * seq_k * D + (size_t)n0 * D;
  const T* q = static_cast<const T*>(p.q);
  const T* dout = static_cast<const T*>(p.dout);

  load_tile<T, D, BLOCK_N, THREADS>(k_tile, static_cast<const T*>(p.k) + kv_offset, seq_k - n0);
  load_tile<T, D, BLOCK_N, THREADS>(v_tile, static_cast<const T*>(p.v) + kv_offset, seq_k - n0);
  // the query tiles that see these keys: from the diagonal's (causal) to the last, for each head of the group
  const int first_tile = p.causal ? max(0, n0 - causal_offset) / BLOCK_M : 0;
  const int tiles_per_head = max(0, ceil_div(seq_q, BLOCK_M) - first_tile);
  const int tiles = group * tiles_per_head;
  const auto head_of = [&](int i) { return (size_t)batch * p.heads + kv_head * group + i / tiles_per_head; };
  const auto start_of = [&](int i) { return (first_tile + i % tiles_per_head) * BLOCK_M; };
  const auto prefetch = [&](int i, int stage) {
    const size_t rows = head_of(i) * seq_q + start_of(i);
    load_tile<T, D, BLOCK_M, THREADS>(q_tiles + stage * BLOCK_M * LD, q + rows * D, seq_q - start_of(i));
    load_tile<T, D, BLOCK_M, THREADS>(do_tiles + stage * BLOCK_M * LD, dout + rows * D, seq_q - start_of(i));
  };
  if (tiles > 0) prefetch(0, 0);
  cp_async_commit();

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int key0 = n0 + warp * 16 + lane / 4;  // this lane's keys: key0 and key0 + 8
  const float scale_log2 = p.scale * LOG2E;
  // ldmatrix addresses: A operands from this warp's 16 rows of K or V; B operands (non-transposed) from 16 rows of
  // Q or dO; transposed B operands (rows along k) from Q, dO or K.
  const int a_row = (lane / 8 % 2) * 8 + lane % 8, a_col = (lane / 16) * 8;
  const int b_row = (lane / 16) * 8 + lane % 8, b_col = (lane / 8 % 2) * 8;
  const int t_row = (lane / 8 % 2) * 8 + lane % 8, t_col = (lane / 16) * 8;

  for (int i = 0; i < tiles; ++i) {
    const int stage = i % 2, m0 = start_of(i);
    const size_t head = head_of(i);
    for (int idx = threadIdx.x; idx < BLOCK_M; idx += THREADS) {  // L (log2 units) and D of the tile's queries
      const int row = m0 + idx;
      // queries past seq_q: L = +infinity makes their P exactly 0 (their Q and dO rows are zeros)
      lse_tiles[stage * BLOCK_M + idx] = row < seq_q ? p.lse[head * seq_q + row] * LOG2E : INFINITY;
      delta_tiles[stage * BLOCK_M + idx] = row < seq_q ? p.delta[head * seq_q + row] : 0.0f;
    }
    if (i + 1 < tiles) prefetch(i + 1, 1 - stage);
    cp_async_commit();
    cp_async_wait<1>();  // this tile (and, the first time, K and V) landed
    __syncthreads();
    const T* q_tile = q_tiles + stage * BLOCK_M * LD;
    const T* do_tile = do_tiles + stage * BLOCK_M * LD;
    const float* lse = lse_tiles + stage * BLOCK_M;
    const float* delta = delta_tiles + stage * BLOCK_M;

    // S^T and dP^T for this warp's 16 keys and the tile's queries
    float s[QT][4] = {}, dp[QT][4] = {};
    rows_times_rows_t<T, D, QT, LD>(s, k_tile + (warp * 16 + a_row) * LD + a_col, q_tile + b_row * LD + b_col);
    rows_times_rows_t<T, D, QT, LD>(dp, v_tile + (warp * 16 + a_row) * LD + a_col, do_tile + b_row * LD + b_col);
    // s[n][e]: key key0 + 8 (e / 2), query m0 + 8 n + 2 (lane % 4) + e % 2
    const bool masked = n0 + BLOCK_N > seq_k || (p.causal && n0 + BLOCK_N - 1 > m0 + causal_offset);
#pragma unroll
    for (int n = 0; n < QT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int query = 8 * n + 2 * (lane % 4) + e % 2, key = key0 + 8 * (e / 2);
        float pt = fast_exp2(s[n][e] * scale_log2 - lse[query]);
        // keys past seq_k (zero rows: S = 0, and exp(0 - L) may overflow for very negative scores), and the future
        if (masked && (key >= seq_k || (p.causal && key > m0 + query + causal_offset))) pt = 0.0f;
        s[n][e] = pt;                                 // P^T
        dp[n][e] = pt * (dp[n][e] - delta[query]);    // dS^T
      }
    uint32_t a[BLOCK_M / 16][4];
    pack_a<T, BLOCK_M / 16>(a, s);
    frags_times_rows<T, D, BLOCK_M / 16, LD>(dv, a, do_tile + t_row * LD + t_col);
    pack_a<T, BLOCK_M / 16>(a, dp);
    frags_times_rows<T, D, BLOCK_M / 16, LD>(dk, a, q_tile + t_row * LD + t_col);
    // dS^T to shared memory for dQ (the same 16-bit values dK used)
#pragma unroll
    for (int st = 0; st < BLOCK_M / 16; ++st)
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // a[st][r]: key row warp*16 + lane/4 + 8 (r % 2), queries 16 st + 8 (r / 2) + ..
        const int row = warp * 16 + lane / 4 + 8 * (r % 2), col = 16 * st + 8 * (r / 2) + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(ds_tile + row * LDS + col) = a[st][r];
      }
    __syncthreads();  // dS^T complete

    // dQ (BLOCK_M x D) += dS (BLOCK_M x BLOCK_N) K (BLOCK_N x D): warp w takes m16 tile w % M16 and the DQ_COLS
    // columns from (w / M16) DQ_COLS; dS's A operands read transposed from dS^T, K's B operands transposed.
    {
      const int mt = warp % M16, c0 = (warp / M16) * DQ_COLS;
      float dq[DQ_COLS / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
        // dS rows (queries) 16 mt.., keys 16 kk..: ldmatrix's matrix j is keys 8 (j / 2).., queries 8 (j % 2)..
        uint32_t ds[4];
        ldmatrix_x4_trans(ds, ds_tile + (16 * kk + lane % 8 + 8 * (lane / 16)) * LDS + 16 * mt + 8 * (lane / 8 % 2));
#pragma unroll
        for (int d = 0; d < DQ_COLS / 8; d += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, k_tile + (16 * kk + t_row) * LD + c0 + d * 8 + t_col);
          mma16816<T>(dq[d], ds, b[0], b[1]);
          mma16816<T>(dq[d + 1], ds, b[2], b[3]);
        }
      }
      float* dq_rows = p.dq_accum + (head * seq_q + m0) * D;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = 16 * mt + lane / 4 + 8 * r;
        if (m0 + row >= seq_q) continue;
#pragma unroll
        for (int d = 0; d < DQ_COLS / 8; ++d) {
          const int col = c0 + 8 * d + 2 * (lane % 4);
          add_pair(dq_rows + row * D + col, dq[d][2 * r], dq[d][2 * r + 1]);
        }
      }
    }
    __syncthreads();  // everyone is done with this stage's Q, dO and with dS^T before they are written again
  }
  cp_async_wait<0>();

  T* dk_out = static_cast<T*>(p.dk) + kv_offset;
  T* dv_out = static_cast<T*>(p.dv) + kv_offset;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + lane / 4 + 8 * r;
    if (n0 + row >= seq_k) continue;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      const int col = 8 * d + 2 * (lane % 4);
      *reinterpret_cast<uint32_t*>(dk_out + row * D + col) =
          Half<T>::pack(dk[d][2 * r] * p.scale, dk[d][2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv_out + row * D + col) = Half<T>::pack(dv[d][2 * r], dv[d][2 * r + 1]);
    }
  }
}

// dq = scale dq_accum, in 16 bits.
template <typename T, int D, int BLOCK_M, int WARPS>
cudaError_t launch(const Backward16Params& p, cudaStream_t stream) {
  const auto kernel = dkdv_kernel<T, D, BLOCK_M, WARPS>;
  constexpr size_t smem = dkdv_smem_bytes<T, D, BLOCK_M, WARPS>();
  static_assert(smem <= 227 * 1024, "the tiles fit in a block's shared memory");
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return err;
  kernel<<<dim3(p.batch * p.kv_heads, ceil_div(p.seq_k, 16 * WARPS)), WARPS * WARP, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_for_type(const Backward16Params& p, cudaStream_t stream) {
  const long long rows = (long long)p.batch * p.heads * p.seq_q;
  delta_kernel<T><<<(unsigned)ceil_div((int)rows, 8), 256, 0, stream>>>(
      static_cast<const T*>(p.out), static_cast<const T*>(p.dout), p.delta, rows, p.head_dim);
  cudaError_t err = cudaMemsetAsync(p.dq_accum, 0, sizeof(float) * rows * p.head_dim, stream);
  if (err != cudaSuccess) return err;
  if (p.head_dim == 64)
    err = p.block_m == 32 ? launch<T, 64, 32, 8>(p, stream) : launch<T, 64, 64, 8>(p, stream);
  else
    err = p.block_m == 32 ? launch<T, 128, 32, 8>(p, stream) : launch<T, 128, 64, 8>(p, stream);
  if (err != cudaSuccess) return err;
  dq_kernel<T><<<1024, 256, 0, stream>>>(p.dq_accum, static_cast<T*>(p.dq), rows * p.head_dim, p.scale);
  return cudaGetLastError();
}

}  // namespace

cudaError_t backward16(const Backward16Params& p, cudaStream_t stream) {
  if (p.batch < 1 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads || p.seq_q < 1 || p.seq_k < 1 ||
      (p.head_dim != 64 && p.head_dim != 128) || (p.causal && p.seq_q > p.seq_k) ||
      (p.block_m != 32 && p.block_m != 64))
    return cudaErrorInvalidValue;
  return p.bf16 ? backward_for_type<__nv_bfloat16>(p, stream) : backward_for_type<__half>(p, stream);
}
