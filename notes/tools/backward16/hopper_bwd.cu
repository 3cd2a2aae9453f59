// Experiment (issue 58, notes/backward16-hopper-plan.md; device only, never run yet): the 16-bit backward pass on
// Hopper's instructions, steps 31-34 of the plan with no producer warpgroup yet (step 35).
// nvcc target: sm_90a
//
// A block owns 128 keys of one (batch, key/value head), two warpgroups of 64 keys each (their K and V loaded once by
// TMA, 128-byte swizzle). For each 64-query tile of each query head of the group (Q and dO by TMA, two stages, thread
// 0 issuing the next tile's copies while the tile is computed):
//   S^T = K Q^T, dP^T = V dO^T        wgmma m64n64k16, both operands from shared memory (K-major as stored)
//   P^T = exp2(S^T scale log2e - L log2e), dS^T = P^T (dP^T - D)      on the accumulators
//   dV += P^T dO, dK += dS^T Q        wgmma with P^T, dS^T as A operands in registers, dO and Q read transposed
//   dQ += dS K (this warpgroup's 64 keys)   dS^T to shared memory (keys by queries, swizzled), read as an
//                                     M-major A (transposed), K read transposed; added to dq_accum by red.add
// Then dK (scaled) and dV are written, and a small kernel writes dq = scale dq_accum in 16 bits.
// Layouts as task4/kernels/attention_backward_half.cu: q, out, dout, dq (batch * heads, seq_q, head_dim); k, v, dk,
// dv (batch * kv_heads, seq_k, head_dim); lse, delta (batch * heads, seq_q) float32; head_dim 64 or 128 here.

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "device/common.cuh"  // WARP, LOG2E, ceil_div
#include "device/half.cuh"    // Half<T>
#include "device/hopper.cuh"  // mbarrier_*, tma_load_box, swizzled_tile, wgmma_fence/commit/wait, pin_registers
#include "device/mma.cuh"     // fast_exp2
#include "backward_common.cuh"  // add_pair, delta_kernel, dq_kernel
#include "hopper_bwd.h"

namespace {

using backward_experiment::add_pair, backward_experiment::delta_kernel, backward_experiment::dq_kernel;

constexpr int WARPGROUP = 4 * WARP;
constexpr int CONSUMERS = 2;                      // warpgroups, 64 keys each
constexpr int KEYS = 64 * CONSUMERS;              // keys a block
constexpr int QUERIES = 64;                       // queries a tile (the TMA box of q and dout)
constexpr int THREADS = CONSUMERS * WARPGROUP;
constexpr int ROW_BYTES = 128;                    // a row of a 64-column panel
constexpr int Q_PANEL = QUERIES * ROW_BYTES;      // 8 KB
constexpr int KV_PANEL = KEYS * ROW_BYTES;        // 16 KB
constexpr int DS_TILE = 64 * ROW_BYTES;           // a consumer's dS^T: 64 keys x 64 queries, 8 KB

template <int PANELS>
struct Layout {
  static constexpr int K = 0, V = K + PANELS * KV_PANEL, Q = V + PANELS * KV_PANEL;  // Q: 2 stages
  static constexpr int DO = Q + 2 * PANELS * Q_PANEL, DS = DO + 2 * PANELS * Q_PANEL;  // dO: 2 stages
  static constexpr int BARRIERS = DS + CONSUMERS * DS_TILE;  // kv_full, then each stage's full
  static constexpr int BYTES = 1024 + BARRIERS + 8 * 3;
  static_assert(BYTES <= 227 * 1024, "shared memory");
};

// ---- the products (wgmma, 16-bit operands, float32 accumulators) this kernel needs beyond the kit's library
#define HB_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                   "+f"(d[i + 6]), "+f"(d[i + 7])
#define HB_ACC32 HB_ACC8(0), HB_ACC8(8), HB_ACC8(16), HB_ACC8(24)
#define HB_ACC64 HB_ACC32, HB_ACC8(32), HB_ACC8(40), HB_ACC8(48), HB_ACC8(56)
#define HB_NAMES32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                   "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define HB_NAMES64 HB_NAMES32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
                   "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// A and B from shared memory; TRANS_A, TRANS_B: 0 K-major (as stored rows of k), 1 M- or N-major (read transposed)
#define HB_WGMMA_SS(N, TYPE, NAMES, A, B, KEEP, TA, TB, ACC)                                                    \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" KEEP ", 0;\n wgmma.mma_async.sync.aligned.m64n" #N        \
               "k16.f32." TYPE "." TYPE " {" NAMES "}, %" A ", %" B ", p, 1, 1, " #TA ", " #TB ";\n}\n"          \
               : ACC : "l"(a), "l"(b), "r"(int(accumulate)))

// d (64 x 64) (+)= A (64 x 16) B^T (B: 64 x 16), both K-major: S^T = K Q^T and dP^T = V dO^T
template <typename T>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    HB_WGMMA_SS(64, "bf16", HB_NAMES32, "32", "33", "34", 0, 0, HB_ACC32);
  else
    HB_WGMMA_SS(64, "f16", HB_NAMES32, "32", "33", "34", 0, 0, HB_ACC32);
}

// d (64 x N) (+)= A (64 x 16) B (16 x N), A read transposed (M-major: dS^T stored keys by queries), B read
// transposed (N-major: K stored keys by head_dim): dQ += dS K. N = 64 or 128 (head_dim's panels)
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (N == 64 && std::is_same_v<T, __nv_bfloat16>)
    HB_WGMMA_SS(64, "bf16", HB_NAMES32, "32", "33", "34", 1, 1, HB_ACC32);
  else if constexpr (N == 64)
    HB_WGMMA_SS(64, "f16", HB_NAMES32, "32", "33", "34", 1, 1, HB_ACC32);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    HB_WGMMA_SS(128, "bf16", HB_NAMES64, "64", "65", "66", 1, 1, HB_ACC64);
  else
    HB_WGMMA_SS(128, "f16", HB_NAMES64, "64", "65", "66", 1, 1, HB_ACC64);
}

// Generic-proxy writes to shared memory (st.shared of dS^T) made visible to the async proxy (wgmma's reads)
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The warpgroup's own barrier (named barrier 1 + consumer, 128 threads): its four warps' dS^T rows written
__device__ __forceinline__ void warpgroup_sync(int consumer) {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + consumer), "r"(WARPGROUP) : "memory");
}

// grid (ceil(seq_k / KEYS), batch * kv_heads), THREADS threads, Layout<PANELS>::BYTES of shared memory
template <typename T, int PANELS>
__global__ void __launch_bounds__(THREADS, 1) dkdv_hopper_kernel(const __grid_constant__ HopperBackwardParams hp) {
  using L = Layout<PANELS>;
  constexpr int D = 64 * PANELS;
  const HopperBackwardParams& p = hp;
  extern __shared__ char smem_raw[];
  // aligned to 1024 bytes from smem_raw itself, so the compiler still knows it is shared memory (STS, not ST.E)
  char* smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + L::BARRIERS);
  uint64_t* full = kv_full + 1;  // each stage's Q and dO

  const int consumer = threadIdx.x / WARPGROUP, warp = (threadIdx.x % WARPGROUP) / WARP, lane = threadIdx.x % WARP;
  const int batch = blockIdx.y / p.kv_heads, kv_head = blockIdx.y % p.kv_heads, group = p.heads / p.kv_heads;
  const int n0 = blockIdx.x * KEYS, seq_q = p.seq_q, seq_k = p.seq_k, head_dim = p.head_dim;
  const int causal_offset = seq_k - seq_q;  // query i sees keys j <= i + causal_offset
  const int first_tile = p.causal ? max(0, n0 - causal_offset) / QUERIES : 0;
  const int tiles_per_head = ceil_div(seq_q, QUERIES) - first_tile;
  const int tiles = group * tiles_per_head;
  const auto head_of = [&](int i) { return batch * p.heads + kv_head * group + i / tiles_per_head; };
  const auto start_of = [&](int i) { return (first_tile + i % tiles_per_head) * QUERIES; };

  mbarrier_init_all(kv_full, 3, 1);
  const auto issue = [&](int i) {  // thread 0: tile i's Q and dO into stage i % 2
    const int stage = i % 2;
    mbarrier_expect_bytes(&full[stage], 2 * PANELS * Q_PANEL);
    for (int panel = 0; panel < PANELS; ++panel) {
      tma_load_box(smem + L::Q + (stage * PANELS + panel) * Q_PANEL, &hp.q_map, panel * 64, start_of(i), head_of(i),
                   &full[stage]);
      tma_load_box(smem + L::DO + (stage * PANELS + panel) * Q_PANEL, &hp.do_map, panel * 64, start_of(i), head_of(i),
                   &full[stage]);
    }
  };
  if (threadIdx.x == 0) {
    mbarrier_expect_bytes(kv_full, 2 * PANELS * KV_PANEL);
    for (int panel = 0; panel < PANELS; ++panel)
      for (int box = 0; box < KEYS / 64; ++box) {
        tma_load_box(smem + L::K + panel * KV_PANEL + box * 64 * ROW_BYTES, &hp.k_map, panel * 64, n0 + box * 64,
                     blockIdx.y, kv_full);
        tma_load_box(smem + L::V + panel * KV_PANEL + box * 64 * ROW_BYTES, &hp.v_map, panel * 64, n0 + box * 64,
                     blockIdx.y, kv_full);
      }
    if (tiles > 0) issue(0);
  }

  // this consumer's 64 keys: rows 64 consumer .. of every K/V panel; this lane's accumulator rows (keys) key0, key0 + 8
  const char* k_rows = smem + L::K + consumer * 64 * ROW_BYTES;
  const char* v_rows = smem + L::V + consumer * 64 * ROW_BYTES;
  char* ds_tile = smem + L::DS + consumer * DS_TILE;
  const int key_local = warp * 16 + lane / 4;  // within the consumer's 64 (and + 8)
  const int key0 = n0 + consumer * 64 + key_local;
  const float scale_log2 = p.scale * LOG2E;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;

  mbarrier_wait(kv_full, 0);
  for (int i = 0; i < tiles; ++i) {
    const int stage = i % 2, m0 = start_of(i), head = head_of(i);
    // stage (i + 1) % 2 was last read in tile i - 1, which every thread finished (the __syncthreads at its end)
    if (threadIdx.x == 0 && i + 1 < tiles) issue(i + 1);
    mbarrier_wait(&full[stage], (i / 2) % 2);
    const char* q_tile = smem + L::Q + stage * PANELS * Q_PANEL;
    const char* do_tile = smem + L::DO + stage * PANELS * Q_PANEL;

    // S^T = K Q^T and dP^T = V dO^T: this consumer's 64 keys x the tile's 64 queries
    float s[32], dp[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {  // k16 step kk: panel kk / 4, 32 bytes a step within its rows
      const int panel = kk / 4, at = (kk % 4) * 32;
      wgmma_ss_n64<T>(s, swizzled_tile(k_rows + panel * KV_PANEL + at), swizzled_tile(q_tile + panel * Q_PANEL + at),
                      kk > 0);
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int panel = kk / 4, at = (kk % 4) * 32;
      wgmma_ss_n64<T>(dp, swizzled_tile(v_rows + panel * KV_PANEL + at),
                      swizzled_tile(do_tile + panel * Q_PANEL + at), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    pin_registers(s);
    pin_registers(dp);

    // P^T and dS^T on the accumulators: register 4j + r is key key0 + 8 (r / 2), query m0 + 8j + 2 (lane % 4) + r % 2
    // keys past seq_k (zero rows: S = 0, and exp(0 - L) overflows for very negative scores), and the future
    const bool masked = n0 + KEYS > seq_k || (p.causal && n0 + KEYS - 1 > m0 + causal_offset);
    const float* lse = p.lse + (size_t)head * seq_q;
    const float* delta = p.delta + (size_t)head * seq_q;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int query = m0 + 8 * j + 2 * (lane % 4);
      float l2[2], dd[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {  // queries past seq_q: L = +inf makes P exactly 0 (their Q and dO rows are zeros)
        l2[c] = query + c < seq_q ? lse[query + c] * LOG2E : INFINITY;
        dd[c] = query + c < seq_q ? delta[query + c] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = key0 + 8 * (r / 2), q = query + r % 2;
        float pt = fast_exp2(s[4 * j + r] * scale_log2 - l2[r % 2]);
        if (masked && (key >= seq_k || (p.causal && key > q + causal_offset))) pt = 0.0f;
        s[4 * j + r] = pt;
        dp[4 * j + r] = pt * (dp[4 * j + r] - dd[r % 2]);
      }
    }
    // P^T and dS^T as A operands of k16 steps (queries 16t ..), as the forward packs P
    uint32_t pa[4][4], dsa[4][4];
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        pa[t][r] = Half<T>::pack(s[8 * t + 2 * r], s[8 * t + 2 * r + 1]);
        dsa[t][r] = Half<T>::pack(dp[8 * t + 2 * r], dp[8 * t + 2 * r + 1]);
      }
    // dS^T to shared memory for dQ: keys by queries, 128-byte rows swizzled (16-byte chunk j of row r at j ^ r % 8)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = key_local + 8 * h;
        *reinterpret_cast<uint32_t*>(ds_tile + row * ROW_BYTES + ((j ^ (row % 8)) * 16) + 4 * (lane % 4)) =
            dsa[j / 2][2 * (j % 2) + h];
      }

    // dV += P^T dO and dK += dS^T Q: A from registers, dO and Q read transposed (queries along k)
    pin_registers(dv);
    pin_registers(dk);
    pin_registers(pa);
    pin_registers(dsa);
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < 4; ++t)
      wgmma_rs_transposed<T, D>(dv, pa[t], swizzled_tile(do_tile + t * 16 * ROW_BYTES, Q_PANEL));
#pragma unroll
    for (int t = 0; t < 4; ++t)
      wgmma_rs_transposed<T, D>(dk, dsa[t], swizzled_tile(q_tile + t * 16 * ROW_BYTES, Q_PANEL));
    wgmma_commit();
    wgmma_wait<0>();
    pin_registers(dv);
    pin_registers(dk);
    pin_registers(pa);
    pin_registers(dsa);

    // dQ (the tile's 64 queries x D) += dS (64 queries x this consumer's 64 keys) K (64 keys x D)
    fence_async_shared();  // this thread's dS^T stores, for wgmma's reads
    warpgroup_sync(consumer);  // and the warpgroup's other warps'
    float dq[D / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)  // keys 16 kk ..: 16 rows of dS^T, 16 rows of this consumer's K in every panel
      wgmma_ss_tt<T, D>(dq, swizzled_tile(ds_tile + kk * 16 * ROW_BYTES),
                        swizzled_tile(k_rows + kk * 16 * ROW_BYTES, KV_PANEL), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    pin_registers(dq);
    // register 4j + r: query m0 + 16 warp + lane / 4 + 8 (r / 2), column 8j + 2 (lane % 4) + r % 2
    float* dq_rows = p.dq_accum + ((size_t)head * seq_q + m0) * head_dim;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + lane / 4 + 8 * h;
      if (m0 + row >= seq_q) continue;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const int col = 8 * j + 2 * (lane % 4);
        if (col < head_dim) add_pair(dq_rows + (size_t)row * head_dim + col, dq[4 * j + 2 * h], dq[4 * j + 2 * h + 1]);
      }
    }
    __syncthreads();  // every thread is done with this stage's Q and dO, and with dS^T, before they are written again
  }

  // dK = scale dS^T Q and dV, this consumer's 64 keys: register 4j + r is key key0 + 8 (r / 2), column 8j + ...
  T* dk_out = static_cast<T*>(p.dk) + ((size_t)blockIdx.y * seq_k) * head_dim;
  T* dv_out = static_cast<T*>(p.dv) + ((size_t)blockIdx.y * seq_k) * head_dim;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key0 + 8 * h;
    if (key >= seq_k) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = 8 * j + 2 * (lane % 4);
      if (col >= head_dim) continue;
      *reinterpret_cast<uint32_t*>(dk_out + (size_t)key * head_dim + col) =
          Half<T>::pack(dk[4 * j + 2 * h] * p.scale, dk[4 * j + 2 * h + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv_out + (size_t)key * head_dim + col) =
          Half<T>::pack(dv[4 * j + 2 * h], dv[4 * j + 2 * h + 1]);
    }
  }
}

template <typename T, int PANELS>
cudaError_t launch(const HopperBackwardParams& p, cudaStream_t stream) {
  const long long rows = (long long)p.batch * p.heads * p.seq_q;
  const unsigned delta_blocks = static_cast<unsigned>((rows * WARP + 255) / 256);  // a warp a row, 64-bit sums
  delta_kernel<T><<<delta_blocks, 256, 0, stream>>>(static_cast<const T*>(p.out), static_cast<const T*>(p.dout),
                                                    p.delta, rows, p.head_dim);
  constexpr int bytes = Layout<PANELS>::BYTES;
  cudaError_t err = cudaFuncSetAttribute(dkdv_hopper_kernel<T, PANELS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         bytes);
  if (err != cudaSuccess) return err;
  dkdv_hopper_kernel<T, PANELS><<<dim3(ceil_div(p.seq_k, KEYS), p.batch * p.kv_heads), THREADS, bytes, stream>>>(p);
  dq_kernel<T><<<1024, 256, 0, stream>>>(p.dq_accum, static_cast<T*>(p.dq), rows * p.head_dim, p.scale);  // strided
  return cudaGetLastError();
}

}  // namespace

cudaError_t hopper_backward(const HopperBackwardParams& p, cudaStream_t stream) {
  if (p.head_dim > 128 || p.head_dim % 8 != 0) return cudaErrorInvalidValue;
  const bool wide = p.head_dim > 64;
  if (p.bf16) return wide ? launch<__nv_bfloat16, 2>(p, stream) : launch<__nv_bfloat16, 1>(p, stream);
  return wide ? launch<__half, 2>(p, stream) : launch<__half, 1>(p, stream);
}
