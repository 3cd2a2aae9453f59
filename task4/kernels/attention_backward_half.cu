// Task 4, steps 27-30 (optional): the backward pass of FlashAttention-2 in bf16 and fp16 on the tensor cores.
//
// The same gradients as steps 12-16 (kernels/attention_backward.cu says each), from 16-bit q, k, v, out and dO and
// the forward's float32 L (step 27, in kernels/attention_half.cu):
//
//   P  = exp(scale Q K^T - L)      dV = P^T dO      dP = dO V^T      dS = P (dP - D)      D = rowsum(dO * O)
//   dK = scale dS^T Q              dQ = scale dS K
//
// Every product on mma.sync.m16n8k16 (16-bit operands, float32 sums), as steps 8-11's forward. Three kernels:
//   1. delta_kernel (step 28): D for every query row, summed in float32 (D is a difference of near-equal numbers
//      in dS = P (dP - D): never rounded to 16 bits).
//   2. dkdv_kernel (steps 28-30): a block of WARPS warps owns 16 * WARPS keys of one (batch, key/value head): their
//      K and V in shared memory, their dK and dV in registers. It walks the query tiles (BLOCK_QUERIES rows) that
//      see them, of every query head of the group, Q and dO double-buffered by cp.async. Warp w owns keys 16w ..
//      16w + 15 of everything: its rows of S^T = K Q^T and dP^T = V dO^T (its A operands are its K and V rows, the
//      query tile's rows are the B operands), P^T and dS^T computed on those accumulators. P^T is repacked to 16-bit
//      A operands in registers (the accumulator of two n8 tiles is the A operand of one k16 step: step 10's P) for
//      dV += P^T dO: no shared memory for P. dS^T goes to shared memory in 16 bits, where dK += dS^T Q reads its A
//      operands back (the registers it would hold are what a 64-query tile needs) and dQ reads the whole tile's:
//      dQ needs dS K summed over every key block, so the warps split the tile's dQ += dS K and add it to a float32
//      dq_accum in global memory with atomics (step 30). The adds of different blocks land in any order: dQ's last
//      bits may differ from run to run, within float32's rounding.
//   3. dq_kernel (step 30): dq = scale dq_accum, in 16 bits.
// FlashAttention-2's way: 5 tile products a pair of tiles, where steps 14-16 do 7 (kernel 3 there recomputes S and
// dP). README, Task 4, step 30, weighs the two.
//
// Layouts: q, out, dout, dq (batch * heads, seq_q, head_dim); k, v, dk, dv (batch * kv_heads, seq_k, head_dim);
// lse, delta (batch * heads, seq_q) float32, lse in natural-log units; dq_accum like q in float32, zeros. head_dim a
// multiple of 8, at most 128, and every tensor 16-byte aligned (the binding pads and copies a caller's that are not:
// each copy moves 16 bytes). Causal aligned to the end (seq_q <= seq_k); no padding (key_start), as steps 12-16.
// The kernels trust their arguments: task4/binding.cpp checks the tensors.
//
// Build and test:
//   python -m task4.compile                  build the kernels (this file too)
//   python -m task4.test --backward-half     check them against float64 autograd, then time them against SDPA's

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "device/common.cuh"  // WARP, LOG2E, ceil_div
#include "device/half.cuh"    // Half<T>
#include "device/mma.cuh"     // mma16816, ldmatrix_x4(_trans), cp_async16, cp_async_commit/wait, fast_exp2
#include "device/params.h"    // AttentionBackwardHalfParams

namespace {

// ----------------------------------------------------------------------------
// Tile sizes (tune here)

constexpr int WARPS = 8;                    // warps a block: 16 * WARPS keys (128)
// Queries a tile of Q and dO: 64 spills (ptxas, sm_90a: 255 registers, at head_dim 64 and 128 alike: dK and dV
// take D / 2 registers each, S^T and dP^T QUERIES / 4 each)
constexpr int BLOCK_QUERIES = 32;
constexpr int MAX_HEAD_DIM = 128;
constexpr int PAD = 8;  // 16-bit values after each shared-memory row: ldmatrix's 8 rows in 8 groups of banks
// ----------------------------------------------------------------------------

// rows x D of a (rows_valid x head_dim, row-major) matrix into a padded shared tile, zeros past the valid rows and
// columns; 16 bytes a copy (head_dim % 8 == 0, aligned rows).
template <typename T, int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int rows_valid, int head_dim) {
  constexpr int CHUNKS = D / 8, LD = D + PAD;
#pragma unroll
  for (int i = 0; i < ceil_div(ROWS * CHUNKS, THREADS); ++i) {
    const int idx = threadIdx.x + i * THREADS;
    if (ROWS * CHUNKS % THREADS != 0 && idx >= ROWS * CHUNKS) break;
    const int row = idx / CHUNKS, col = (idx % CHUNKS) * 8;
    const bool inside = row < rows_valid && col < head_dim;
    cp_async16(tile + row * LD + col, src + (inside ? (size_t)row * head_dim + col : 0), inside ? 16 : 0);
  }
}

// c[n] (16 rows x N * 8) += the 16 rows of `a` (16 x D, row-major; a_rows is this lane's ldmatrix address) times
// the N * 8 rows of `b` (N * 8 x D, row-major at b_rows) transposed: S^T = K Q^T and dP^T = V dO^T.
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

// acc (16 x D) += a (a 16 x 16 A operand in registers) times 16 rows of B (16 x D, row-major in shared memory at
// b_rows, read transposed by ldmatrix.trans): one k16 step of dV += P^T dO and of dK += dS^T Q.
template <typename T, int D, int LD>
__device__ __forceinline__ void frag_times_rows(float (&acc)[D / 8][4], const uint32_t (&a)[4], const T* b_rows) {
#pragma unroll
  for (int d = 0; d < D / 8; d += 2) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, b_rows + d * 8);
    mma16816<T>(acc[d], a, b[0], b[1]);
    mma16816<T>(acc[d + 1], a, b[2], b[3]);
  }
}

// Two neighbouring n8 tiles of an accumulator (a 16 x 16 piece: lo, then hi) as one A operand in 16 bits: mma.sync's
// C layout is its A layout, as step 10 packs P.
template <typename T>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = Half<T>::pack(lo[0], lo[1]);
  a[1] = Half<T>::pack(lo[2], lo[3]);
  a[2] = Half<T>::pack(hi[0], hi[1]);
  a[3] = Half<T>::pack(hi[2], hi[3]);
}

// dst[0] += a and dst[1] += b, atomically: one vector reduction on 9.0 (red.global.add.v2.f32; dst 8-byte aligned),
// two atomicAdds before it. Nothing is read back, so the adds need not wait for each other.
__device__ __forceinline__ void add_pair(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// Kernel 1 (step 28): D = rowsum(dO * O) in float32, one warp a row.
template <typename T>
__global__ void delta_half_kernel(const T* __restrict__ out, const T* __restrict__ dout, float* __restrict__ delta,
                                  long long rows, int head_dim) {
  const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
  const int lane = threadIdx.x % WARP;
  if (row >= rows) return;
  // TODO (README, Task 4, step 28: D = rowsum(dO * O), summed in float32, one warp a row)
}

template <typename T, int D, int QUERIES>
constexpr size_t dkdv_smem_bytes() {
  constexpr int KEYS = 16 * WARPS;
  return sizeof(T) * ((2 * KEYS + 4 * QUERIES) * (D + PAD) + KEYS * (QUERIES + PAD)) + sizeof(float) * 4 * QUERIES;
}

// Kernel 2 (steps 28-30): grid (ceil(seq_k / (16 WARPS)), batch * kv_heads), WARPS * 32 threads, dkdv_smem_bytes().
// D: head_dim's tile width (64 or 128); QUERIES: the query tile's rows.
template <typename T, int D, int QUERIES>
__global__ void __launch_bounds__(WARPS * WARP, 1)
    flash_attention_dkdv_half_kernel(const AttentionBackwardHalfParams p) {
  constexpr int KEYS = 16 * WARPS, THREADS = WARPS * WARP, LD = D + PAD, LDS = QUERIES + PAD;
  constexpr int Q_TILES = QUERIES / 8;  // n8 tiles of S^T (queries)
  constexpr int K_STEPS = QUERIES / 16;  // k16 steps of dV += P^T dO and dK += dS^T Q
  // dQ's tile (QUERIES x D) split among the warps: warp w takes m16 tile w % M16 and DQ_COLS of D's columns
  constexpr int M16 = QUERIES / 16, COL_GROUPS = WARPS / M16, DQ_COLS = D / COL_GROUPS;
  static_assert(WARPS % M16 == 0 && DQ_COLS % 16 == 0, "the warps split dQ's tile in whole 16 x 16 pieces");
  extern __shared__ uint4 smem_raw[];
  T* k_tile = reinterpret_cast<T*>(smem_raw);  // (KEYS, LD)
  T* v_tile = k_tile + KEYS * LD;              // (KEYS, LD)
  T* q_tiles = v_tile + KEYS * LD;             // 2 stages of (QUERIES, LD)
  T* do_tiles = q_tiles + 2 * QUERIES * LD;    // 2 stages of (QUERIES, LD)
  T* ds_tile = do_tiles + 2 * QUERIES * LD;    // (KEYS, LDS): dS^T, keys by queries
  float* lse_tiles = reinterpret_cast<float*>(ds_tile + KEYS * LDS);  // 2 stages of QUERIES, in log2 units
  float* delta_tiles = lse_tiles + 2 * QUERIES;                       // 2 stages of QUERIES

  const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
  // blockIdx.x: the key block, the grid's fastest index, so that the blocks running at once are mostly those of one
  // (batch, key/value head): they walk the same Q and dO and add into the same rows of dq_accum, which L2 then holds
  const int batch = blockIdx.y / p.kv_heads, kv_head = blockIdx.y % p.kv_heads, group = p.heads / p.kv_heads;
  const int n0 = blockIdx.x * KEYS, seq_q = p.seq_q, seq_k = p.seq_k, head_dim = p.head_dim;
  const int causal_offset = seq_k - seq_q;  // query i sees keys j <= i + causal_offset
  const size_t kv_offset = ((size_t)blockIdx.y * seq_k + n0) * head_dim;
  const T* q = static_cast<const T*>(p.q);
  const T* dout = static_cast<const T*>(p.dout);

  load_tile<T, D, KEYS, THREADS>(k_tile, static_cast<const T*>(p.k) + kv_offset, seq_k - n0, head_dim);
  load_tile<T, D, KEYS, THREADS>(v_tile, static_cast<const T*>(p.v) + kv_offset, seq_k - n0, head_dim);
  // The query tiles that see these keys, for each query head of the group: from the diagonal's (causal) to the last.
  int first_tile = 0;
  // TODO (README, Task 4, step 28: the first query tile that sees these keys (causal: the diagonal's))
  const int tiles_per_head = ceil_div(seq_q, QUERIES) - first_tile;
  const int tiles = group * tiles_per_head;
  const auto head_of = [&](int i) { return (size_t)batch * p.heads + kv_head * group + i / tiles_per_head; };
  const auto start_of = [&](int i) { return (first_tile + i % tiles_per_head) * QUERIES; };
  const auto prefetch = [&](int i, int stage) {
    const size_t rows = head_of(i) * seq_q + start_of(i);
    load_tile<T, D, QUERIES, THREADS>(q_tiles + stage * QUERIES * LD, q + rows * head_dim, seq_q - start_of(i),
                                      head_dim);
    load_tile<T, D, QUERIES, THREADS>(do_tiles + stage * QUERIES * LD, dout + rows * head_dim, seq_q - start_of(i),
                                      head_dim);
  };
  if (tiles > 0) prefetch(0, 0);
  cp_async_commit();

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};  // this warp's 16 keys' rows of dK and dV, accumulator layout
  const int key0 = n0 + warp * 16 + lane / 4;  // this lane's keys in the accumulators: key0 and key0 + 8
  const float scale_log2 = p.scale * LOG2E;
  // ldmatrix addresses: A operands from this warp's 16 rows of K or V; B operands from the query tile's rows (Q or
  // dO: row n of the B operand is query n); the transposed reads (ldmatrix.trans) of Q, dO or K along their rows.
  const int a_row = (lane / 8 % 2) * 8 + lane % 8, a_col = (lane / 16) * 8;
  const int b_row = (lane / 16) * 8 + lane % 8, b_col = (lane / 8 % 2) * 8;
  const int t_row = (lane / 8 % 2) * 8 + lane % 8, t_col = (lane / 16) * 8;

  for (int i = 0; i < tiles; ++i) {
    const int stage = i % 2, m0 = start_of(i);
    const size_t head = head_of(i);
    for (int idx = threadIdx.x; idx < QUERIES; idx += THREADS) {  // L (log2 units) and D of the tile's queries
      const int row = m0 + idx;
      // queries past seq_q: L = +infinity makes their P exactly 0 (their Q and dO rows are zeros)
      lse_tiles[stage * QUERIES + idx] = row < seq_q ? p.lse[head * seq_q + row] * LOG2E : INFINITY;
      delta_tiles[stage * QUERIES + idx] = row < seq_q ? p.delta[head * seq_q + row] : 0.0f;
    }
    if (i + 1 < tiles) prefetch(i + 1, 1 - stage);
    cp_async_commit();
    cp_async_wait<1>();  // this tile (and, the first time, K and V) landed; the next one may still be on its way
    __syncthreads();
    const T* q_tile = q_tiles + stage * QUERIES * LD;
    const T* do_tile = do_tiles + stage * QUERIES * LD;
    const float* lse = lse_tiles + stage * QUERIES;
    const float* delta = delta_tiles + stage * QUERIES;

    float s[Q_TILES][4] = {}, dp[Q_TILES][4] = {};  // S^T, then P^T; dP^T, then dS^T
    // s[n][e]: key key0 + 8 (e / 2), query m0 + 8 n + 2 (lane % 4) + e % 2 (the accumulator layout)
    // TODO (README, Task 4, step 28: S^T = K Q^T and dP^T = V dO^T for this warp's keys; P^T (masked), dS^T = P^T (dP^T - D))
    __syncwarp();  // this warp's rows of dS^T written, for its own ldmatrix below

    // TODO (README, Task 4, step 29: dV += P^T dO (P^T repacked to A operands) and dK += dS^T Q (dS^T's from shared memory))
    __syncthreads();  // dS^T complete: every warp's rows

    // TODO (README, Task 4, step 30: dQ += dS K for the tile, split among the warps, added to dq_accum)
    __syncthreads();  // everyone is done with this stage's Q, dO, and with dS^T, before they are written again
  }
  cp_async_wait<0>();

  // TODO (README, Task 4, step 29: write dK = scale dS^T Q and dV for this warp's keys, in 16 bits)
}

// Kernel 3 (step 30): dq = scale dq_accum, in 16 bits.
template <typename T>
__global__ void dq_half_kernel(const float* __restrict__ dq_accum, T* __restrict__ dq, long long n, float scale) {
  // TODO (README, Task 4, step 30: dq = scale dq_accum, rounded to 16 bits)
}

template <typename T, int D, int QUERIES>
cudaError_t launch_dkdv(const AttentionBackwardHalfParams& p, cudaStream_t stream) {
  const auto kernel = flash_attention_dkdv_half_kernel<T, D, QUERIES>;
  constexpr size_t smem = dkdv_smem_bytes<T, D, QUERIES>();
  static_assert(smem <= 227 * 1024, "the tiles fit in a block's shared memory on 9.0");
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return err;
  kernel<<<dim3(ceil_div(p.seq_k, 16 * WARPS), p.batch * p.kv_heads), WARPS * WARP, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_for_type(const AttentionBackwardHalfParams& p, cudaStream_t stream) {
  const long long rows = (long long)p.batch * p.heads * p.seq_q;
  constexpr int ROWS_PER_BLOCK = 256 / WARP;
  delta_half_kernel<T><<<(unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), 256, 0, stream>>>(
      static_cast<const T*>(p.out), static_cast<const T*>(p.dout), p.delta, rows, p.head_dim);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = p.head_dim <= 64 ? launch_dkdv<T, 64, BLOCK_QUERIES>(p, stream) : launch_dkdv<T, 128, BLOCK_QUERIES>(p, stream);
  if (err != cudaSuccess) return err;
  dq_half_kernel<T><<<1024, 256, 0, stream>>>(p.dq_accum, static_cast<T*>(p.dq), rows * p.head_dim, p.scale);
  return cudaGetLastError();
}

}  // namespace

// The backward pass in bf16 or fp16: dq, dk and dv (overwritten) from dout and what the forward saved; the
// parameters are described in device/params.h (p.bf16 picks the type; p.dq_accum: zeros).
cudaError_t flash_attention_backward_half(const AttentionBackwardHalfParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0 || p.seq_q < 1 || p.seq_k < 1 ||
      p.head_dim < 8 || p.head_dim > MAX_HEAD_DIM || p.head_dim % 8 != 0 || (p.causal && p.seq_q > p.seq_k) ||
      p.batch * p.kv_heads > 65535)  // grid.y
    return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  return p.bf16 ? backward_for_type<__nv_bfloat16>(p, stream) : backward_for_type<__half>(p, stream);
}
