// Task 4, optional part (README, Task 4, steps 17-22): the fused kernel in bf16 and fp16 on Hopper's own
// instructions (compute capability 9.0: H100, H200, GH200).
// nvcc target: sm_90a
//
//   out = softmax(scale * Q K^T + mask) V        as kernels/attention_half.cu, same interface
//
// What changes from steps 8-11 (FlashAttention-3's design, Shah et al. 2024):
// - the tensor cores are driven by a warpgroup (4 warps, 128 threads) at a time with wgmma.mma_async: a 64 x N
//   product per instruction, its operands read straight from shared memory (no ldmatrix), asynchronously (the
//   warps go on until they wait for it);
// - tiles are copied by the Tensor Memory Accelerator (TMA): one thread asks for a whole tile, the copy engine
//   moves it and counts its bytes down on an mbarrier, the consumers wait on that barrier;
// - warp specialization: warpgroup 0 is the producer (its one thread issues every copy, a ring of STAGES K/V
//   tiles ahead), warpgroups 1 and 2 are consumers of 64 query rows each; the producer gives its registers
//   to the consumers (setmaxnreg), which hold O, S and P in registers;
// - tiles are 64-column panels written with the 128-byte swizzle (head_dim 128: two panels), the layout wgmma
//   reads without bank conflicts;
// - step 21: a tile's S = Q K^T issued with the previous tile's O += P V, its softmax run while that product is on
//   the tensor cores (wgmma groups complete in the order they were committed);
// - step 22: the two consumers take turns issuing their products (named barriers), so that one's softmax runs while
//   the other's products are on the tensor cores (FlashAttention-3's ping-pong).
// The online softmax is steps 9-10's on a different accumulator layout; P stays in registers as wgmma's A operand.
// Step 25 (optional, after steps 23-24): the masks beyond causal in this kernel, a MASKS instance of its own.

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "device/common.cuh"  // WARP, LOG2E, ceil_div
#include "device/half.cuh"    // Half<T>: bf16 and fp16 to and from float, pack (two floats in one register)
#include "device/hopper.cuh"  // mbarrier_*, tma_load_box, swizzled_tile, wgmma_*, pin_registers, registers_*
#include "device/masks.cuh"   // document_of, soft_cap (step 25)
#include "device/mma.cuh"     // fast_exp2
#include "device/params.h"    // HopperAttentionParams: the forward's parameters and the tensor maps

namespace {

constexpr int BLOCK_ROWS = HOPPER_Q_BOX_ROWS;  // query rows per block: 64 per consumer warpgroup
// Keys per K/V tile, a multiple of HOPPER_KV_BOX_ROWS that wgmma_ss takes (128 or 192). Up to head_dim 64, 192: S
// (64 x 192 a consumer), P and O still fit in registers, and a tile's fixed costs (its barrier waits, the row maxima's
// shuffles, O's rescale) spread over more keys; above, 128: three stages of 192-key tiles beside Q would not fit in
// shared memory.
constexpr int BLOCK_COLS = 192;
constexpr int BLOCK_COLS_LARGE_D = 128;
constexpr int STAGES = 3;                    // K/V tiles in flight [skeleton: 2]
constexpr int WARPGROUP = 4 * WARP;
constexpr int THREADS = 3 * WARPGROUP;       // the producer and two consumers
// registers per thread after setmaxnreg: 128 x PRODUCER_REGISTERS + 256 x CONSUMER_REGISTERS <= 65536 (an SM's)
constexpr int PRODUCER_REGISTERS = 24;
constexpr int CONSUMER_REGISTERS = 240;
// Step 21 (1): tile j's S = Q K^T issued with tile j - 1's O += P V, its softmax run while the tensor cores do that
// product; 0: steps 18-20's loop, each tile's products and softmax one after another
constexpr int OVERLAP = 1;  // [skeleton: 0]
// Step 22 (1): the two consumers take turns issuing their products, so that one's softmax runs while the other's
// products are on the tensor cores (named barriers 1 and 2); 0: each issues as soon as its tiles have landed
constexpr int PINGPONG = 1;  // [skeleton: 0]
// Persistent blocks (1): one block an SM, each walking one block of rows after another, its producer loading the next
// rows' Q and tiles while the consumers finish the last ones (and Q in two buffers where they fit); 0: a block for
// each block of rows, as many blocks as rows / BLOCK_ROWS
constexpr int PERSISTENT = 1;  // [skeleton: 0]
// With PERSISTENT, step 22's turns carry on from one block of rows to the next (1): consumer 0's first products of the
// next rows follow consumer 1's last of these, while consumer 1 writes its rows out; 0: each block of rows starts its
// turns afresh, once both consumers are done with the last
constexpr int CHAIN_TURNS = 1;
constexpr int MAX_HEAD_DIM = 128;
constexpr int ROW_BYTES = HOPPER_BOX_COLS * 2;        // a row of a 64-column panel: 128 bytes
constexpr int Q_PANEL_BYTES = BLOCK_ROWS * ROW_BYTES;  // one 64-column panel of Q's tile: 16 KB

// Shared memory: Q (PANELS panels; Q_BUFFERS of them), then STAGES K tiles and STAGES V tiles (PANELS panels of COLS
// rows each), then the barriers. A swizzled tile starts on a 1024-byte boundary (the swizzle's pattern repeats every
// 8 rows of 128 bytes), and so does each box within it: boxes one after another make one swizzled tile of all their
// rows.
template <int PANELS>
struct Layout {
  static constexpr int COLS = PANELS == 1 ? BLOCK_COLS : BLOCK_COLS_LARGE_D;  // keys per K/V tile
  static constexpr int KV_PANEL = COLS * ROW_BYTES, Q_TILE = PANELS * Q_PANEL_BYTES, KV_TILE = PANELS * KV_PANEL;
  // two Q buffers where they fit beside the ring (PERSISTENT: the next rows' Q lands while these are computed)
  static constexpr int Q_BUFFERS = PERSISTENT && 1024 + 2 * Q_TILE + 2 * STAGES * KV_TILE + 256 <= 227 * 1024 ? 2 : 1;
  static constexpr int Q = 0, K = Q_BUFFERS * Q_TILE, V = K + STAGES * KV_TILE, BARRIERS = V + STAGES * KV_TILE;
  // each Q buffer's full and each stage's K full and V full, then each Q buffer's empty and each stage's empty
  static constexpr int BARRIER_COUNT = 2 * Q_BUFFERS + 3 * STAGES;
  static constexpr int BYTES = 1024 + BARRIERS + 8 * BARRIER_COUNT;  // 1024: room to align the start
  static_assert(BYTES <= 227 * 1024, "Q and STAGES K/V tiles must fit in a block's 227 KB of shared memory");
  static_assert(COLS % HOPPER_KV_BOX_ROWS == 0, "a K/V tile is whole boxes of HOPPER_KV_BOX_ROWS rows");
};
// Step 21 holds tile j - 1's stage while it waits for tile j's: with one stage it would wait for itself
static_assert(!OVERLAP || STAGES >= 2, "OVERLAP needs STAGES >= 2");
static_assert(!PINGPONG || OVERLAP, "PINGPONG takes turns in step 21's loop: it needs OVERLAP");

// Step 22: consumer c's turns. Before each, it waits on named barrier 1 + c; after each, it arrives on the other's,
// 2 - c (256 threads a phase: the 128 of the one waiting and the 128 of the one arriving). Consumer 1 arrives on
// consumer 0's once before its first turn, so consumer 0 goes first; after its last turn it does not arrive, as
// consumer 0 has no turn left to wait for (an arrival no one waits for would be left on the barrier). The given loop
// calls turns_start; `last`: the last turn of the block's last rows (with CHAIN_TURNS, else of each block of rows).
__device__ __forceinline__ void turns_start(int consumer) {
  // BEGIN SOLUTION "step 22: consumer 1 lets consumer 0 go first"
  if (PINGPONG && consumer == 1) named_barrier_arrive(1, 2 * WARPGROUP);
  // END SOLUTION
}
__device__ __forceinline__ void turn_begin(int consumer) {
  // BEGIN SOLUTION "step 22: wait for this consumer's turn"
  if (PINGPONG) named_barrier_sync(1 + consumer, 2 * WARPGROUP);
  // END SOLUTION
}
__device__ __forceinline__ void turn_end(int consumer, bool last) {
  // BEGIN SOLUTION "step 22: hand the turn to the other consumer"
  if (PINGPONG && !(last && consumer == 1)) named_barrier_arrive(2 - consumer, 2 * WARPGROUP);
  // END SOLUTION
}

// The online softmax on one S tile of N keys as the consumer's warp holds it (the accumulator of m64nN: rows row and
// row + 8, keys key0 + 8 n + 2 (lane % 4) + {0, 1}): scaled, masked, exponentiated in place into P; m, l and
// alpha (O's rescale) per row, as steps 9-10.
// `masked`: whether this tile has a key to mask for some row of the block (the last tile, the diagonal's): the
// others skip the comparisons, two per score.
template <bool CAUSAL, int N>
__device__ __forceinline__ void online_softmax(float (&s)[N / 2], bool masked, int key0, int seq_k, int row,
                                               int causal_offset, float scale_log2, float (&m)[2], float (&l)[2],
                                               float (&alpha)[2]) {
  const int lane = threadIdx.x % WARP;
  // BEGIN SOLUTION "step 19: scale, then mask keys past seq_k and past each row's diagonal; m, l, alpha; S into P"
  // A positive scale is left to the exponent's argument, s * scale - m in one FFMA: the maximum of the scaled scores
  // is the scale times the raw scores' maximum. Any other is applied first (0 x -inf would be NaN: scale, then mask).
  const float exp_scale = scale_log2 > 0.0f ? scale_log2 : 1.0f;
  if (exp_scale != scale_log2) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s[i] *= scale_log2;
  }
  if (masked) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const int key = key0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2, r = row + 8 * ((i % 4) / 2);
      if (key >= seq_k || (CAUSAL && key > r + causal_offset)) s[i] = -INFINITY;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the row's N / 4 values of this lane (2 per 8 keys), then the row's 4 lanes
    float row_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < N / 8; ++n) row_max = fmaxf(row_max, fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffff, row_max, 1));
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffff, row_max, 2));
    row_max = fmaxf(m[h], row_max * exp_scale);  // -inf stays -inf: exp_scale > 0
    const float shift = row_max == -INFINITY ? 0.0f : row_max;  // a row with no key yet: exp2(-inf) = 0
    alpha[h] = fast_exp2(m[h] - shift);
    m[h] = row_max;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < N / 8; ++n) {
      s[4 * n + 2 * h] = fast_exp2(fmaf(s[4 * n + 2 * h], exp_scale, -shift));
      s[4 * n + 2 * h + 1] = fast_exp2(fmaf(s[4 * n + 2 * h + 1], exp_scale, -shift));
      sum += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
    }
    l[h] = l[h] * alpha[h] + sum;  // this lane's part of the row's sum: the 4 lanes' are added at the end
  }
  // END SOLUTION
}

// Step 25 (optional): a row's keys with the masks beyond causal, [lo, hi) in the moved positions (query `row`, keys
// after the padding; rows past seq_q take the last row's). Causal's end is in hi too: the masks instance has no
// CAUSAL template flag of its own.
__device__ __forceinline__ int2 keys_of_row(const AttentionParams& p, int row, int seq_q, int seq_k, int padding,
                                            int skip) {
  // BEGIN SOLUTION "step 25: a row's keys, from the later of its window's and document's starts to the earlier end"
  row = min(row, seq_q - 1);
  const int diagonal = row + seq_k - seq_q;  // the row's own key
  int lo = p.masks.window_left >= 0 ? diagonal - p.masks.window_left : 0;
  int hi = p.causal ? diagonal + 1 : seq_k;
  if (p.masks.cu_seqlens != nullptr) {  // a document's bounds are positions of the whole sequence
    const int doc = document_of(p.masks.cu_seqlens, p.masks.documents, row + skip);
    lo = max(lo, p.masks.cu_seqlens[doc] - padding);
    hi = min(hi, p.masks.cu_seqlens[doc + 1] - padding);
  }
  return make_int2(max(lo, 0), hi);
  // SKELETON
  // return make_int2(0, 0);
  // END SOLUTION
}

// Step 25 (optional): what online_softmax does first, with the cap between: the scale, the soft-cap (`cap`, in log2
// units; 0 for none), then -inf outside each of the lane's rows' keys (keys[h]: row row + 8 h) on a tile an edge of
// them crosses (`masked`). online_softmax then takes the scores as they are (scale 1, no mask of its own).
template <int N>
__device__ __forceinline__ void mask_scores(float (&s)[N / 2], bool masked, int key0, const int2 (&keys)[2],
                                            float scale_log2, float cap) {
  const int lane = threadIdx.x % WARP;
  // BEGIN SOLUTION "step 25: scale, soft-cap, then -inf outside each row's keys on a tile an edge crosses"
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s[i] *= scale_log2;
  if (cap > 0.0f) {
    const float inv_cap = 1.0f / cap;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s[i] = soft_cap(s[i], cap, inv_cap);
  }
  if (masked) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const int key = key0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
      const int2 k = keys[(i % 4) / 2];
      if (key < k.x || key >= k.y) s[i] = -INFINITY;
    }
  }
  // END SOLUTION
}

// Step 18: S = Q K^T of one K tile (this consumer's 64 rows x N keys), issued and committed as one group: the
// caller waits for it (wgmma_wait) before reading s.
template <typename T, int D, int N>
__device__ __forceinline__ void issue_scores(float (&s)[N / 2], const char* q_rows, const char* k_tile) {
  // BEGIN SOLUTION "step 18: one wgmma_ss per k16 step of head_dim, fenced before and committed after"
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {  // k16 step kk: panel kk / 4, 32 bytes per step within its rows
    const int panel = kk / 4, at = (kk % 4) * 32;
    wgmma_ss<T, N>(s, swizzled_tile(q_rows + panel * Q_PANEL_BYTES + at),
                   swizzled_tile(k_tile + panel * N * ROW_BYTES + at), kk > 0);
  }
  wgmma_commit();
  // END SOLUTION
}

// Step 19: O += P V of one V tile of N keys, issued and committed as one group; P from registers (pa), V read
// transposed.
template <typename T, int D, int N>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], uint32_t (&pa)[N / 16][4], const char* v_tile) {
  // BEGIN SOLUTION "step 19: the operands pinned and fenced, one wgmma_rs_transposed per 16 keys, committed"
  pin_registers(o);
  pin_registers(pa);
  wgmma_fence();
#pragma unroll
  for (int t = 0; t < N / 16; ++t)  // keys 16t ..: 16 rows into the tile; its panels N rows apart
    wgmma_rs_transposed<T, D>(o, pa[t], swizzled_tile(v_tile + t * 16 * ROW_BYTES, N * ROW_BYTES));
  wgmma_commit();
  // END SOLUTION
}

// Step 19: O's rows rescaled by alpha (the accumulator's rows row and row + 8), and P packed into A operands.
template <int D>
__device__ __forceinline__ void rescale(float (&o)[D / 2], const float (&alpha)[2]) {
  // BEGIN SOLUTION "step 19: each row of O times its alpha"
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[4 * n] *= alpha[0], o[4 * n + 1] *= alpha[0];
    o[4 * n + 2] *= alpha[1], o[4 * n + 3] *= alpha[1];
  }
  // END SOLUTION
}
template <typename T, int N>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[N / 16][4], const float (&s)[N / 2]) {
  // BEGIN SOLUTION "step 19: P to 16 bits, two neighbouring 8-key chunks of S's accumulator per A fragment"
#pragma unroll
  for (int t = 0; t < N / 16; ++t)
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[t][r] = Half<T>::pack(s[8 * t + 2 * r], s[8 * t + 2 * r + 1]);
  // END SOLUTION
}

// A block of query rows: BLOCK_ROWS queries of one (batch, head), the work of one block (PERSISTENT: one of several
// that a block walks). `tiles` 0: nothing to compute (every row padding, or step 25 still to write).
struct RowBlock {
  int bh, kv_bh, batch;        // the query head's and its key/value head's index in batch * heads
  int q_start;                 // the first row, in the positions after the padding
  int seq_q, seq_k;            // the lengths after the padding
  int padding, skip;           // padded keys and queries (key_start), 0 without
  int first_tile, tiles;       // the block's K/V tiles: first_tile + j for j < tiles
};

// grid: batch * heads * ceil(seq_q / BLOCK_ROWS) blocks of rows, one a block; PERSISTENT: one block an SM, each
// walking the blocks of rows blockIdx.x, blockIdx.x + gridDim.x, ... THREADS threads, Layout<PANELS>::BYTES of shared
// memory. PANELS: 64-column panels of head_dim (1 up to 64, else 2). q, k, v are read through the maps; out: (batch *
// heads, seq_q, head_dim), head_dim a multiple of 8. MASKS: hp.p.masks applied (step 25), CAUSAL false and p.causal
// read.
template <typename T, int PANELS, bool CAUSAL, bool MASKS>
__global__ void __launch_bounds__(THREADS, 1) flash_attention_hopper_kernel(const __grid_constant__ HopperAttentionParams hp) {
  using L = Layout<PANELS>;
  constexpr int D = PANELS * HOPPER_BOX_COLS;  // the head_dim the products cover (zeros past head_dim)
  constexpr int COLS = L::COLS;                 // keys per K/V tile
  const AttentionParams& p = hp.p;
  extern __shared__ char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  char *k_tiles = smem + L::K, *v_tiles = smem + L::V;
  uint64_t* q_fulls = reinterpret_cast<uint64_t*>(smem + L::BARRIERS);
  uint64_t *k_full = q_fulls + L::Q_BUFFERS, *v_full = k_full + STAGES, *q_empties = v_full + STAGES;
  uint64_t* empty = q_empties + L::Q_BUFFERS;

  // A head's query blocks are neighbours, so the blocks running at once share their K and V in L2; within a head the
  // longest causal rows come first.
  const int q_blocks = ceil_div(p.seq_q, BLOCK_ROWS);
  const int64_t row_blocks = (int64_t)p.batch * p.heads * q_blocks;
  const auto row_block = [&](int64_t index) {
    RowBlock b;
    b.bh = static_cast<int>(index / q_blocks);
    b.batch = b.bh / p.heads;
    b.kv_bh = b.batch * p.kv_heads + b.bh % p.heads / (p.heads / p.kv_heads);
    b.q_start = (q_blocks - 1 - static_cast<int>(index % q_blocks)) * BLOCK_ROWS;
    b.seq_q = p.seq_q, b.seq_k = p.seq_k, b.padding = 0, b.skip = 0;
    if (p.key_start != nullptr) {  // as steps 8-11: the rows move past the padding (padded queries get zeros)
      b.padding = p.key_start[b.batch];
      b.skip = min(b.seq_q, max(0, b.padding - (b.seq_k - b.seq_q)));
      b.seq_k -= b.padding;
      b.seq_q -= b.skip;
    }
    b.first_tile = 0;
    b.tiles = 0;
    if (b.q_start >= b.seq_q) return b;
    const int causal_offset = b.seq_k - b.seq_q;  // query i sees keys j <= i + causal_offset
    const int last_key = CAUSAL ? min(b.seq_k, b.q_start + BLOCK_ROWS + causal_offset) : b.seq_k;
    b.tiles = last_key > 0 ? ceil_div(last_key, COLS) : 0;
    if constexpr (MASKS) {
      // BEGIN SOLUTION "step 25: the block's tiles, from its first row's first key to its last row's last"
      // Both ends of a row's keys rise with the row. Every row sees a key (its own, or its document's), so tiles >= 1.
      b.first_tile = keys_of_row(p, b.q_start, b.seq_q, b.seq_k, b.padding, b.skip).x / COLS;
      b.tiles = ceil_div(keys_of_row(p, b.q_start + BLOCK_ROWS - 1, b.seq_q, b.seq_k, b.padding, b.skip).y, COLS) -
                b.first_tile;
      // SKELETON
      // b.tiles = 0;  // until step 25 is written: out is left as it was, and the part says which step is missing
      // END SOLUTION
    }
    return b;
  };

  // q_full (a Q buffer's), each stage's k_full and v_full: one arrival (the producer's, with the bytes); q_empty and
  // each stage's empty: every consumer thread's
  mbarrier_init_all(q_fulls, L::Q_BUFFERS + 2 * STAGES, 1);
  mbarrier_init_all(q_empties, L::Q_BUFFERS + STAGES, 2 * WARPGROUP);
  const int warpgroup = threadIdx.x / WARPGROUP;
  if (warpgroup == 0) {
    // BEGIN SOLUTION "step 20: the producer: registers given back, then step 17's loads by one thread"
    registers_release<PRODUCER_REGISTERS>();
    if (threadIdx.x != 0) return;
    // END SOLUTION
    // `done`: the blocks of rows this block has loaded; `ring`: the K/V tiles it has put through the ring
    int done = 0, ring = 0;
    for (int64_t index = blockIdx.x; index < row_blocks; index += gridDim.x) {
      const RowBlock b = row_block(index);
      if (b.tiles == 0) continue;
      const int bh = b.bh, kv_bh = b.kv_bh, skip = b.skip, q_start = b.q_start, tiles = b.tiles;
      const int first_key = b.padding + b.first_tile * COLS;  // the block's first tile's first key in the tensor
      // Q's buffer for these rows, once the consumers are done with the rows it held before
      const int buffer = done % L::Q_BUFFERS;
      char* q_tile = smem + L::Q + buffer * L::Q_TILE;
      uint64_t* q_full = &q_fulls[buffer];
      if (done >= L::Q_BUFFERS) mbarrier_wait(&q_empties[buffer], (done / L::Q_BUFFERS + 1) % 2);
      // BEGIN SOLUTION "step 17: Q, then K and V tile by tile into the ring of STAGES, a stage reused once empty"
      mbarrier_expect_bytes(q_full, L::Q_TILE);
      for (int panel = 0; panel < PANELS; ++panel)
        tma_load_box(q_tile + panel * Q_PANEL_BYTES, &hp.q_map, panel * HOPPER_BOX_COLS, skip + q_start, bh, q_full);
      for (int j = 0; j < tiles; ++j) {
        const int n = ring + j, stage = n % STAGES;  // the ring's n-th tile
        if (n >= STAGES) mbarrier_wait(&empty[stage], (n / STAGES + 1) % 2);  // the consumers of tile n - STAGES
        const int key = first_key + j * COLS;
        char *k_tile = k_tiles + stage * L::KV_TILE, *v_tile = v_tiles + stage * L::KV_TILE;
        mbarrier_expect_bytes(&k_full[stage], L::KV_TILE);
        for (int panel = 0; panel < PANELS; ++panel)
          for (int box = 0; box < COLS / HOPPER_KV_BOX_ROWS; ++box)  // rows box * 64 .. of the panel
            tma_load_box(k_tile + panel * L::KV_PANEL + box * HOPPER_KV_BOX_ROWS * ROW_BYTES, &hp.k_map,
                         panel * HOPPER_BOX_COLS, key + box * HOPPER_KV_BOX_ROWS, kv_bh, &k_full[stage]);
        mbarrier_expect_bytes(&v_full[stage], L::KV_TILE);
        for (int panel = 0; panel < PANELS; ++panel)
          for (int box = 0; box < COLS / HOPPER_KV_BOX_ROWS; ++box)
            tma_load_box(v_tile + panel * L::KV_PANEL + box * HOPPER_KV_BOX_ROWS * ROW_BYTES, &hp.v_map,
                         panel * HOPPER_BOX_COLS, key + box * HOPPER_KV_BOX_ROWS, kv_bh, &v_full[stage]);
      }
      // END SOLUTION
      ++done;
      ring += tiles;
    }
    return;
  }

  // BEGIN SOLUTION "step 20: the consumers take the registers the producer gave back"
  registers_take<CONSUMER_REGISTERS>();
  // END SOLUTION
  const int consumer = warpgroup - 1, warp = (threadIdx.x % WARPGROUP) / WARP, lane = threadIdx.x % WARP;
  const float scale_log2 = p.scale * LOG2E;
  const float cap = p.masks.softcap * LOG2E;  // the soft-cap in log2 units (step 25)
  int done = 0, ring = 0;  // as the producer's
  for (int64_t index = blockIdx.x; index < row_blocks; index += gridDim.x) {
    const RowBlock b = row_block(index);
    const int bh = b.bh, q_start = b.q_start, seq_q = b.seq_q, seq_k = b.seq_k, padding = b.padding, skip = b.skip;
    const int tiles = b.tiles, first_tile = b.first_tile;
    T* out = static_cast<T*>(p.out) + (size_t)bh * p.seq_q * p.head_dim;
    for (int idx = threadIdx.x - WARPGROUP; skip > q_start && idx < BLOCK_ROWS * p.head_dim; idx += 2 * WARPGROUP) {
      const int padded_row = q_start + idx / p.head_dim;  // the block's rows before the move: zeros if padded
      if (padded_row < skip) out[(size_t)padded_row * p.head_dim + idx % p.head_dim] = Half<T>::from_float(0.0f);
    }
    if (tiles == 0) continue;
    out += (size_t)skip * p.head_dim;
    // Step 22's turns (they do nothing until PINGPONG): started before the first rows, or each rows' with CHAIN_TURNS
    // 0; `last_rows`: no rows with a tile follow in this block (its last turn's arrival is left out)
    if (!CHAIN_TURNS || done == 0) turns_start(consumer);
    bool last_rows = true;
    for (int64_t next = index + gridDim.x; CHAIN_TURNS && next < row_blocks; next += gridDim.x)
      if (row_block(next).tiles > 0) {
        last_rows = false;
        break;
      }
    const int causal_offset = seq_k - seq_q;  // query i sees keys j <= i + causal_offset
    const int buffer = done % L::Q_BUFFERS, q_parity = (done / L::Q_BUFFERS) % 2;  // Q's buffer, its phase's parity
    const char* q_tile = smem + L::Q + buffer * L::Q_TILE;
    uint64_t *q_full = &q_fulls[buffer], *q_empty = &q_empties[buffer];
    const char* q_rows = q_tile + consumer * 64 * ROW_BYTES;  // this consumer's 64 rows, in every panel
    const int row = q_start + consumer * 64 + warp * 16 + lane / 4;  // this lane's rows: row and row + 8
    float o[D / 2];  // O, 64 x D, in the accumulator layout
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
    float s[COLS / 2];         // S, 64 x COLS, in the accumulator layout
    uint32_t pa[COLS / 16][4];  // P as A operands of k16 (keys 16t .. 16t + 15)
    // Whether the tile from key0 has a key to mask for some row of the block (the last tile, the diagonal's)
    const auto masked = [&](int key0) {
      return key0 + COLS > seq_k || (CAUSAL && key0 + COLS - 1 > q_start + causal_offset);
    };
    // Step 25: the keys of this lane's rows, and those every row of this consumer sees (from its last row's first key
    // to its first row's last): a tile inside them needs no mask
    int2 keys[2], inside = make_int2(0, 0);
    if constexpr (MASKS) {
      keys[0] = keys_of_row(p, row, seq_q, seq_k, padding, skip);
      keys[1] = keys_of_row(p, row + 8, seq_q, seq_k, padding, skip);
      inside = make_int2(keys_of_row(p, q_start + consumer * 64 + 63, seq_q, seq_k, padding, skip).x,
                         keys_of_row(p, q_start + consumer * 64, seq_q, seq_k, padding, skip).y);
    }
    // The softmax of tile j (the block's tile first_tile + j) in s: step 19's online_softmax, after step 25's
    // mask_scores in the masks instance
    const auto softmax = [&](int j) {
      const int key0 = (first_tile + j) * COLS;
      if constexpr (MASKS) {
        mask_scores<COLS>(s, key0 < inside.x || key0 + COLS > inside.y, key0, keys, scale_log2, cap);
        online_softmax<false, COLS>(s, false, key0, seq_k, row, causal_offset, 1.0f, m, l, alpha);
      } else {
        online_softmax<CAUSAL, COLS>(s, masked(key0), key0, seq_k, row, causal_offset, scale_log2, m, l, alpha);
      }
    };
    if (!OVERLAP) {  // steps 18-20: each tile's products and softmax one after another
      for (int j = 0; j < tiles; ++j) {
        const int n = ring + j, stage = n % STAGES, parity = (n / STAGES) % 2;  // the ring's n-th tile
        // BEGIN SOLUTION "step 18: S = Q K^T once Q and K have landed, then wait for it"
        if (j == 0) mbarrier_wait(q_full, q_parity);
        mbarrier_wait(&k_full[stage], parity);
        issue_scores<T, D, COLS>(s, q_rows, k_tiles + stage * L::KV_TILE);
        wgmma_wait<0>();
        pin_registers(s);
        // END SOLUTION
        if (j == tiles - 1) mbarrier_arrive(q_empty);  // every S of these rows is done: Q's buffer may be refilled
        softmax(j);
        // BEGIN SOLUTION "step 19: O rescaled by alpha, P packed, O += P V once V has landed, then wait for it"
        rescale<D>(o, alpha);
        pack_p<T, COLS>(pa, s);
        mbarrier_wait(&v_full[stage], parity);
        issue_pv<T, D, COLS>(o, pa, v_tiles + stage * L::KV_TILE);
        wgmma_wait<0>();
        pin_registers(o);
        pin_registers(pa);  // read by that wgmma until now
        // END SOLUTION
        // BEGIN SOLUTION "step 20: this thread is done with the stage: an arrival on its empty barrier"
        mbarrier_arrive(&empty[stage]);
        // END SOLUTION
      }
    } else {
      // BEGIN SOLUTION "step 21: tile j's S = Q K^T issued with tile j - 1's O += P V, the softmax while it runs"
      // tiles >= 1 here: a block whose rows see no key was skipped above
      mbarrier_wait(q_full, q_parity);
      mbarrier_wait(&k_full[ring % STAGES], (ring / STAGES) % 2);
      turn_begin(consumer);  // step 22: a turn is the products issued between these two calls
      issue_scores<T, D, COLS>(s, q_rows, k_tiles + ring % STAGES * L::KV_TILE);
      turn_end(consumer, false);
      wgmma_wait<0>();
      pin_registers(s);
      softmax(0);
      pack_p<T, COLS>(pa, s);  // O is zero: nothing to rescale
      for (int j = 1; j < tiles; ++j) {
        const int n = ring + j, stage = n % STAGES, before = (n - 1) % STAGES;  // the ring's n-th tile, n - 1th
        mbarrier_wait(&k_full[stage], (n / STAGES) % 2);
        mbarrier_wait(&v_full[before], ((n - 1) / STAGES) % 2);
        turn_begin(consumer);
        issue_scores<T, D, COLS>(s, q_rows, k_tiles + stage * L::KV_TILE);
        issue_pv<T, D, COLS>(o, pa, v_tiles + before * L::KV_TILE);
        turn_end(consumer, false);
        wgmma_wait<1>();  // S of tile j is ready; O += P V of tile j - 1 may still run, beside this softmax
        pin_registers(s);
        softmax(j);
        wgmma_wait<0>();
        pin_registers(o);
        pin_registers(pa);  // read by that wgmma until now: no other value may take their registers before
        mbarrier_arrive(&empty[before]);
        rescale<D>(o, alpha);  // O had tile j - 1's maximum; now tile j's
        pack_p<T, COLS>(pa, s);
      }
      // END SOLUTION
      mbarrier_arrive(q_empty);  // every S of these rows is done: Q's buffer may be refilled (PERSISTENT)
      // BEGIN SOLUTION "step 21: the last tile's O += P V, waited for, and its stage emptied"
      const int last = (ring + tiles - 1) % STAGES;
      mbarrier_wait(&v_full[last], ((ring + tiles - 1) / STAGES) % 2);
      turn_begin(consumer);
      issue_pv<T, D, COLS>(o, pa, v_tiles + last * L::KV_TILE);
      turn_end(consumer, last_rows);
      wgmma_wait<0>();
      pin_registers(o);
      mbarrier_arrive(&empty[last]);
      // END SOLUTION
    }
    // BEGIN SOLUTION "step 20: out = O / l, l summed over the row's 4 lanes; zeros for a row that saw no key"
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
      const int r = row + 8 * h;
      if (r >= seq_q) continue;
      const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
      T* out_row = out + (size_t)r * p.head_dim;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int col = 8 * n + 2 * (lane % 4);  // head_dim is a multiple of 8: both columns or neither
        if (col < p.head_dim)
          *reinterpret_cast<uint32_t*>(out_row + col) =
              Half<T>::pack(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
      }
    }
    // END SOLUTION
    ++done;
    ring += tiles;
  }
}

template <typename T, int PANELS, bool CAUSAL, bool MASKS>
cudaError_t launch(const HopperAttentionParams& hp, cudaStream_t stream) {
  const auto kernel = flash_attention_hopper_kernel<T, PANELS, CAUSAL, MASKS>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<PANELS>::BYTES);
  if (err != cudaSuccess) return err;
  int grid = hp.p.batch * hp.p.heads * ceil_div(hp.p.seq_q, BLOCK_ROWS), device = 0, sms = 0;
  if (PERSISTENT) {  // one block an SM (a block takes most of an SM's shared memory), fewer if there are fewer rows
    if ((err = cudaGetDevice(&device)) != cudaSuccess ||
        (err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
      return err;
    grid = std::min(grid, sms);
  }
  kernel<<<grid, THREADS, Layout<PANELS>::BYTES, stream>>>(hp);
  return cudaGetLastError();
}

// The instance for head_dim's panels and the mask: with the masks, one that reads p.causal (step 25)
template <typename T, int PANELS>
cudaError_t launch_for_mask(const HopperAttentionParams& hp, cudaStream_t stream) {
  if (has_masks(hp.p.masks)) return launch<T, PANELS, false, true>(hp, stream);
  return hp.p.causal ? launch<T, PANELS, true, false>(hp, stream) : launch<T, PANELS, false, false>(hp, stream);
}

template <typename T>
cudaError_t launch_for_type(const HopperAttentionParams& hp, cudaStream_t stream) {
  return hp.p.head_dim <= HOPPER_BOX_COLS ? launch_for_mask<T, 1>(hp, stream) : launch_for_mask<T, 2>(hp, stream);
}

cudaError_t forward_with(const HopperAttentionParams& hp, cudaStream_t stream) {
  const AttentionParams& p = hp.p;
  if (p.batch < 0 || p.heads < 1 || p.kv_heads < 1 || p.heads % p.kv_heads != 0 || p.seq_q < 1 || p.seq_k < 1 ||
      p.head_dim < 8 || p.head_dim % 8 != 0 || p.head_dim > MAX_HEAD_DIM || (p.causal && p.seq_q > p.seq_k) ||
      p.lse != nullptr || (int64_t)p.batch * p.heads * ceil_div(p.seq_q, BLOCK_ROWS) > INT32_MAX)  // grid.x
    return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  return p.bf16 ? launch_for_type<__nv_bfloat16>(hp, stream) : launch_for_type<__half>(hp, stream);
}

}  // namespace

// The forward pass in bf16 or fp16 on Hopper; the parameters are described in device/params.h (no masks).
cudaError_t flash_attention_hopper_forward(const HopperAttentionParams& hp, cudaStream_t stream) {
  if (has_masks(hp.p.masks)) return cudaErrorInvalidValue;
  return forward_with(hp, stream);
}

// The same with the masks beyond causal of p.masks (step 25, optional): a window needs causal, documents seq_q ==
// seq_k (the binding checks them; key_start may be nullptr here).
cudaError_t flash_attention_hopper_forward_masks(const HopperAttentionParams& hp, cudaStream_t stream) {
  const AttentionParams& p = hp.p;
  const AttentionMasks& m = p.masks;
  if ((m.window_left >= 0 && !p.causal) || !(m.softcap >= 0.0f) ||
      (m.cu_seqlens != nullptr && (m.documents < 1 || p.seq_q != p.seq_k)))
    return cudaErrorInvalidValue;
  return forward_with(hp, stream);
}
