// Probe (issue 57): O (64 x D, f32) = P (64 x 128 keys) V (128 keys x D), the second product of attention, as the
// experiment fa.cu does it: P from registers (the A fragment of m64k16), V loaded by TMA into 64-column panels with the
// 128-byte swizzle and read N-major (transposed) from a shared-memory descriptor. The one part of fa.cu that the first
// probe (probe.cu, Q K^T) did not check is this descriptor: leading byte offset = the stride between 64-column panels
// of head_dim, stride byte offset = 1024 (8 rows of keys), +2048 bytes per k16 step. Each (leading, stride) pair is
// tried, the expected one first, so a wrong guess is told apart from a wrong fragment.
#include <cmath>
#include <vector>

#include "ptx.cuh"
#include "wgmma_gen.h"

constexpr int M = 64, KEYS = 128;

// p: (64, 128) float (already bf16-representable); o: (64, D). One warpgroup.
template <int D>
__global__ void __launch_bounds__(128) probe_pv(const __grid_constant__ CUtensorMap vmap, const float* p, float* o,
                                                uint32_t leading, uint32_t stride) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* v_s = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  __shared__ alignas(8) uint64_t bar;
  mbar_init_for_block(&bar, 1);
  if (threadIdx.x == 0) {
    mbar_expect_tx(&bar, KEYS * D * 2);
    for (int panel = 0; panel < D / 64; ++panel) tma_load_2d(v_s + panel * KEYS * 128, &vmap, 64 * panel, 0, &bar);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
  uint32_t a[8][4];
  for (int t = 0; t < 8; ++t) {
    const int row = 16 * warp + g, key = 16 * t + c;
    a[t][0] = pack_bf16(p[row * KEYS + key], p[row * KEYS + key + 1]);
    a[t][1] = pack_bf16(p[(row + 8) * KEYS + key], p[(row + 8) * KEYS + key + 1]);
    a[t][2] = pack_bf16(p[row * KEYS + key + 8], p[row * KEYS + key + 9]);
    a[t][3] = pack_bf16(p[(row + 8) * KEYS + key + 8], p[(row + 8) * KEYS + key + 9]);
  }
  while (!mbar_try_wait(&bar, 0)) {
  }
  float d[D / 2];
  for (int i = 0; i < D / 2; ++i) d[i] = 0.0f;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    if constexpr (D == 128) wgmma_rs_n128_tb(d, a[t], desc_sw128(v_s + t * 2048, leading, stride), 1);
    else wgmma_rs_n64_tb(d, a[t], desc_sw128(v_s + t * 2048, leading, stride), 1);
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  for (int j = 0; j < D / 8; ++j)
    for (int r = 0; r < 4; ++r) o[(16 * warp + g + 8 * (r / 2)) * D + 8 * j + c + r % 2] = d[4 * j + r];
}

template <int D>
static int run(uint32_t leading, uint32_t stride, const char* label) {
  std::vector<float> p(M * KEYS), v(KEYS * D);
  std::vector<__nv_bfloat16> vb(KEYS * D);
  srand(7 + D);
  for (auto& x : p) x = __bfloat162float(__float2bfloat16((rand() % 17) / 16.0f));
  for (int i = 0; i < KEYS * D; ++i) { vb[i] = __float2bfloat16((rand() % 13 - 6) / 4.0f); v[i] = __bfloat162float(vb[i]); }
  float *dp, *dout; __nv_bfloat16* dv;
  CHECK(cudaMalloc(&dp, p.size() * 4)); CHECK(cudaMalloc(&dout, M * D * 4)); CHECK(cudaMalloc(&dv, vb.size() * 2));
  CHECK(cudaMemcpy(dp, p.data(), p.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dv, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dout, 0xff, M * D * 4));
  PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
  CUtensorMap map;
  cuuint64_t dims[2] = {(cuuint64_t)D, KEYS}, strides[1] = {(cuuint64_t)D * 2};
  cuuint32_t box[2] = {64, KEYS}, estr[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, dv, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
      CUDA_SUCCESS) { printf("encode failed\n"); return 1; }
  const int smem = KEYS * D * 2 + 1024;
  CHECK(cudaFuncSetAttribute(probe_pv<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  probe_pv<D><<<1, 128, smem>>>(map, dp, dout, leading, stride);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> o(M * D);
  CHECK(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < D; ++j) {
      double ref = 0;
      for (int k = 0; k < KEYS; ++k) ref += (double)p[i * KEYS + k] * v[k * D + j];
      worst = fmax(worst, std::isnan(o[i * D + j]) ? INFINITY : fabs(ref - o[i * D + j]));
    }
  printf("probe P V, D %d, leading %u stride %u (%s): max |O - ref| = %g (%s)\n", D, leading, stride, label, worst,
         worst < 1e-3 ? "OK" : "WRONG");
  CHECK(cudaFree(dp)); CHECK(cudaFree(dout)); CHECK(cudaFree(dv));
  return worst < 1e-3 ? 0 : 2;
}

int main() {
  int wrong = 0;
  wrong += run<64>(16, 1024, "fa.cu's: one panel, 8 key rows 1024 bytes apart") != 0;
  wrong += run<128>(KEYS * 128, 1024, "fa.cu's: panels 16 KB apart, 8 key rows 1024 bytes apart") != 0;
  run<64>(1024, 16, "swapped");  // the alternatives, to tell a wrong guess from a wrong fragment
  run<128>(1024, KEYS * 128, "swapped");
  return wrong ? 2 : 0;
}
