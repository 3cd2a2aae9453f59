// Task 4: fused attention, FlashAttention-2 forward (Algorithm 1 of the paper).
//
//   out = softmax(scale * Q K^T + mask) V        for every (batch, head)
//
// One block computes BLOCK_ROWS (Br) rows of out for one (batch, head). It keeps its
// Br x D tile of Q in shared memory and walks over K and V in tiles of BLOCK_COLS (Bc)
// rows. For each tile it computes the Br x Bc scores S = scale * Q K^T, folds them into
// a running ("online") softmax, and adds P V to an unnormalised accumulator:
//
//   m_i = max(m_i, rowmax(S))                  running row maximum
//   P   = exp(S - m_i)
//   l_i = exp(m_old - m_i) * l_i + rowsum(P)   running row sum
//   acc = exp(m_old - m_i) * acc + P V         running numerator
//
// and at the end out = acc / l_i. The (seq_q, seq_k) scores matrix of task 2 never
// exists: every score lives in a register for one tile and is gone.
//
// With a causal mask, query i sees key j iff j <= i + (seq_k - seq_q) (the queries are
// the last seq_q positions, as when decoding against a longer cache). K/V tiles
// entirely above the diagonal are never visited; only the tiles that straddle it (or
// hang over the end of the keys) apply the mask element by element. The optional masks
// beyond causal (steps 23-24: a sliding window, packed documents, soft-capped scores)
// bound the key tiles the same way, from both ends.
//
// All tensors are row-major, contiguous float32; the arithmetic is plain FP32 FFMA (no
// tensor cores). The kernel trusts its arguments: task4/binding.cpp checks the tensors.
//
// Build and test:
//   python -m task4.compile            build this file (task4/kernels/attention.cu)
//   python -m task4.test               check it against a float64 reference
//
// Speed, measured on an H200 at batch 8, 32 heads, seq 4096, head_dim 128 (fp32, TF32
// off; 4 * B * H * S^2 * D flops, half of them when causal):
//   reference solution    55.0 ms (40 TFLOP/s)    causal 28.1 ms (39 TFLOP/s)
//   SDPA                  46.8 ms (47 TFLOP/s)    causal 24.2 ms (45 TFLOP/s)
//   naive PyTorch         67.7 ms (33 TFLOP/s)    causal 83.5 ms (13 TFLOP/s)
// (SDPA = torch.nn.functional.scaled_dot_product_attention; naive = matmul, softmax,
// matmul.) These are the reference solution's figures, with its tuned tile sizes: about
// 0.85x SDPA and 60% of the GPU's ~67 TFLOP/s of FP32 FFMA; 1.05x SDPA at head_dim 64
// (batch 4, seq 2048) and 1.10x at head_dim 80 (batch 32, seq 512). SDPA's float32 kernel
// does its products on the tensor cores, three TF32 products per float32 one ("3xTF32",
// close to float32's accuracy, also with TF32 off in PyTorch); this kernel does FFMA only
// (README, Task 4). The skeleton starts
// from untuned tile sizes: correct once the steps are written, and slower. Tuning them is
// README, Task 4, step 7 (`python -m task4.tune`).

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

// Each block has ROW_THREADS x COL_THREADS threads. Thread (ty, tx) owns the
// THREAD_ROWS rows ty, ty + ROW_THREADS, ... of the block's Br rows, and of each
// Br x Bc tile of S the THREAD_COLS columns tx, tx + COL_THREADS, ...: every value it
// reads from shared memory is reused THREAD_ROWS (or THREAD_COLS) times from a
// register. For O it owns the same rows, so m_i and l_i never leave its registers.
//
// What they trade (README, Task 4, step 7; `python -m task4.tune` measures each choice):
// - a bigger micro-tile per thread (THREAD_ROWS x THREAD_COLS) reuses each value read from
//   shared memory for more FMAs, but S and O live in registers: about THREAD_ROWS x
//   (THREAD_COLS + head_dim / COL_THREADS) of them per thread, and past 255 they spill;
// - bigger block tiles (Br, Bc) share each K/V tile among more query rows and need fewer
//   passes over K and V, but take more shared memory, at least (Br + 2 Bc) x (head_dim + 4)
//   floats, so fewer blocks fit on an SM, and leave more of the last tile unused on short
//   sequences;
// - MIN_BLOCKS_PER_SM (below) trades registers per thread for blocks per SM.
constexpr int BLOCK_ROWS = 64;  // Br: query rows per block
constexpr int BLOCK_COLS = 64;  // Bc: key/value rows per tile
constexpr int THREAD_ROWS = 4;   // rows of S and O per thread
constexpr int THREAD_COLS = 4;   // columns of S per thread
// A promise to the compiler: it may use up to 65536 / (NUM_THREADS * MIN_BLOCKS_PER_SM)
// registers per thread (at most 255), so that many blocks fit by registers (shared memory
// may allow fewer).
constexpr int MIN_BLOCKS_PER_SM = 1;

constexpr int ROW_THREADS = BLOCK_ROWS / THREAD_ROWS;
constexpr int COL_THREADS = BLOCK_COLS / THREAD_COLS;  // neighbouring lanes that share a row
constexpr int NUM_THREADS = ROW_THREADS * COL_THREADS;

// head_dim is padded up to one of the sizes the kernel is compiled for, 32, 64, 80, 96
// or 128 (zeros in the padding), so the inner loops have compile-time trip counts and a
// head_dim of 72 pays for 80, not 128. Thread tx owns O's columns in vectors of VEC
// floats, VEC tx, VEC (tx + COL_THREADS), ...: float4 where the padded head_dim is a
// multiple of 4 COL_THREADS (64, 128), float2 where it is one of 2 COL_THREADS (32, 96),
// single floats otherwise (80).
constexpr int MAX_HEAD_DIM = 128;

// Shared-memory rows are padded by PAD floats: the COL_THREADS lanes that read
// different rows of K at the same column then hit different banks (a row is D + 4
// words, so consecutive rows start 4 banks apart, and a float4 covers 4 banks).
constexpr int PAD = 4;

static_assert(THREAD_ROWS * ROW_THREADS == BLOCK_ROWS && THREAD_COLS * COL_THREADS == BLOCK_COLS,
              "the threads' micro-tiles cover the block's tile exactly");
static_assert(32 % COL_THREADS == 0,
              "the COL_THREADS lanes that share a row must sit in one warp (row max and sum "
              "are reduced with warp shuffles)");
static_assert(NUM_THREADS % 32 == 0 && NUM_THREADS <= 1024, "whole warps, at most 1024 threads");
static_assert(BLOCK_COLS % 4 == 0, "P is read as float4 along its rows");

// ----------------------------------------------------------------------------
// Helpers (given: the tile's load, load_tile, and the vectors' fma_vec, scale_vec and store_first are in
// common/csrc/device/float_tiles.cuh; LOG2E, ceil_div and with_head_dim_tile in device/common.cuh)

// Shared memory of one block, in floats: the Q tile, the K tile (which P overwrites
// once S is computed: K is dead by then, and without the reuse four 128 x 132 tiles
// would not fit in an SM), and the V tile.
template <int D>
__host__ __device__ constexpr int q_tile_floats() { return BLOCK_ROWS * (D + PAD); }
template <int D>
__host__ __device__ constexpr int kp_tile_floats() {
  return BLOCK_COLS * (D + PAD) > BLOCK_ROWS * (BLOCK_COLS + PAD) ? BLOCK_COLS * (D + PAD)
                                                                   : BLOCK_ROWS * (BLOCK_COLS + PAD);
}
template <int D>
__host__ __device__ constexpr int v_tile_floats() { return BLOCK_COLS * (D + PAD); }
template <int D>
constexpr size_t smem_bytes() {
  return sizeof(float) * (q_tile_floats<D>() + kp_tile_floats<D>() + v_tile_floats<D>());
}
static_assert(smem_bytes<MAX_HEAD_DIM>() <= 227 * 1024,
              "a block may have at most 227 KB of shared memory on sm_90: smaller tiles");

// O's vectors: float4, float2 or float (fma_vec, scale_vec and store_first take each).
template <int D>
using out_vec = std::conditional_t<D % (4 * COL_THREADS) == 0, float4,
                                   std::conditional_t<D % (2 * COL_THREADS) == 0, float2, float>>;

// ----------------------------------------------------------------------------
// The kernel

// q, out: (batch * heads, seq_q, head_dim); k, v: (batch * kv_heads, seq_k, head_dim). D is
// head_dim padded up. PADDED: key_start holds each sequence's first valid key (left padding); a
// kernel of its own, because the lengths it changes per block then take registers, which the
// kernel without padding keeps free (they stay kernel parameters: about 4% of its speed at
// head_dim 128, where every register counts).
// grid (batch * heads, ceil(seq_q / Br)), NUM_THREADS threads, smem_bytes<D>() of shared memory.
// scale_log2 = scale * log2(e). lse: nullptr, or (batch * heads, seq_q): each row's log-sum-exp of the scaled
// scores, L = log(sum_j exp(scale q k_j)), which the backward pass needs (step 12; never with padding).
// MASKS: the masks beyond causal (steps 23-24, optional), a kernel of its own so that the others pay nothing for
// them; always PADDED (key_start all zeros for a batch without padding: a pointer that may be nullptr costs the
// kernel registers it does not have at head_dim 128).
template <int D, bool PADDED, bool MASKS>
__global__ void __launch_bounds__(NUM_THREADS, MIN_BLOCKS_PER_SM)
    flash_attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, float* __restrict__ out, float* __restrict__ lse,
                           int heads, int kv_heads, const int* __restrict__ key_start, int seq_q, int seq_k,
                           int head_dim, float scale_log2, bool causal, AttentionMasks masks) {
  constexpr int LD = D + PAD;                // row stride of the Q, K and V tiles
  constexpr int LDP = BLOCK_COLS + PAD;      // row stride of the P tile
  using vec = out_vec<D>;                    // O's columns are held in these
  constexpr int VEC = sizeof(vec) / sizeof(float);
  constexpr int O_VECS = D / (VEC * COL_THREADS);  // vectors of O per thread
  static_assert(O_VECS * VEC * COL_THREADS == D, "the row's lanes own whole vectors of O");
  static_assert(D % 4 == 0, "the tiles are loaded and read as float4");

  extern __shared__ float4 smem[];  // float4: 16-byte aligned for the float4 accesses
  float* q_tile = reinterpret_cast<float*>(smem);  // (Br, D + PAD)
  float* k_tile = q_tile + q_tile_floats<D>();     // (Bc, D + PAD)
  float* p_tile = k_tile;                          // (Br, Bc + PAD), over K once S is done
  float* v_tile = k_tile + kp_tile_floats<D>();    // (Bc, D + PAD)

  const int tx = threadIdx.x % COL_THREADS;
  const int ty = threadIdx.x / COL_THREADS;
  // blockIdx.y counts down: with a causal mask the last query tiles have the most
  // K/V tiles to visit, and starting them first keeps the GPU busy to the end.
  const int q_start = (gridDim.y - 1 - blockIdx.y) * BLOCK_ROWS;

  // This block's (batch, head), and the key/value head that query head reads: with
  // grouped-query attention (kv_heads < heads) each group of heads / kv_heads neighbouring
  // query heads shares one, read in place (never copied per query head). The binding
  // checks that one head fits in int; the whole tensor may not, hence size_t.
  const int batch = blockIdx.x / heads, head = blockIdx.x % heads;
  const int kv_head = head / (heads / kv_heads);
  q += (size_t)blockIdx.x * seq_q * head_dim;
  out += (size_t)blockIdx.x * seq_q * head_dim;
  if (lse != nullptr) lse += (size_t)blockIdx.x * seq_q;
  k += ((size_t)batch * kv_heads + kv_head) * seq_k * head_dim;
  v += ((size_t)batch * kv_heads + kv_head) * seq_k * head_dim;

  // Padding: this sequence's keys start at key_start[batch] (a batch of prompts of different
  // lengths, padded on the left). The queries are the last seq_q positions, so the ones
  // before that key are padding too: they see no key, and their output is defined as zero.
  // The rest is plain attention over a shorter sequence, so the pointers and lengths move
  // past the padding here and steps 1-6 never see it (no mask, no wasted tile).
  int padding = 0, skip = 0;  // the masks (steps 23-24) are in the positions before the move
  if constexpr (PADDED) {
    padding = key_start[batch];  // keys before the first real one; 0 <= padding <= seq_k (the binding checks)
    skip = min(seq_q, max(0, padding - (seq_k - seq_q)));  // padded queries
    for (int idx = threadIdx.x; idx < BLOCK_ROWS * head_dim; idx += NUM_THREADS) {
      const int row = q_start + idx / head_dim;  // this block's rows, before the move
      if (row < skip) out[(size_t)row * head_dim + idx % head_dim] = 0.0f;
    }
    k += (size_t)padding * head_dim;
    v += (size_t)padding * head_dim;
    seq_k -= padding;
    q += (size_t)skip * head_dim;
    out += (size_t)skip * head_dim;
    seq_q -= skip;
    if (q_start >= seq_q) return;  // every row of this tile was padding (the whole block leaves)
  }
  const int causal_offset = seq_k - seq_q;  // query i sees keys j <= i + causal_offset

  // Row i of this thread is query q_start + ty + i * ROW_THREADS.
  float m_i[THREAD_ROWS];          // running max of the scores, in log2 units
  float l_i[THREAD_ROWS];          // this thread's share of the running row sum
  vec acc[THREAD_ROWS][O_VECS];  // unnormalised out, columns VEC (tx + COL_THREADS c) onwards
#pragma unroll
  for (int i = 0; i < THREAD_ROWS; ++i) {
    m_i[i] = -INFINITY;
    l_i[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < O_VECS; ++c) acc[i][c] = vec{};
  }

  // TODO (README, Task 4, step 1: load the Q tile, and count the K/V tiles it needs (causal: stop after the diagonal))
  const int num_kv_tiles = 0;

  // The masks beyond causal (steps 23-24, optional): row r of the block sees the keys row_keys[r].x ..
  // row_keys[r].y - 1 (in the moved positions: before them, the window's start or its document's; from .y on,
  // the next document's), kept in shared memory (in registers, 16 more a thread spill at head_dim 96 and 128). The
  // block visits tiles first_kv_tile .. end_kv_tile - 1.
  __shared__ int2 row_keys[MASKS ? BLOCK_ROWS : 1];
  int first_kv_tile = 0, end_kv_tile = num_kv_tiles;
  if constexpr (MASKS) {
    // TODO (README, Task 4, step 23: each row's key range from the window and its document; the block's first and last tile)
    return;  // until step 23 is written: out is left as it was, and the part says which step is missing
  }

  for (int t = first_kv_tile; t < end_kv_tile; ++t) {
    const int kv_start = t * BLOCK_COLS;

    // TODO (README, Task 4, step 2: load the K and V tiles into shared memory)
    __pipeline_wait_prior(1);  // this thread's copies of K (and the first time, Q) landed
    __syncthreads();           // ... and everyone else's

    // TODO (README, Task 4, step 3: S = scale * Q K^T for this tile, masked where needed)

    if constexpr (MASKS) {
      // TODO (README, Task 4, step 24: soft-cap the scores, then the window's and the documents' mask on the tiles an edge crosses)
    }

    // TODO (README, Task 4, step 4: online softmax: new row max m_i, rescale acc and l_i, P = exp(S - m_i))

    __syncthreads();  // everyone is done reading K: P may overwrite it

    // TODO (README, Task 4, step 5: write P to shared memory, then acc += P V)
    __syncthreads();  // everyone is done with P and V before the next tile overwrites them
  }

  // TODO (README, Task 4, step 6: add up l_i across the row's lanes, normalise acc, write out)

  // TODO (README, Task 4, step 12: where lse is given, write each row's L = log(sum of exp(scaled scores)) (optional))
}

// ----------------------------------------------------------------------------
// Launcher: called by task4/binding.cpp on PyTorch's current stream. Returns the error
// of the launch (a bad configuration); errors inside the kernel surface later, at the
// next synchronisation.

template <int D, bool PADDED, bool MASKS>
static cudaError_t launch(const AttentionParams& p, cudaStream_t stream) {
  // More than 48 KB of dynamic shared memory needs an explicit opt-in.
  const size_t smem = smem_bytes<D>();
  cudaError_t err = cudaFuncSetAttribute(flash_attention_kernel<D, PADDED, MASKS>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.batch * p.heads, ceil_div(p.seq_q, BLOCK_ROWS));
  flash_attention_kernel<D, PADDED, MASKS><<<grid, NUM_THREADS, smem, stream>>>(
      static_cast<const float*>(p.q), static_cast<const float*>(p.k), static_cast<const float*>(p.v),
      static_cast<float*>(p.out), p.lse, p.heads, p.kv_heads, p.key_start, p.seq_q, p.seq_k, p.head_dim,
      p.scale * LOG2E, p.causal, p.masks);
  return cudaGetLastError();
}

// The entry points below: the parameters checked (p.lse and p.key_start never both, but with the masks, whose
// key_start is then zeros: the backward part has no padding; the masks only through flash_attention_forward_masks),
// then the kernel for head_dim's tile width.
static cudaError_t forward_with(const AttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0 || p.seq_q < 1 || p.seq_k < 1 ||
      p.head_dim < 1 || p.head_dim > MAX_HEAD_DIM || (p.causal && p.seq_q > p.seq_k) ||
      (p.seq_q - 1) / BLOCK_ROWS >= 65535 || (p.lse != nullptr && p.key_start != nullptr && !has_masks(p.masks)))
    return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  const bool masked = has_masks(p.masks);
  return with_head_dim_tile(p.head_dim, [&](auto tile) {
    constexpr int D = decltype(tile)::value;
    return masked ? launch<D, true, true>(p, stream)
                  : p.key_start != nullptr ? launch<D, true, false>(p, stream) : launch<D, false, false>(p, stream);
  });
}

// The forward pass, float32; the parameters are described in device/params.h (p.lse: nullptr here, no masks).
cudaError_t flash_attention_forward(const AttentionParams& p, cudaStream_t stream) {
  if (p.lse != nullptr || has_masks(p.masks)) return cudaErrorInvalidValue;
  return forward_with(p, stream);
}

// The same with the masks beyond causal of p.masks (steps 23-24, optional): a window needs causal, documents seq_q ==
// seq_k, and key_start is never nullptr (all zeros for no padding, and always where p.lse is given: the backward part
// of step 26 has no padding).
cudaError_t flash_attention_forward_masks(const AttentionParams& p, cudaStream_t stream) {
  const AttentionMasks& m = p.masks;
  if (p.key_start == nullptr || (m.window_left >= 0 && !p.causal) || !(m.softcap >= 0.0f) ||
      (m.cu_seqlens != nullptr && (m.documents < 1 || p.seq_q != p.seq_k)))
    return cudaErrorInvalidValue;
  return forward_with(p, stream);
}

// The same without padding, also writing p.lse: (batch, heads, seq_q), each row's log-sum-exp of the scaled
// scores (step 12). The backward pass (kernels/attention_backward.cu) recomputes the probabilities from it.
cudaError_t flash_attention_forward_lse(const AttentionParams& p, cudaStream_t stream) {
  if (p.lse == nullptr || p.key_start != nullptr || has_masks(p.masks)) return cudaErrorInvalidValue;
  return forward_with(p, stream);
}

// The tile sizes and the largest head_dim, for the binding to report.
int flash_attention_block_rows() { return BLOCK_ROWS; }
int flash_attention_block_cols() { return BLOCK_COLS; }
int flash_attention_max_head_dim() { return MAX_HEAD_DIM; }
