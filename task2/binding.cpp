// Given: not graded; edits here are not submitted. Python bindings for task 2.
//
// The same file is built against task2/kernels/attention.cu (your kernels) and against
// task2/solution/kernels/attention.cu (the reference) by python -m task2.compile. It checks
// every tensor, then hands raw pointers to the launchers on PyTorch's current stream.
// All outputs are preallocated by the caller; nothing is returned.

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/types.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "../common/csrc/checks.h"
#include "../common/csrc/operators.h"

// The launchers, defined in kernels/attention.cu.
cudaError_t softmax_forward(const float* in, float* out, int rows, int cols, cudaStream_t stream);
cudaError_t gemm_nt(const float* a, const float* b, float* c, int batch, int m, int n, int k,
                    cudaStream_t stream);
cudaError_t gemm_nn(const float* a, const float* b, float* c, int batch, int m, int n, int k,
                    cudaStream_t stream);
cudaError_t attention_forward(const float* q, const float* k, const float* v, float* scores,
                              float* out, int batch_heads, int seq_q, int seq_k, int head_dim,
                              float scale, bool causal, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Checks specific to this task

namespace {

constexpr int64_t MAX_HEAD_DIM = 128;  // the limit of the fused kernels in the later tasks
// The GEMMs give each matrix of a batch one grid z index, and a grid has at most 65535 along z: a
// larger batch (batch * heads) is handed to the launchers in slices of that many matrices, each
// slice's pointers moved to its first matrix, so the kernels never see the difference.
constexpr int64_t MAX_GRID_Z = 65535;

// What every GEMM launch needs: int offsets inside a matrix.
void check_gemm_sizes(int64_t batch, int64_t m, int64_t n, int64_t k) {
  check_fits_int(m * k, "the number of elements of one (m, k) matrix");
  check_fits_int(n * k, "the number of elements of one (n, k) matrix");
  check_fits_int(m * n, "the number of elements of one (m, n) matrix");
}

}  // namespace

// ----------------------------------------------------------------------------
// Module functions

// x, out: (rows, cols). out may be x itself (the softmax works in place).
void softmax_op(const torch::Tensor& x, const torch::Tensor& out) {
  check_cuda_float32(x, "x");
  check_cuda_float32(out, "out");
  check_dim(x, "x", 2);
  check_dim(out, "out", 2);
  check_same_device(x, "x", out, "out");
  check_not_empty(x, "x");
  check_same_shape(out, "out", x, "x");
  TORCH_CHECK(out.data_ptr() == x.data_ptr() || !overlaps(out, x),
              "out must be x itself or not share memory with it");
  check_fits_int(x.size(0), "rows (x.size(0))");
  check_fits_int(x.size(1), "cols (x.size(1))");

  const c10::cuda::CUDAGuard guard(x.device());
  check_launch(softmax_forward(x.data_ptr<float>(), out.data_ptr<float>(), (int)x.size(0),
                               (int)x.size(1), c10::cuda::getCurrentCUDAStream()),
               "softmax_forward");
}

// a: (batch, m, k); c: (batch, m, n); b: (batch, n, k) for gemm_nt (c = a @ b^T, as in Q K^T)
// or (batch, k, n) for gemm_nn (c = a @ b, as in P V).
void gemm_op(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, bool nt) {
  check_cuda_float32(a, "a");
  check_cuda_float32(b, "b");
  check_cuda_float32(c, "c");
  check_dim(a, "a", 3);
  check_dim(b, "b", 3);
  check_dim(c, "c", 3);
  check_same_device(a, "a", b, "b");
  check_same_device(a, "a", c, "c");
  check_not_empty(a, "a");
  check_not_empty(b, "b");
  const int b_k = nt ? 2 : 1, b_n = nt ? 1 : 2;  // where b keeps k and n
  check_size(a, "a", 0, b, "b", 0, "batch");
  check_size(a, "a", 2, b, "b", b_k, "k");
  check_size(c, "c", 0, a, "a", 0, "batch");
  check_size(c, "c", 1, a, "a", 1, "m");
  check_size(c, "c", 2, b, "b", b_n, "n");
  check_no_overlap(c, "c", a, "a");
  check_no_overlap(c, "c", b, "b");
  const int64_t batch = a.size(0), m = a.size(1), n = b.size(b_n), k = a.size(2);
  check_gemm_sizes(batch, m, n, k);

  const c10::cuda::CUDAGuard guard(a.device());
  const auto launcher = nt ? gemm_nt : gemm_nn;
  for (int64_t first = 0; first < batch; first += MAX_GRID_Z) {
    const int64_t count = std::min(batch - first, MAX_GRID_Z);
    check_launch(launcher(a.data_ptr<float>() + first * m * k, b.data_ptr<float>() + first * n * k,
                          c.data_ptr<float>() + first * m * n, (int)count, (int)m, (int)n, (int)k,
                          c10::cuda::getCurrentCUDAStream()),
                 nt ? "gemm_nt" : "gemm_nn");
  }
}

// q: (batch, heads, seq_q, head_dim), k and v: (batch, heads, seq_k, head_dim), out like q.
// out = softmax(scale * q k^T [causal mask]) v, one head at a time.
void attention_op(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  const torch::Tensor& out, bool causal, double scale) {
  check_cuda_float32(q, "q");
  check_cuda_float32(k, "k");
  check_cuda_float32(v, "v");
  check_cuda_float32(out, "out");
  check_dim(q, "q", 4);
  check_dim(k, "k", 4);
  check_dim(v, "v", 4);
  check_dim(out, "out", 4);
  check_same_device(q, "q", k, "k");
  check_same_device(q, "q", v, "v");
  check_same_device(q, "q", out, "out");
  check_not_empty(q, "q");
  check_not_empty(k, "k");
  check_size(k, "k", 0, q, "q", 0, "batch");
  check_size(k, "k", 1, q, "q", 1, "heads");
  check_size(k, "k", 3, q, "q", 3, "head_dim");
  check_same_shape(v, "v", k, "k");
  check_same_shape(out, "out", q, "q");
  check_no_overlap(out, "out", q, "q");
  check_no_overlap(out, "out", k, "k");
  check_no_overlap(out, "out", v, "v");

  const int64_t batch_heads = q.size(0) * q.size(1);
  const int64_t seq_q = q.size(2), seq_k = k.size(2), head_dim = q.size(3);
  TORCH_CHECK(head_dim <= MAX_HEAD_DIM, "head_dim must be at most ", num(MAX_HEAD_DIM), ", got ",
              num(head_dim));
  TORCH_CHECK(!causal || seq_q <= seq_k, "causal attention needs seq_q <= seq_k, got seq_q = ",
              num(seq_q), " and seq_k = ", num(seq_k), " (the first queries would see no key at all)");
  TORCH_CHECK(std::isfinite(scale), "scale must be finite, got ", std::to_string(scale));
  check_fits_int(std::min(batch_heads, MAX_GRID_Z) * seq_q,
                 "heads * seq_q in one slice of at most 65535 heads (the softmax's rows)");
  check_fits_int(seq_q * seq_k, "seq_q * seq_k (one head's scores)");
  check_fits_int(seq_k * head_dim, "seq_k * head_dim (one head of k)");
  check_fits_int(seq_q * head_dim, "seq_q * head_dim (one head of q)");

  const c10::cuda::CUDAGuard guard(q.device());
  // (batch_heads, seq_q, seq_k): the attention matrix of every head, in global memory.
  torch::Tensor scores = torch::empty({batch_heads, seq_q, seq_k}, q.options());
  for (int64_t first = 0; first < batch_heads; first += MAX_GRID_Z) {  // slices of heads: see MAX_GRID_Z
    const int64_t count = std::min(batch_heads - first, MAX_GRID_Z);
    check_launch(attention_forward(q.data_ptr<float>() + first * seq_q * head_dim,
                                   k.data_ptr<float>() + first * seq_k * head_dim,
                                   v.data_ptr<float>() + first * seq_k * head_dim,
                                   scores.data_ptr<float>() + first * seq_q * seq_k,
                                   out.data_ptr<float>() + first * seq_q * head_dim, (int)count, (int)seq_q,
                                   (int)seq_k, (int)head_dim, (float)scale, causal,
                                   c10::cuda::getCurrentCUDAStream()),
                 "attention_forward");
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Task 2: attention from separate CUDA kernels (softmax, GEMM_NT, GEMM_NN)";
  m.def("softmax", &softmax_op, "out = softmax(x) along the last dimension; x, out: (rows, cols)",
        py::arg("x"), py::arg("out"));
  m.def("gemm_nt", [](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
          gemm_op(a, b, c, /*nt=*/true);
        }, "c = a @ b^T; a: (batch, m, k), b: (batch, n, k), c: (batch, m, n)",
        py::arg("a"), py::arg("b"), py::arg("c"));
  m.def("gemm_nn", [](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
          gemm_op(a, b, c, /*nt=*/false);
        }, "c = a @ b; a: (batch, m, k), b: (batch, k, n), c: (batch, m, n)",
        py::arg("a"), py::arg("b"), py::arg("c"));
  m.def("attention", &attention_op,
        "out = softmax(scale * q @ k^T, causal mask) @ v; q, out: (batch, heads, seq_q, head_dim), "
        "k, v: (batch, heads, seq_k, head_dim)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("causal"),
        py::arg("scale"));
}

// The same functions as operators: torch.ops.<this extension's name>.softmax(...) and the others. Each schema marks
// what the function writes (Tensor(a!)). softmax's operator form needs out apart from x: a schema cannot say "may
// be x itself", and one that wrote an input it does not mark would mislead torch.compile.
KIT_OPERATORS(m) {
  m.def("softmax(Tensor x, Tensor(a!) out) -> ()");
  m.def("gemm_nt(Tensor a, Tensor b, Tensor(a!) c) -> ()");
  m.def("gemm_nn(Tensor a, Tensor b, Tensor(a!) c) -> ()");
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor(a!) out, bool causal, float scale) -> ()");
}

void softmax_apart(const torch::Tensor& x, const torch::Tensor& out) {
  TORCH_CHECK(!overlaps(out, x), "out must not share memory with x in the operator form (the module's softmax "
              "takes out = x)");
  softmax_op(x, out);
}
void gemm_nt_op(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) { gemm_op(a, b, c, true); }
void gemm_nn_op(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) { gemm_op(a, b, c, false); }

void register_impls(torch::Library& m) {
  m.impl("softmax", &softmax_apart);
  m.impl("gemm_nt", &gemm_nt_op);
  m.impl("gemm_nn", &gemm_nn_op);
  m.impl("attention", &attention_op);
}

KIT_OPERATOR_IMPLS(register_impls)
