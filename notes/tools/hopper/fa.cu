// Experiment (issue 57, steps 17-20): a bf16 FlashAttention forward on Hopper. One producer warpgroup loads Q once
// and K, V tiles into a ring of STAGES by TMA (128-byte swizzle, 64-column panels); two consumer warpgroups take 64
// query rows each: S = Q K^T by wgmma from shared memory, the online softmax on the accumulator, P to bf16
// registers, O += P V by wgmma with A from registers and V read N-major (transposed). No overlap of softmax with the
// products yet (step 21). Checked against float64 on the CPU, timed with CUDA events.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ptx.cuh"
#include "wgmma_gen.h"

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// A wait that gives up: an experiment's deadlock becomes an error that names the barrier, not a hang.
// Built with -DWATCHDOG only: its printf costs registers.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int phase) {
#ifndef WATCHDOG
  while (!mbar_try_wait(bar, phase)) {
  }
#else
  for (long spins = 0; !mbar_try_wait(bar, phase); ++spins)
    if (spins == (1l << 26)) {
      printf("block (%d, %d) thread %d: mbarrier at smem %u never reached phase %d\n", blockIdx.x, blockIdx.y,
             threadIdx.x, smem_u32(bar), phase);
      __trap();
    }
#endif
}
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int x, int y, int z, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
      ::"r"(smem_u32(dst)), "l"(map), "r"(x), "r"(y), "r"(z), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Pins registers in place around wgmma: the compiler must not move a read of an accumulator above the wait that makes
// it ready, nor a write below the wgmma that reads it (neither asm names the other's registers).
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
template <int D> struct Cfg {
  static constexpr int BM = 128, BN = 128, STAGES = 2, PANELS = D / 64;
  static constexpr int Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2, PANEL_ROWS_BYTES = BN * 128;
  static constexpr int SMEM = Q_BYTES + 2 * STAGES * KV_BYTES + 1024 + 256;
};

template <int D> __device__ __forceinline__ void s_mma(float (&s)[64], const char* q, const char* k) {
  constexpr int PANELS = D / 64;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int panel = kk / 4, within = (kk % 4) * 32;
    wgmma_ss_n128(s, desc_sw128(q + panel * 128 * 128 + within), desc_sw128(k + panel * Cfg<D>::PANEL_ROWS_BYTES + within),
                  kk > 0);
  }
  (void)PANELS;
}
template <int D> __device__ __forceinline__ void o_mma(float (&o)[D / 2], const uint32_t (&p)[8][4], const char* v);
template <> __device__ __forceinline__ void o_mma<128>(float (&o)[64], const uint32_t (&p)[8][4], const char* v) {
#pragma unroll
  for (int t = 0; t < 8; ++t) wgmma_rs_n128_tb(o, p[t], desc_sw128(v + t * 16 * 128, Cfg<128>::PANEL_ROWS_BYTES), 1);
}
template <> __device__ __forceinline__ void o_mma<64>(float (&o)[32], const uint32_t (&p)[8][4], const char* v) {
#pragma unroll
  for (int t = 0; t < 8; ++t) wgmma_rs_n64_tb(o, p[t], desc_sw128(v + t * 16 * 128, Cfg<64>::PANEL_ROWS_BYTES), 1);
}

// The online softmax on one S tile in the accumulator layout: rows row0 and row0 + 8 (lane / 4 within the warp's 16),
// keys key0 + 8 n8 + 2 (lane % 4) + {0, 1}. Masks keys past seq_k and, causal, past the row's diagonal; turns S into
// P = exp2(S scale_log2 - m); alpha is exp2(m_old - m_new) for O.
template <bool CAUSAL>
__device__ __forceinline__ void softmax_tile(float (&sc)[64], int key0, int seq_k, int block_diag, int diag0, int lane,
                                             float scale_log2, float (&m)[2], float (&l)[2], float (&alpha)[2]) {
  if (key0 + 128 > seq_k || (CAUSAL && key0 + 127 > block_diag)) {
#pragma unroll
    for (int n8 = 0; n8 < 16; ++n8)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = key0 + 8 * n8 + 2 * (lane % 4) + (r % 2);
        if (key >= seq_k || (CAUSAL && key > diag0 + 8 * (r / 2))) sc[4 * n8 + r] = -INFINITY;
      }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = m[h];
#pragma unroll
    for (int n8 = 0; n8 < 16; ++n8) mx = fmaxf(mx, fmaxf(sc[4 * n8 + 2 * h], sc[4 * n8 + 2 * h + 1]) * scale_log2);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    const float safe = mx == -INFINITY ? 0.0f : mx;
    alpha[h] = exp2f(m[h] - safe);
    m[h] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int n8 = 0; n8 < 16; ++n8) {
      sc[4 * n8 + 2 * h] = exp2f(sc[4 * n8 + 2 * h] * scale_log2 - safe);
      sc[4 * n8 + 2 * h + 1] = exp2f(sc[4 * n8 + 2 * h + 1] * scale_log2 - safe);
      sum += sc[4 * n8 + 2 * h] + sc[4 * n8 + 2 * h + 1];
    }
    l[h] = l[h] * alpha[h] + sum;
  }
}
template <int D> __device__ __forceinline__ void rescale(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int n8 = 0; n8 < D / 8; ++n8) {
    o[4 * n8 + 0] *= alpha[0]; o[4 * n8 + 1] *= alpha[0];
    o[4 * n8 + 2] *= alpha[1]; o[4 * n8 + 3] *= alpha[1];
  }
}
// keys 16t .. 16t + 15 of P: the A fragment of m64k16, from two n8 chunks of the accumulator
__device__ __forceinline__ void pack_p(const float (&sc)[64], uint32_t (&p)[8][4]) {
#pragma unroll
  for (int t = 0; t < 8; ++t)
#pragma unroll
    for (int r = 0; r < 4; ++r) p[t][r] = pack_bf16(sc[8 * t + 2 * r], sc[8 * t + 2 * r + 1]);
}

// O += P V once V of this stage has landed, then the stage is given back to the producer.
template <int D>
__device__ __forceinline__ void pv_then_release(float (&o)[D / 2], uint32_t (&p)[8][4], const char* v, uint64_t* v_full,
                                                int phase, uint64_t* empty) {
  mbar_wait(v_full, phase);
  fence_regs(o);
  fence_regs(p);
  wg_fence();
  o_mma<D>(o, p, v);
  wg_commit();
  wg_wait<0>();
  fence_regs(o);
  mbar_arrive(empty);
}

template <int D, bool CAUSAL, bool OVERLAP>
__global__ void __launch_bounds__(384, 1) fa_fwd(const __grid_constant__ CUtensorMap qmap,
                                                 const __grid_constant__ CUtensorMap kmap,
                                                 const __grid_constant__ CUtensorMap vmap, __nv_bfloat16* out,
                                                 int seq_q, int seq_k, float scale_log2) {
  using C = Cfg<D>;
  extern __shared__ char raw[];
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  char* q_s = base;
  char* k_s = q_s + C::Q_BYTES;
  char* v_s = k_s + C::STAGES * C::KV_BYTES;
  uint64_t* bars = reinterpret_cast<uint64_t*>(v_s + C::STAGES * C::KV_BYTES);
  uint64_t *q_full = bars, *k_full = bars + 1, *v_full = k_full + C::STAGES, *empty = v_full + C::STAGES;

  const int q_block = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x, bh = blockIdx.y;
  const int q_first = q_block * C::BM, offset = seq_k - seq_q;
  const int key_end = CAUSAL ? min(seq_k, q_first + C::BM + offset) : seq_k;
  const int n_tiles = key_end > 0 ? (key_end + C::BN - 1) / C::BN : 0;

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < C::STAGES; ++s) { mbar_init(&k_full[s], 1); mbar_init(&v_full[s], 1); mbar_init(&empty[s], 256); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {  // the producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    if (threadIdx.x == 0) {
      mbar_expect_tx(q_full, C::Q_BYTES);
      for (int p = 0; p < C::PANELS; ++p) tma_load_3d(q_s + p * C::BM * 128, &qmap, 64 * p, q_first, bh, q_full);
      for (int j = 0; j < n_tiles; ++j) {
        const int s = j % C::STAGES;
        if (j >= C::STAGES) mbar_wait(&empty[s], ((j / C::STAGES) + 1) & 1);
        mbar_expect_tx(&k_full[s], C::KV_BYTES);
        for (int p = 0; p < C::PANELS; ++p)
          tma_load_3d(k_s + s * C::KV_BYTES + p * C::PANEL_ROWS_BYTES, &kmap, 64 * p, j * C::BN, bh, &k_full[s]);
        mbar_expect_tx(&v_full[s], C::KV_BYTES);
        for (int p = 0; p < C::PANELS; ++p)
          tma_load_3d(v_s + s * C::KV_BYTES + p * C::PANEL_ROWS_BYTES, &vmap, 64 * p, j * C::BN, bh, &v_full[s]);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
  const int consumer = wg - 1, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const char* q_mine = q_s + consumer * 64 * 128;  // 64 rows of 128 bytes in each panel
  const int row0 = q_first + consumer * 64 + warp * 16 + lane / 4;  // and row0 + 8
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  mbar_wait(q_full, 0);
  if (!OVERLAP) {
    for (int j = 0; j < n_tiles; ++j) {
      const int s = j % C::STAGES, phase = (j / C::STAGES) & 1;
      float sc[64];
      mbar_wait(&k_full[s], phase);
      wg_fence();
      s_mma<D>(sc, q_mine, (k_s + s * C::KV_BYTES));
      wg_commit();
      wg_wait<0>();
      fence_regs(sc);
      float alpha[2];
      softmax_tile<CAUSAL>(sc, j * C::BN, seq_k, q_first + offset, row0 + offset, lane, scale_log2, m, l, alpha);
      rescale<D>(o, alpha);
      uint32_t p[8][4];
      pack_p(sc, p);
      pv_then_release<D>(o, p, v_s + s * C::KV_BYTES, &v_full[s], phase, &empty[s]);
    }
  } else if (n_tiles > 0) {
    // Step 21: tile j's S = Q K^T is issued before tile j - 1's O += P V, and its softmax runs while that product
    // is on the tensor cores (wgmma groups complete in order: wait for all but the newest is wait_group 1).
    uint32_t p[8][4];
    {
      float sc[64];
      mbar_wait(&k_full[0], 0);
      wg_fence();
      s_mma<D>(sc, q_mine, (k_s + 0 * C::KV_BYTES));
      wg_commit();
      wg_wait<0>();
      fence_regs(sc);
      float alpha[2];
      softmax_tile<CAUSAL>(sc, 0, seq_k, q_first + offset, row0 + offset, lane, scale_log2, m, l, alpha);
      pack_p(sc, p);
    }
    for (int j = 1; j < n_tiles; ++j) {
      const int s = j % C::STAGES, phase = (j / C::STAGES) & 1;
      const int prev = (j - 1) % C::STAGES, prev_phase = ((j - 1) / C::STAGES) & 1;
      float sc[64];
      mbar_wait(&k_full[s], phase);
      wg_fence();
      s_mma<D>(sc, q_mine, (k_s + s * C::KV_BYTES));
      wg_commit();
      mbar_wait(&v_full[prev], prev_phase);
      fence_regs(o);
      fence_regs(p);
      o_mma<D>(o, p, (v_s + prev * C::KV_BYTES));
      wg_commit();
      wg_wait<1>();  // S of tile j is ready; O += P V of tile j - 1 may still run
      fence_regs(sc);
      float alpha[2];
      softmax_tile<CAUSAL>(sc, j * C::BN, seq_k, q_first + offset, row0 + offset, lane, scale_log2, m, l, alpha);
      wg_wait<0>();
      fence_regs(o);
      fence_regs(p);
      mbar_arrive(&empty[prev]);
      rescale<D>(o, alpha);
      pack_p(sc, p);
    }
    const int last = (n_tiles - 1) % C::STAGES, last_phase = ((n_tiles - 1) / C::STAGES) & 1;
    pv_then_release<D>(o, p, v_s + last * C::KV_BYTES, &v_full[last], last_phase, &empty[last]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
    const int row = row0 + 8 * h;
    if (row >= seq_q) continue;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    __nv_bfloat16* dst = out + ((size_t)bh * seq_q + row) * D;
#pragma unroll
    for (int n8 = 0; n8 < D / 8; ++n8)
      *reinterpret_cast<uint32_t*>(dst + 8 * n8 + 2 * (lane % 4)) =
          pack_bf16(o[4 * n8 + 2 * h] * inv, o[4 * n8 + 2 * h + 1] * inv);
  }
}

// uniform in [-2, 2), from a hash of the index and the seed
__global__ void fill(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed * 2246822519u ^ (uint32_t)(i >> 32);
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13; x *= 3266489917u; x ^= x >> 16;
    p[i] = __float2bfloat16((x >> 8) * (4.0f / 16777216.0f) - 2.0f);
  }
}

static CUtensorMap make_map(const __nv_bfloat16* p, int bh, int seq, int d, int box_rows) {
  CUtensorMap map;
  cuuint64_t dims[3] = {(cuuint64_t)d, (cuuint64_t)seq, (cuuint64_t)bh};
  cuuint64_t strides[2] = {(cuuint64_t)d * 2, (cuuint64_t)seq * d * 2};
  cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, estr[3] = {1, 1, 1};
  CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void*)p, dims, strides, box, estr,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { printf("cuTensorMapEncodeTiled failed: %d\n", (int)r); exit(1); }
  return map;
}

template <int D, bool CAUSAL, bool OVERLAP>
static void launch(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* o, int bh,
                   int seq_q, int seq_k) {
  using C = Cfg<D>;
  static bool configured = false;
  if (!configured) {
    CHECK(cudaFuncSetAttribute(fa_fwd<D, CAUSAL, OVERLAP>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    configured = true;
  }
  // the maps made once per set of tensors, so a timed launch is the kernel's alone
  static CUtensorMap qm, km, vm;
  static const void* made_for[3] = {nullptr, nullptr, nullptr};
  static int made_shape[3] = {0, 0, 0};
  if (made_for[0] != q || made_for[1] != k || made_for[2] != v || made_shape[0] != bh || made_shape[1] != seq_q ||
      made_shape[2] != seq_k) {
    qm = make_map(q, bh, seq_q, D, C::BM);
    km = make_map(k, bh, seq_k, D, C::BN);
    vm = make_map(v, bh, seq_k, D, C::BN);
    made_for[0] = q, made_for[1] = k, made_for[2] = v;
    made_shape[0] = bh, made_shape[1] = seq_q, made_shape[2] = seq_k;
  }
  dim3 grid((seq_q + C::BM - 1) / C::BM, bh);
  fa_fwd<D, CAUSAL, OVERLAP><<<grid, 384, C::SMEM>>>(qm, km, vm, o, seq_q, seq_k, 1.4426950408889634f / sqrtf((float)D));
}

template <int D, bool CAUSAL, bool OVERLAP> static void run(int b, int h, int seq_q, int seq_k, bool check) {
  const int bh = b * h;
  const size_t nq = (size_t)bh * seq_q * D, nk = (size_t)bh * seq_k * D;
  __nv_bfloat16 *q, *k, *v, *o;
  CHECK(cudaMalloc(&q, nq * 2)); CHECK(cudaMalloc(&k, nk * 2)); CHECK(cudaMalloc(&v, nk * 2)); CHECK(cudaMalloc(&o, nq * 2));
  fill<<<1024, 256>>>(q, nq, 1u + seq_q * 7u + D);  // on the GPU: the CPU takes seconds for the large cases
  fill<<<1024, 256>>>(k, nk, 2u + seq_k * 7u + D);
  fill<<<1024, 256>>>(v, nk, 3u + seq_k * 7u + D);
  CHECK(cudaMemset(o, 0xff, nq * 2));  // NaN: a row never written shows
  launch<D, CAUSAL, OVERLAP>(q, k, v, o, bh, seq_q, seq_k);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  if (check) {
    std::vector<__nv_bfloat16> hq(nq), hk(nk), hv(nk), ho(nq);
    CHECK(cudaMemcpy(hq.data(), q, nq * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hk.data(), k, nk * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hv.data(), v, nk * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(ho.data(), o, nq * 2, cudaMemcpyDeviceToHost));
    double worst = 0, worst_ref = 0;
    const int off = seq_k - seq_q;
    std::vector<double> sc(seq_k);
    for (int x = 0; x < bh; ++x)
      for (int i = 0; i < seq_q; i += (seq_q > 600 ? 7 : 1)) {
        double mx = -1e300;
        for (int j = 0; j < seq_k; ++j) {
          double acc = 0;
          for (int d = 0; d < D; ++d)
            acc += (double)__bfloat162float(hq[((size_t)x * seq_q + i) * D + d]) * __bfloat162float(hk[((size_t)x * seq_k + j) * D + d]);
          sc[j] = (CAUSAL && j > i + off) ? -1e300 : acc / sqrt((double)D);
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j < seq_k; ++j) { sc[j] = sc[j] <= -1e299 ? 0 : exp(sc[j] - mx); sum += sc[j]; }
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j < seq_k; ++j) acc += sc[j] * __bfloat162float(hv[((size_t)x * seq_k + j) * D + d]);
          const double ref = acc / sum, got = __bfloat162float(ho[((size_t)x * seq_q + i) * D + d]);
          const double err = std::isnan(got) ? 1e9 : fabs(got - ref);
          worst = std::max(worst, err);
          worst_ref = std::max(worst_ref, fabs(ref));
        }
      }
    printf("check%s D%d %s b%d h%d sq%d sk%d: max |err| %.3e (max |ref| %.2f) %s\n", OVERLAP ? " overlap" : "", D, CAUSAL ? "causal" : "full", b, h,
           seq_q, seq_k, worst, worst_ref, worst < 2e-2 ? "OK" : "WRONG");
  } else {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int i = 0; i < 5; ++i) launch<D, CAUSAL, OVERLAP>(q, k, v, o, bh, seq_q, seq_k);
    std::vector<float> ms;
    for (int i = 0; i < 20; ++i) {
      cudaEventRecord(e0);
      launch<D, CAUSAL, OVERLAP>(q, k, v, o, bh, seq_q, seq_k);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float t; cudaEventElapsedTime(&t, e0, e1); ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double flops = 4.0 * bh * seq_q * (double)seq_k * D * (CAUSAL ? 0.5 : 1.0);
    printf("time%s D%d %s b%d h%d s%d: %.3f ms, %.0f TFLOP/s\n", OVERLAP ? " overlap" : "", D, CAUSAL ? "causal" : "full", b, h, seq_q, ms[10],
           flops / ms[10] / 1e9);
  }
  CHECK(cudaFree(q)); CHECK(cudaFree(k)); CHECK(cudaFree(v)); CHECK(cudaFree(o));
}

template <bool OVERLAP> static void checks() {
  run<128, false, OVERLAP>(1, 2, 300, 300, true);
  run<128, false, OVERLAP>(1, 2, 77, 1000, true);
  run<64, false, OVERLAP>(1, 2, 300, 300, true);
  run<128, true, OVERLAP>(1, 2, 300, 300, true);
  run<128, true, OVERLAP>(1, 2, 200, 333, true);
  run<64, true, OVERLAP>(2, 1, 257, 257, true);
  run<128, false, OVERLAP>(1, 1, 4096, 4096, true);
}
template <bool OVERLAP> static void timings() {
  run<64, false, OVERLAP>(8, 32, 4096, 4096, false);
  run<128, false, OVERLAP>(8, 32, 4096, 4096, false);
  run<128, false, OVERLAP>(1, 32, 16384, 16384, false);
  run<128, false, OVERLAP>(16, 32, 1024, 1024, false);
  run<64, true, OVERLAP>(8, 32, 4096, 4096, false);
  run<128, true, OVERLAP>(8, 32, 4096, 4096, false);
  run<128, true, OVERLAP>(1, 32, 16384, 16384, false);
  run<128, true, OVERLAP>(16, 32, 1024, 1024, false);
}

// ./fa check|time 0|1: the checks or the timings, without (0) or with (1) step 21's overlap
int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it comes: a run cut by a timeout still shows how far it got
  if (argc != 3) { printf("usage: %s check|time 0|1\n", argv[0]); return 1; }
  const bool check = argv[1][0] == 'c', overlap = argv[2][0] == '1';
  if (check) overlap ? checks<true>() : checks<false>();
  else overlap ? timings<true>() : timings<false>();
  return 0;
}
