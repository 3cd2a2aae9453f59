// The device library: what the kit's kernel files share (README, "The device library").
//
// A kernel file includes these headers as "device/NAME.cuh" (nvcc is given -I common/csrc). They are given
// code, the same for every student: the kernels' steps stay in the files you write. The kernel rules
// (common/kernel_rules.py) allow these headers and the CUDA toolkit's, besides your own kernels folder.
//
// common.cuh: constants and launch helpers every kernel file uses.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

// log2(e): exp(x) = exp2(x * log2(e)). Folding it into the scale turns every exponential into one exp2f,
// the operation the hardware has; LN2 turns a log2 back into a natural log.
constexpr int WARP = 32;  // threads of a warp

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The one place that lists the head_dim widths the attention kernels are compiled for, 32, 64, 80, 96 and
// 128: calls launch_for with the smallest width D >= head_dim, as a compile-time constant
// (std::integral_constant<int, D>), so each width is its own kernel whose loops over the head dimension the
// compiler unrolls, and a head_dim of 72 pays for 80, not 128. The caller checks head_dim <= 128 first.
constexpr int HEAD_DIM_TILE_MAX = 128;

template <typename LaunchFor>
static cudaError_t with_head_dim_tile(int head_dim, LaunchFor launch_for) {
  if (head_dim <= 32) return launch_for(std::integral_constant<int, 32>());
  if (head_dim <= 64) return launch_for(std::integral_constant<int, 64>());
  if (head_dim <= 80) return launch_for(std::integral_constant<int, 80>());
  if (head_dim <= 96) return launch_for(std::integral_constant<int, 96>());
  return launch_for(std::integral_constant<int, HEAD_DIM_TILE_MAX>());
}
