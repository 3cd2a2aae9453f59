// The device library (see common.cuh): the Ampere instructions task 4's 16-bit kernel
// (kernels/attention_half.cu) is built on, each wrapped in a function that says what it does: the warp-wide
// tensor-core product (mma.sync), the loads of its operands from shared memory (ldmatrix), the asynchronous
// copies from global to shared memory (cp.async), and the special function unit's 2^x.
// PTX ISA: "Warp Level Matrix Multiply-Accumulate Instructions" (mma.m16n8k16, ldmatrix) and "cp.async".
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

// The instructions below need sm_80 (Ampere) or newer. Built for an older GPU they compile to a trap, and the
// kernel is never launched there: the binding checks the GPU's compute capability first.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define OLDER_THAN_AMPERE 1
#endif

// d (16x8, f32) += a (16x16) b (16x8), a row-major, b column-major: one warp, 4 + 2 + 4 registers.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef OLDER_THAN_AMPERE
  __trap();
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 2^x on the special function unit, denormal results flushed to zero (exp2f adds instructions for them:
// this is one per element of S, the softmax's costliest step).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Four 8x8 matrices of 16-bit values from shared memory: lane l gives the address of row l % 8 of
// matrix l / 8, and gets, of each matrix, row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (.trans: of
// the transposed matrix).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#ifdef OLDER_THAN_AMPERE
  (void)row;
  __trap();
#else
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#ifdef OLDER_THAN_AMPERE
  (void)row;
  __trap();
#else
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
#endif
}

// 16 bytes global -> shared without passing through registers; src_bytes < 16 fills the rest with
// zeros (0: a row past the end of the keys, or columns past head_dim).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
#ifdef OLDER_THAN_AMPERE
  (void)dst, (void)src, (void)src_bytes;
  __trap();
#else
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src), "r"(src_bytes));
#endif
}
#ifdef OLDER_THAN_AMPERE
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
#else
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif
