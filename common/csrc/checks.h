// Input validation shared by every task's binding.
//
// The kernels in taskN/kernels/*.cu take raw pointers and trust them; the binding
// is the only place that sees torch tensors, so it checks everything here and a
// student's kernel never receives a tensor it was not written for.
#pragma once

#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include <string>

// Each check names the argument, so the Python error says exactly what is wrong.
inline void check_cuda_float32(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got a tensor on ", t.device(),
              " (move it with .cuda())");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32, got ", t.scalar_type(),
              " (this course's kernels work in float32)");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (call .contiguous() first)");
}

inline void check_dim(const torch::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, got shape ", t.sizes());
}

inline void check_same_device(const torch::Tensor& a, const char* a_name, const torch::Tensor& b,
                              const char* b_name) {
  TORCH_CHECK(a.device() == b.device(), a_name, " is on ", a.device(), " but ", b_name, " is on ",
              b.device());
}

// Every launcher returns the cudaError_t of its launch; this turns it into a Python error.
inline void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed to launch: ", cudaGetErrorString(err));
}
