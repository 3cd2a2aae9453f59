// Input validation shared by every task's binding.
//
// The kernels in taskN/kernels/*.cu take raw pointers and trust them; the binding is
// the only place that sees torch tensors, so it checks everything here and a student's
// kernel never receives a tensor it was not written for. Every message names the
// argument and what was expected.
//
// Numbers and shapes go into messages as text made by std::to_string (num, shape),
// never streamed into TORCH_CHECK directly: TORCH_CHECK formats its arguments through a
// std::ostream, and on the course's GPU machines an integer or a shape formatted that
// way from inside an extension crashed the process (a segfault instead of the error;
// seen with torch 2.11 / CUDA 13, most likely a C++ runtime mismatch). Strings are safe.
#pragma once

#include <cuda_runtime_api.h>
// The few headers a binding uses (tensors, pybind11), not torch/extension.h: that one brings PyTorch's whole C++
// API and doubled each binding's compile (39 s against 21 s on one core), which every grading pays per CUDA task.
#include <torch/csrc/utils/pybind.h>
#include <torch/types.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>

inline std::string num(int64_t x) { return std::to_string(x); }

// A tensor type as Python names it (torch.bfloat16 -> "bfloat16"), for the 16-bit kernels' messages.
inline std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    default: return c10::toString(type);
  }
}

inline std::string shape(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

inline void check_cuda_float32(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device().str(),
              " (move it with .cuda())");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32, got ",
              c10::toString(t.scalar_type()), " (this course's kernels work in float32)");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (call .contiguous() first)");
}

inline void check_dim(const torch::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.dim() == dim, name, " must have ", num(dim), " dimensions, got shape ", shape(t));
}

inline void check_same_device(const torch::Tensor& a, const char* a_name, const torch::Tensor& b,
                              const char* b_name) {
  TORCH_CHECK(a.device() == b.device(), a_name, " is on ", a.device().str(), " but ", b_name,
              " is on ", b.device().str());
}

inline void check_not_empty(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.numel() > 0, name, " is empty (shape ", shape(t),
              "); every dimension must be at least 1");
}

// The kernels index with int: counts, and offsets inside one matrix, must fit in one.
inline void check_fits_int(int64_t value, const char* what) {
  TORCH_CHECK(value <= INT_MAX, what, " is ", num(value), ", more than the kernels' int indices hold (",
              num(INT_MAX), ")");
}

// a.size(a_dim) must equal b.size(b_dim); `what` names the dimension, e.g. "head_dim".
inline void check_size(const torch::Tensor& a, const char* a_name, int64_t a_dim, const torch::Tensor& b,
                       const char* b_name, int64_t b_dim, const char* what) {
  TORCH_CHECK(a.size(a_dim) == b.size(b_dim), a_name, " and ", b_name, " disagree on ", what, ": ",
              a_name, ".size(", num(a_dim), ") = ", num(a.size(a_dim)), " but ", b_name, ".size(",
              num(b_dim), ") = ", num(b.size(b_dim)));
}

inline void check_same_shape(const torch::Tensor& a, const char* a_name, const torch::Tensor& b,
                             const char* b_name) {
  TORCH_CHECK(a.sizes() == b.sizes(), a_name, " must have the same shape as ", b_name, ": got ",
              shape(a), " and ", shape(b));
}

// Both tensors are contiguous (checked first), so they share memory iff their byte ranges
// intersect. A kernel that reads `in` while writing `out` would read its own results.
inline bool overlaps(const torch::Tensor& a, const torch::Tensor& b) {
  const char* a_begin = static_cast<const char*>(a.data_ptr());
  const char* b_begin = static_cast<const char*>(b.data_ptr());
  return a_begin < b_begin + b.nbytes() && b_begin < a_begin + a.nbytes();
}

inline void check_no_overlap(const torch::Tensor& out, const char* out_name, const torch::Tensor& in,
                             const char* in_name) {
  TORCH_CHECK(!overlaps(out, in), out_name, " must not share memory with ", in_name,
              " (pass a separate output tensor)");
}

// Every launcher returns the cudaError_t of its launch; this turns it into a Python error.
inline void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed to launch: ", cudaGetErrorString(err));
}

// One int32 per sequence of the batch, (batch,), contiguous, on like's device: a position, a
// length or a first valid key held in GPU memory. `what` says what each value is. Only the
// tensor is checked here, not its values: reading them back would stop the GPU.
inline void check_per_sequence(const torch::Tensor& t, const char* name, const char* what, int64_t batch,
                               const torch::Tensor& like, const char* like_name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device().str());
  TORCH_CHECK(t.scalar_type() == torch::kInt32, name, " must be int32 (", what, " per sequence), got ",
              c10::toString(t.scalar_type()));
  TORCH_CHECK(t.dim() == 1 && t.size(0) == batch, name, " must have shape [", num(batch),
              "] (one value per sequence of the batch), got ", shape(t));
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (call .contiguous() first)");
  check_same_device(t, name, like, like_name);
}

// key_start: none, or each sequence's first valid key (a batch padded on the left), int32,
// (batch,), on like's device, every value between 0 and `most` (`most_what` says what that
// bound is). Returns the pointer the kernels take: nullptr for none. The values are read
// back to check them (one synchronisation): a kernel trusts them to stay inside the keys.
inline const int* check_key_start(const std::optional<torch::Tensor>& key_start, int64_t batch,
                                  int64_t most, const char* most_what, const torch::Tensor& like,
                                  const char* like_name) {
  if (!key_start.has_value()) return nullptr;
  const torch::Tensor& t = *key_start;
  check_per_sequence(t, "key_start", "one first valid key", batch, like, like_name);
  if (batch == 0) return t.data_ptr<int>();
  const torch::Tensor range = torch::stack({t.min(), t.max()}).cpu();
  const int64_t low = range[0].item<int>(), high = range[1].item<int>();
  TORCH_CHECK(low >= 0 && high <= most, "key_start must hold values between 0 and ", most_what, " = ",
              num(most), ", got values from ", num(low), " to ", num(high));
  return t.data_ptr<int>();
}
