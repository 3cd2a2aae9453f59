// Given: not graded; edits here are not submitted. Task 5 binding: checks the tensors, `pos`
// and `length`, then hands raw pointers to the launchers in kernels/decode.cu (or
// solution/kernels/decode.cu) on PyTorch's current stream. A kernel never receives a
// position outside the cache: every write and read it is asked for lands inside it.

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>

#include "../common/csrc/checks.h"

// Defined in kernels/decode.cu. The cache is (batch, kv_heads, max_seq, head_dim); q and
// out are (batch, heads, head_dim), heads a multiple of kv_heads; k_new and v_new (batch *
// kv_heads, n_new, head_dim). All contiguous float32 on the device; key_start nullptr or
// (batch,) int32. Each returns the cudaError_t of its launch.
cudaError_t update_cache(const float* k_new, const float* v_new, float* k_cache, float* v_cache,
                         int batch_heads, int n_new, int max_seq, int head_dim, int pos,
                         cudaStream_t stream);
cudaError_t decode_forward(const float* q, const float* k_cache, const float* v_cache, float* out, int batch,
                           int heads, int kv_heads, const int* key_start, int max_seq, int length, int head_dim,
                           float scale, cudaStream_t stream);
cudaError_t decode_split_forward(const float* q, const float* k_cache, const float* v_cache, float* out, int batch,
                                 int heads, int kv_heads, const int* key_start, int max_seq, int length,
                                 int head_dim, float scale, int splits, float* partial_out, float* partial_lse,
                                 cudaStream_t stream);
int decode_splits(int batch, int heads, int kv_heads, int length, int head_dim);
int decode_max_head_dim();
int decode_max_splits();

namespace {

// k_cache and v_cache: (batch, kv_heads, max_seq, head_dim), the same shape, on one device.
void check_cache(const torch::Tensor& k_cache, const torch::Tensor& v_cache) {
  check_cuda_float32(k_cache, "k_cache");
  check_dim(k_cache, "k_cache", 4);
  check_not_empty(k_cache, "k_cache");
  check_cuda_float32(v_cache, "v_cache");
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "v_cache must have k_cache's shape ", shape(k_cache),
              " (batch, kv_heads, max_seq, head_dim), got ", shape(v_cache));
  check_same_device(v_cache, "v_cache", k_cache, "k_cache");
  TORCH_CHECK(!overlaps(k_cache, v_cache), "k_cache and v_cache must not share memory");
  const int64_t head_dim = k_cache.size(3), max_head_dim = decode_max_head_dim();
  TORCH_CHECK(head_dim <= max_head_dim, "head_dim (k_cache.size(3)) must be at most ", num(max_head_dim),
              ", got ", num(head_dim));
  check_fits_int(k_cache.size(0) * k_cache.size(1), "batch * heads");
  check_fits_int(k_cache.size(2) * head_dim, "max_seq * head_dim (one head's cache)");
}

// t must be (batch, heads, rows, head_dim) with the cache's batch, heads and head_dim.
void check_matches_cache(const torch::Tensor& t, const char* name, const torch::Tensor& k_cache,
                         const char* what) {
  check_cuda_float32(t, name);
  check_dim(t, name, 4);
  TORCH_CHECK(t.size(0) == k_cache.size(0) && t.size(1) == k_cache.size(1) && t.size(3) == k_cache.size(3),
              name, " must be ", what, " with the cache's batch, heads and head_dim (k_cache is ",
              shape(k_cache), "), got ", shape(t));
  check_same_device(t, name, k_cache, "k_cache");
}

}  // namespace

// Writes k_new and v_new, (batch, heads, n_new, head_dim), at positions pos .. pos + n_new - 1.
void update(const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache,
            torch::Tensor& v_cache, int64_t pos) {
  check_cache(k_cache, v_cache);
  check_matches_cache(k_new, "k_new", k_cache, "(batch, kv_heads, n_new, head_dim)");
  TORCH_CHECK(v_new.sizes() == k_new.sizes(), "v_new must have k_new's shape ", shape(k_new), ", got ",
              shape(v_new));
  check_matches_cache(v_new, "v_new", k_cache, "(batch, kv_heads, n_new, head_dim)");
  const int64_t n_new = k_new.size(2), max_seq = k_cache.size(2);
  TORCH_CHECK(n_new >= 1, "k_new must hold at least one new position (k_new.size(2) >= 1), got shape ",
              shape(k_new));
  TORCH_CHECK(pos >= 0, "pos must be at least 0, got ", num(pos));
  TORCH_CHECK(pos + n_new <= max_seq, "pos + n_new must be at most max_seq: the cache holds ", num(max_seq),
              " positions, and writing ", num(n_new), " at pos ", num(pos), " would end at ", num(pos + n_new));
  for (const auto* t : {&k_new, &v_new}) {
    const char* name = t == &k_new ? "k_new" : "v_new";
    check_no_overlap(k_cache, "k_cache", *t, name);
    check_no_overlap(v_cache, "v_cache", *t, name);
  }
  const c10::cuda::CUDAGuard guard(k_cache.device());
  check_launch(update_cache(k_new.data_ptr<float>(), v_new.data_ptr<float>(), k_cache.data_ptr<float>(),
                            v_cache.data_ptr<float>(), (int)(k_cache.size(0) * k_cache.size(1)), (int)n_new,
                            (int)max_seq, (int)k_cache.size(3), (int)pos, at::cuda::getCurrentCUDAStream()),
               "update_cache");
}

// out = softmax(scale * q K[key_start:length]^T) V[key_start:length] for q, out (batch, heads, 1,
// head_dim) and the cache (batch, kv_heads, max_seq, head_dim), heads a multiple of kv_heads.
// splits: 1 runs decode_forward (one block per (batch, kv_head) and group of query heads);
// more runs the split-KV kernels with that many splits; 0 lets decode_splits choose.
// key_start: none, or (batch,) int32, each sequence's first valid position (left padding).
void decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            torch::Tensor& out, int64_t length, double scale, int64_t splits,
            const std::optional<torch::Tensor>& key_start) {
  check_cache(k_cache, v_cache);
  check_cuda_float32(q, "q");
  check_dim(q, "q", 4);
  TORCH_CHECK(q.size(0) == k_cache.size(0) && q.size(3) == k_cache.size(3),
              "q must be (batch, heads, 1, head_dim) with the cache's batch and head_dim (k_cache is ",
              shape(k_cache), "), got ", shape(q));
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k_cache.size(1);
  TORCH_CHECK(heads % kv_heads == 0, "the cache's heads (kv_heads = k_cache.size(1)) must divide q's heads: ",
              "each group of heads / kv_heads query heads shares one key/value head; got heads = ", num(heads),
              " and kv_heads = ", num(kv_heads));
  check_same_device(q, "q", k_cache, "k_cache");
  TORCH_CHECK(q.size(2) == 1, "q must hold one query per (batch, head) (q.size(2) == 1), got shape ",
              shape(q));
  check_cuda_float32(out, "out");
  TORCH_CHECK(out.sizes() == q.sizes(), "out must have q's shape ", shape(q), ", got ", shape(out));
  check_same_device(out, "out", q, "q");
  const int64_t max_seq = k_cache.size(2);
  TORCH_CHECK(length >= 1 && length <= max_seq, "length must be between 1 and max_seq = ", num(max_seq),
              " (the positions of the cache written so far), got ", num(length));
  const int64_t max_splits = decode_max_splits();
  TORCH_CHECK(splits >= 0 && splits <= max_splits, "splits must be between 0 (let the launcher choose) and ",
              num(max_splits), ", got ", num(splits));
  TORCH_CHECK(std::isfinite(scale), "scale must be finite, got ", std::to_string(scale));
  check_no_overlap(out, "out", q, "q");
  check_no_overlap(out, "out", k_cache, "k_cache");
  check_no_overlap(out, "out", v_cache, "v_cache");
  check_fits_int(batch * heads, "batch * heads");

  const int head_dim = (int)k_cache.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  // The newest position is the query's own key, so it is never padding: key_start < length.
  const int* first_key = check_key_start(key_start, batch, length - 1, "length - 1", q, "q");
  if (q.numel() == 0) return;  // no query heads: nothing to do
  if (splits == 0) {
    splits = decode_splits((int)batch, (int)heads, (int)kv_heads, (int)length, head_dim);
    TORCH_CHECK(splits >= 1 && splits <= max_splits, "decode_splits returned ", num(splits),
                "; it must return between 1 and ", num(max_splits));
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (splits == 1) {
    check_launch(decode_forward(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                                out.data_ptr<float>(), (int)batch, (int)heads, (int)kv_heads, first_key,
                                (int)max_seq, (int)length, head_dim, (float)scale, stream),
                 "decode_forward");
    return;
  }
  // The partials live on the stream until the combining kernel has read them: the caching
  // allocator hands this memory out again only to work queued after it on this stream.
  auto partial_out = torch::empty({batch * heads, splits, head_dim}, q.options());
  auto partial_lse = torch::empty({batch * heads, splits}, q.options());
  check_launch(decode_split_forward(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                                    out.data_ptr<float>(), (int)batch, (int)heads, (int)kv_heads, first_key,
                                    (int)max_seq, (int)length, head_dim, (float)scale, (int)splits,
                                    partial_out.data_ptr<float>(), partial_lse.data_ptr<float>(), stream),
               "decode_split_forward");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("update_cache", &update,
        "write k_new and v_new (batch, kv_heads, n_new, head_dim) into the caches (batch, kv_heads, max_seq, "
        "head_dim) at positions pos .. pos + n_new - 1",
        py::arg("k_new"), py::arg("v_new"), py::arg("k_cache"), py::arg("v_cache"), py::arg("pos"));
  m.def("decode", &decode,
        "out = softmax(scale * q K^T) V over positions key_start .. length - 1 of the cache, read in place; q and "
        "out are (batch, heads, 1, head_dim), the caches (batch, kv_heads, max_seq, head_dim) with kv_heads "
        "dividing heads; splits: 1 = no split, 0 = the launcher's choice, more = split-KV with that many "
        "splits; key_start (optional, int32 (batch,)): each sequence's first valid position",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("out"), py::arg("length"), py::arg("scale"),
        py::arg("splits") = 0, py::arg("key_start") = py::none());
  m.def("splits_for", &decode_splits, "the number of splits the launcher chooses", py::arg("batch"),
        py::arg("heads"), py::arg("kv_heads"), py::arg("length"), py::arg("head_dim"));
  m.def("max_head_dim", &decode_max_head_dim, "the largest head_dim the kernels support");
  m.def("max_splits", &decode_max_splits, "the most splits the split-KV kernels take");
}
