// The device library (see common.cuh): the Hopper instructions task 4's Hopper kernel (kernels/attention_hopper.cu,
// steps 17-22) is built on, each wrapped in a function that says what it does: the mbarrier (a barrier in shared
// memory that counts arrivals and bytes), the Tensor Memory Accelerator's tile copy (TMA, completing on an
// mbarrier), the shared-memory matrix descriptor of the 128-byte swizzle, the warpgroup's asynchronous product
// (wgmma.mma_async) with its fence, commit and wait, the register reallocation between warpgroups (setmaxnreg) and
// the named barriers two warpgroups take turns with.
// PTX ISA: "Parallel Synchronization and Communication Instructions: mbarrier", "Data Movement and Conversion
// Instructions: cp.async.bulk.tensor", "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions".
// wgmma and setmaxnreg exist for the target sm_90a alone: a file including this says `// nvcc target: sm_90a`.
#pragma once

#include <cuda.h>  // CUtensorMap: the binding makes the tensor maps (cuTensorMapEncodeTiled), the kernel uses them
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

// An address in shared memory as the instructions below take it: 32 bits, in the shared window.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier: a 64-bit barrier in shared memory. A phase completes when `count` threads have arrived and every
// byte announced by expect_bytes has landed; phases alternate parity 0, 1, 0, ... and a wait names the parity.

// Thread 0 sets up `n` barriers, each expecting `count` arrivals a phase; every thread of the block sees them set
// up before it goes on (the fence makes the initialisation visible to TMA, which arrives from outside the threads).
__device__ __forceinline__ void mbarrier_init_all(uint64_t* bars, int n, int count) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < n; ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bars + i)), "r"(count));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// One arrival that also announces `bytes` to come (the TMA copies that complete on this barrier count them down).
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// One arrival, nothing announced: a consumer saying it is done with a stage.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

// Whether the phase of parity `parity` has completed; the hardware suspends the thread a while before it says no.
__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* bar, int parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(smem_address(bar)), "r"(parity) : "memory");
  return done;
}

// Wait until the phase of parity `parity` has completed. A phase that never completes (a copy never issued, bytes
// announced that never come, the wrong parity) would hang the GPU: after MBARRIER_PATIENCE clocks (about 4 seconds)
// the kernel traps instead, and the launch fails with "unspecified launch failure" (README, Task 4, step 17).
constexpr long long MBARRIER_PATIENCE = 8ll << 30;
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, int parity) {
  if (mbarrier_try_wait(bar, parity)) return;
  const long long start = clock64();
  while (!mbarrier_try_wait(bar, parity))
    if (clock64() - start > MBARRIER_PATIENCE) {
      __trap();
      return;  // never reached; without it ptxas (CUDA 13.0) spilled step 21's loop and serialized its wgmma's
    }
}

// ---- TMA: one thread copies a whole box of a tensor from global to shared memory; the copy's bytes complete on
// `bar`. `map` (made by the binding) says the tensor's shape, strides, box and swizzle; (x, y, z) is the box's first
// element, innermost first (here: column, row, batch * head). Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_box(void* dst, const CUtensorMap* map, int x, int y, int z, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
      ::"r"(smem_address(dst)), "l"(map), "r"(x), "r"(y), "r"(z), "r"(smem_address(bar)) : "memory");
}

// ---- The shared-memory matrix descriptor (64 bits; addresses and offsets in 16-byte units) of a tile TMA wrote
// with the 128-byte swizzle: rows of 128 bytes (64 16-bit values), 8-row groups `stride` bytes apart (1024 when
// they follow each other). `leading` is the byte offset between 64-element panels along the product's N: used when
// wgmma reads the tile transposed (V in O += P V), ignored otherwise. README, Task 4, step 18.
__device__ __forceinline__ uint64_t swizzled_tile(const void* tile, uint32_t leading = 16, uint32_t stride = 1024) {
  const uint64_t start = smem_address(tile);
  return ((start & 0x3FFFF) >> 4) | (uint64_t((leading >> 4) & 0x3FFF) << 16) |
         (uint64_t((stride >> 4) & 0x3FFF) << 32) | (1ull << 62);  // bits 62-63: 1, the 128-byte swizzle
}

// ---- wgmma: the four warps of a warpgroup compute D (64 x N, float32) += A (64 x 16) B (16 x N) together,
// asynchronously. The accumulator of m64nN: warp w holds rows 16w .. 16w + 15; register 4j + r of a lane holds row
// lane / 4 + 8 (r / 2), column 8j + 2 (lane % 4) + r % 2 (mma.sync's C fragment of steps 8-11, once per 8 columns).

// Before the first wgmma that reads registers another instruction wrote (the accumulator, P).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// The wgmmas issued since the last commit become one group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Wait until at most `PENDING` groups are still running (groups complete in the order they were committed).
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(PENDING) : "memory");
}
// Registers a wgmma reads or writes, pinned in place: the compiler must not move a read of the accumulator above
// the wait that makes it ready, nor a write below the wgmma that reads it (neither asm names the other's
// registers). Call it on the accumulator after wgmma_wait, and on both operands before the wgmma.
template <int N>
__device__ __forceinline__ void pin_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin_registers(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// The accumulator's registers as asm operands, eight at a time, and their names in the instruction.
#define KIT_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                    "+f"(d[i + 6]), "+f"(d[i + 7])
#define KIT_ACC32 KIT_ACC8(0), KIT_ACC8(8), KIT_ACC8(16), KIT_ACC8(24)
#define KIT_ACC64 KIT_ACC32, KIT_ACC8(32), KIT_ACC8(40), KIT_ACC8(48), KIT_ACC8(56)
#define KIT_ACC96 KIT_ACC64, KIT_ACC8(64), KIT_ACC8(72), KIT_ACC8(80), KIT_ACC8(88)
#define KIT_NAMES32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KIT_NAMES64 KIT_NAMES32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
                    "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KIT_NAMES96 KIT_NAMES64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
// A and B both from shared memory, both K-major (16 values of k contiguous: Q and K as stored).
#define KIT_WGMMA_SS(N, TYPE, NAMES, A, B, KEEP, ACC)                                                             \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" KEEP ", 0;\n wgmma.mma_async.sync.aligned.m64n" #N          \
               "k16.f32." TYPE "." TYPE " {" NAMES "}, %" A ", %" B ", p, 1, 1, 0, 0;\n}\n"                        \
               : ACC : "l"(a), "l"(b), "r"(int(accumulate)))
// A from registers (4 per lane: the A fragment of mma.sync's m16n8k16, for each warp's 16 rows), B from shared
// memory read transposed (N-major: V as stored, keys along k).
#define KIT_WGMMA_RS_T(N, TYPE, NAMES, A, B, KEEP, ACC)                                                           \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" KEEP ", 0;\n wgmma.mma_async.sync.aligned.m64n" #N          \
               "k16.f32." TYPE "." TYPE " {" NAMES "}, {" A "}, %" B ", p, 1, 1, 1;\n}\n"                         \
               : ACC : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)))

// d (64 x N) = (accumulate ? d : 0) + A B^T, A (64 x 16) and B (N x 16) 16-bit tiles in shared memory given by
// their descriptors; N = 128 or 192 (the keys of a K tile).
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(N == 128 || N == 192, "wgmma_ss: N is 128 or 192");
  if constexpr (N == 128 && std::is_same_v<T, __nv_bfloat16>)
    KIT_WGMMA_SS(128, "bf16", KIT_NAMES64, "64", "65", "66", KIT_ACC64);
  else if constexpr (N == 128)
    KIT_WGMMA_SS(128, "f16", KIT_NAMES64, "64", "65", "66", KIT_ACC64);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    KIT_WGMMA_SS(192, "bf16", KIT_NAMES96, "96", "97", "98", KIT_ACC96);
  else
    KIT_WGMMA_SS(192, "f16", KIT_NAMES96, "96", "97", "98", KIT_ACC96);
}

// d (64 x N) += A B, A (64 x 16) from registers, B (16 x N) read transposed from shared memory; N = 64 or 128.
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs_transposed(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b,
                                                    bool accumulate = true) {
  static_assert(N == 64 || N == 128, "wgmma_rs_transposed: N is 64 or 128");
  if constexpr (N == 64 && std::is_same_v<T, __nv_bfloat16>)
    KIT_WGMMA_RS_T(64, "bf16", KIT_NAMES32, "%32, %33, %34, %35", "36", "37", KIT_ACC32);
  else if constexpr (N == 64)
    KIT_WGMMA_RS_T(64, "f16", KIT_NAMES32, "%32, %33, %34, %35", "36", "37", KIT_ACC32);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    KIT_WGMMA_RS_T(128, "bf16", KIT_NAMES64, "%64, %65, %66, %67", "68", "69", KIT_ACC64);
  else
    KIT_WGMMA_RS_T(128, "f16", KIT_NAMES64, "%64, %65, %66, %67", "68", "69", KIT_ACC64);
}

// ---- setmaxnreg: a warpgroup gives registers back (the producer, which only issues copies) or takes them (the
// consumers, which hold the accumulators); every warp of the warpgroup calls it. REGISTERS is a multiple of 8.
template <int REGISTERS>
__device__ __forceinline__ void registers_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}
template <int REGISTERS>
__device__ __forceinline__ void registers_take() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}

// ---- Named barriers: 16 hardware barriers a block (id 0 is __syncthreads'), each completing when `threads` (a
// multiple of 32) have reached it, some waiting (sync) and some only announcing (arrive, which does not wait). Two
// warpgroups take turns with two of them: each waits on its own before its turn and arrives on the other's after.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
