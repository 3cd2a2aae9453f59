// The TMA tensor maps of task 4's Hopper part (kernels/attention_hopper.cu, steps 17-22), made by its binding: the
// driver's cuTensorMapEncodeTiled (a kernel file may not call the driver). CUDA 12
// or newer (the binding includes this only there).
#pragma once

#include <ATen/ATen.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled: the driver function that makes a TMA tensor map

#include <cstdint>

#include "checks.h"
#include "device/params.h"

// A TMA tensor map of t, (batch, heads, seq, head_dim) contiguous, 16-byte aligned, head_dim a multiple of 8 (TMA's
// strides are multiples of 16 bytes): device/params.h says what it describes.
inline CUtensorMap tensor_map(const torch::Tensor& t, const char* name, cuuint32_t box_rows) {
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                             &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    TORCH_CHECK(err == cudaSuccess && found == cudaDriverEntryPointSuccess && fn != nullptr,
                "the CUDA driver has no cuTensorMapEncodeTiled (it needs a driver for CUDA 12 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const cuuint64_t head_dim = t.size(3), seq = t.size(2);
  const cuuint64_t dims[3] = {head_dim, seq, (cuuint64_t)(t.size(0) * t.size(1))};
  const cuuint64_t strides[2] = {head_dim * 2, seq * head_dim * 2};  // bytes, of dims 1 and 2
  const cuuint32_t box[3] = {HOPPER_BOX_COLS, box_rows, 1}, steps[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult result = encode(&map, t.scalar_type() == torch::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                                 3, t.data_ptr(), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(result == CUDA_SUCCESS, "cuTensorMapEncodeTiled refused ", name, " ", shape(t), " (CUresult ",
              num(result), ")");
  return map;
}

