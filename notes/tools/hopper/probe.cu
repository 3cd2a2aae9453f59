// Probe: one warpgroup computes C (64 x 64, f32) = A (64 x 64) B^T, A and B bf16 K-major, loaded by TMA with
// 128-byte swizzle and multiplied by wgmma.m64n64k16 from shared-memory descriptors. Checks against the CPU.
#include <cmath>
#include <vector>

#include "ptx.cuh"

constexpr int M = 64, N = 64, K = 64;

__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

__global__ void __launch_bounds__(128) probe_kernel(const __grid_constant__ CUtensorMap map_a,
                                                    const __grid_constant__ CUtensorMap map_b, float* c) {
  __shared__ alignas(1024) __nv_bfloat16 a_tile[M * K];
  __shared__ alignas(1024) __nv_bfloat16 b_tile[N * K];
  __shared__ alignas(8) uint64_t bar;
  mbar_init_for_block(&bar, 1);
  if (threadIdx.x == 0) {
    mbar_expect_tx(&bar, (M + N) * K * 2);
    tma_load_2d(a_tile, &map_a, 0, 0, &bar);
    tma_load_2d(b_tile, &map_b, 0, 0, &bar);
  }
  while (!mbar_try_wait(&bar, 0)) {
  }
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0.0f;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int k = 0; k < K / 16; ++k)  // 16 bf16 = 32 bytes along K inside the swizzled 128-byte row
    wgmma_m64n64k16(d, desc_sw128(a_tile) + (k * 32 >> 4), desc_sw128(b_tile) + (k * 32 >> 4), 1);
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  // accumulator layout: warp w rows 16w..16w+15; per n8 chunk j: d[4j + r], row 16w + lane/4 + 8 (r/2),
  // column 8j + 2 (lane % 4) + r % 2
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = 0; j < N / 8; ++j)
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * warp + lane / 4 + 8 * (r / 2), col = 8 * j + 2 * (lane % 4) + r % 2;
      c[row * N + col] = d[4 * j + r];
    }
}

int main() {
  std::vector<__nv_bfloat16> a(M * K), b(N * K);
  std::vector<float> af(M * K), bf(N * K);
  srand(1);
  for (int i = 0; i < M * K; ++i) { a[i] = __float2bfloat16((rand() % 17 - 8) / 8.0f); af[i] = __bfloat162float(a[i]); }
  for (int i = 0; i < N * K; ++i) { b[i] = __float2bfloat16((rand() % 13 - 6) / 4.0f); bf[i] = __bfloat162float(b[i]); }
  __nv_bfloat16 *da, *db; float* dc;
  CHECK(cudaMalloc(&da, M * K * 2)); CHECK(cudaMalloc(&db, N * K * 2)); CHECK(cudaMalloc(&dc, M * N * 4));
  CHECK(cudaMemcpy(da, a.data(), M * K * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), N * K * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dc, 0xff, M * N * 4));
  PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
  CUtensorMap ma, mb;
  for (int which = 0; which < 2; ++which) {
    cuuint64_t dims[2] = {K, (cuuint64_t)(which ? N : M)}, strides[1] = {K * 2};
    cuuint32_t box[2] = {64, 64}, estr[2] = {1, 1};
    CUresult r = encode(which ? &mb : &ma, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, which ? (void*)db : (void*)da, dims,
                        strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { printf("encode failed %d\n", (int)r); return 1; }
  }
  probe_kernel<<<1, 128>>>(ma, mb, dc);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> c(M * N);
  CHECK(cudaMemcpy(c.data(), dc, M * N * 4, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0;
      for (int k = 0; k < K; ++k) ref += (double)af[i * K + k] * bf[j * K + k];
      worst = fmax(worst, fabs(ref - c[i * N + j]));
    }
  printf("probe wgmma+tma: max |C - ref| = %g (%s)\n", worst, worst < 1e-3 ? "OK" : "WRONG");
  return worst < 1e-3 ? 0 : 2;
}
