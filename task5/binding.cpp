// Given: not graded; edits here are not submitted. Task 5 binding: checks the tensors, `pos`
// and `length`, then hands raw pointers to the launchers in kernels/decode.cu (or
// solution/kernels/decode.cu) on PyTorch's current stream.
//
// `pos` and `length` come in two forms. A Python int (the same for every sequence) is checked
// here, and so is key_start's every value: a kernel never receives a position outside the
// cache. An int32 tensor on the GPU, one value per sequence, is what a generation loop
// captured as a CUDA graph passes (its launches replay with the same arguments, so the values
// that change must be in memory): it is checked as a tensor, but its values are not read back,
// which would stop the GPU. The kernels check those where they read them.

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/types.h>

#include <cmath>
#include <cstdint>

#include "../common/csrc/checks.h"
#include "../common/csrc/device/params.h"
#include "../common/csrc/operators.h"

// Defined in kernels/decode.cu, each taking its parameters as one struct (common/csrc/device/params.h,
// which says what each field holds) and returning the cudaError_t of its launch. The tensors are checked
// here first: contiguous, on the device, float32 (int32 for pos, length, key_start and the block table).
cudaError_t update_cache(const CacheUpdateParams& p, cudaStream_t stream);  // contiguous, or paged (step 5)
cudaError_t decode_forward(const DecodeParams& p, cudaStream_t stream);     // any splits (step 3), paged or not
int decode_splits(int batch, int heads, int kv_heads, int max_length, int head_dim);
int decode_max_head_dim();
int decode_max_splits();
// Defined in kernels/decode_half.cu (optional, step 6): the cache update and the decode for bf16 or fp16
// tensors (p.bf16; every tensor of a call one type, but the partial outputs of a split decode, float32),
// contiguous or (step 7) paged. Weak: a build without that file still loads, and update_cache_half and decode_half
// then say the kernels are missing.
__attribute__((weak)) cudaError_t update_cache_half(const CacheUpdateParams& p, cudaStream_t stream);
__attribute__((weak)) cudaError_t decode_half_forward(const DecodeParams& p, cudaStream_t stream);
// Given (common/csrc/linear_rows.cu, compiled beside your kernels): y (rows, n) = x (rows, k) @ w^T, in float32
// or in bfloat16 (bf16: true) or float16.
cudaError_t linear_rows(const float* x, const float* w, float* y, int rows, int n, int k, cudaStream_t stream);
cudaError_t linear_rows_half(const void* x, const void* w, void* y, bool bf16, int rows, int n, int k,
                             cudaStream_t stream);
int linear_max_rows();

namespace {

// A tensor of the call: on the GPU, contiguous, and of the call's type: float32 (decode.cu's kernels), or the
// cache's bfloat16 or float16 (decode_half.cu's), which every other tensor of the call must share.
void check_typed(const torch::Tensor& t, const char* name, at::ScalarType type, const char* like = "k_cache") {
  if (type == torch::kFloat32) return check_cuda_float32(t, name);
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device().str(), " (move it with .cuda())");
  TORCH_CHECK(t.scalar_type() == type, name, " must be ", dtype_name(type), " like ", like, ", got ",
              dtype_name(t.scalar_type()));
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (call .contiguous() first)");
}

// The type of a call's tensors: float32 for decode.cu's kernels; for decode_half.cu's (half = true), the
// cache's bfloat16 or float16, once the build is known to hold them.
at::ScalarType cache_type(const torch::Tensor& k_cache, bool half) {
  if (!half) return torch::kFloat32;
  const auto type = k_cache.scalar_type();
  TORCH_CHECK(type == torch::kBFloat16 || type == torch::kHalf, "k_cache must be bfloat16 or float16 for the ",
              "16-bit cache (update_cache_half, decode_half), got ", dtype_name(type),
              " (a float32 cache goes to update_cache and decode)");
  TORCH_CHECK(update_cache_half != nullptr && decode_half_forward != nullptr,
              "this build has no bf16/fp16 cache kernels: task5/kernels/decode_half.cu is missing, did not compile, ",
              "or does not define update_cache_half and decode_half_forward with the signatures above (README, "
              "Task 5, step 6)");
  return type;
}

// k_cache and v_cache: (batch, kv_heads, max_seq, head_dim), the same shape, on one device.
void check_cache(const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                 at::ScalarType type = torch::kFloat32) {
  check_typed(k_cache, "k_cache", type);
  check_dim(k_cache, "k_cache", 4);
  check_not_empty(k_cache, "k_cache");
  check_typed(v_cache, "v_cache", type);
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
  check_typed(t, name, k_cache.scalar_type());
  check_dim(t, name, 4);
  TORCH_CHECK(t.size(0) == k_cache.size(0) && t.size(1) == k_cache.size(1) && t.size(3) == k_cache.size(3),
              name, " must be ", what, " with the cache's batch, heads and head_dim (k_cache is ",
              shape(k_cache), "), got ", shape(t));
  check_same_device(t, name, k_cache, "k_cache");
}

// k_new and v_new, (batch, kv_heads, n_new, head_dim), checked against the cache.
void check_new_rows(const torch::Tensor& k_new, const torch::Tensor& v_new, const torch::Tensor& k_cache,
                    const torch::Tensor& v_cache, at::ScalarType type = torch::kFloat32) {
  check_cache(k_cache, v_cache, type);
  check_matches_cache(k_new, "k_new", k_cache, "(batch, kv_heads, n_new, head_dim)");
  TORCH_CHECK(v_new.sizes() == k_new.sizes(), "v_new must have k_new's shape ", shape(k_new), ", got ",
              shape(v_new));
  check_matches_cache(v_new, "v_new", k_cache, "(batch, kv_heads, n_new, head_dim)");
  TORCH_CHECK(k_new.size(2) >= 1, "k_new must hold at least one new position (k_new.size(2) >= 1), got shape ",
              shape(k_new));
  TORCH_CHECK(k_new.size(2) <= k_cache.size(2), "k_new holds ", num(k_new.size(2)),
              " new positions, more than the cache's max_seq = ", num(k_cache.size(2)));
  for (const auto* t : {&k_new, &v_new}) {
    const char* name = t == &k_new ? "k_new" : "v_new";
    check_no_overlap(k_cache, "k_cache", *t, name);
    check_no_overlap(v_cache, "v_cache", *t, name);
  }
}

// The launch, once k_new, v_new and the cache are checked: pos is (batch,) ints in GPU memory.
void launch_update(const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache,
                   torch::Tensor& v_cache, const int* pos) {
  const c10::cuda::CUDAGuard guard(k_cache.device());
  CacheUpdateParams p;
  p.k_new = k_new.data_ptr(), p.v_new = v_new.data_ptr(), p.k_cache = k_cache.data_ptr(), p.v_cache = v_cache.data_ptr();
  p.bf16 = k_cache.scalar_type() == torch::kBFloat16;
  p.batch = (int)k_cache.size(0), p.kv_heads = (int)k_cache.size(1), p.n_new = (int)k_new.size(2);
  p.max_seq = (int)k_cache.size(2), p.head_dim = (int)k_cache.size(3), p.pos = pos;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (k_cache.scalar_type() != torch::kFloat32)  // checked by cache_type: bfloat16 or float16
    check_launch(update_cache_half(p, stream), "update_cache_half");
  else
    check_launch(update_cache(p, stream), "update_cache");
}

// Writes k_new and v_new at positions pos[b] .. pos[b] + n_new - 1 of each sequence b; pos is
// int32 (batch,) on the GPU. A sequence whose rows would not all fit writes nothing. half: the 16-bit cache.
void update_at(const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache,
               torch::Tensor& v_cache, const torch::Tensor& pos, bool half = false) {
  check_new_rows(k_new, v_new, k_cache, v_cache, cache_type(k_cache, half));
  check_per_sequence(pos, "pos", "the first new position", k_cache.size(0), k_cache, "k_cache");
  launch_update(k_new, v_new, k_cache, v_cache, pos.data_ptr<int>());
}

// The same at positions pos .. pos + n_new - 1 of every sequence, pos checked here.
void update(const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache,
            torch::Tensor& v_cache, int64_t pos, bool half = false) {
  check_new_rows(k_new, v_new, k_cache, v_cache, cache_type(k_cache, half));
  const int64_t n_new = k_new.size(2), max_seq = k_cache.size(2);
  TORCH_CHECK(pos >= 0, "pos must be at least 0, got ", num(pos));
  TORCH_CHECK(pos + n_new <= max_seq, "pos + n_new must be at most max_seq: the cache holds ", num(max_seq),
              " positions, and writing ", num(n_new), " at pos ", num(pos), " would end at ", num(pos + n_new));
  const torch::Tensor positions = torch::full({k_cache.size(0)}, pos, k_cache.options().dtype(torch::kInt32));
  launch_update(k_new, v_new, k_cache, v_cache, positions.data_ptr<int>());
}

// q and out (batch, heads, 1, head_dim) against a cache of `kv_heads` heads (k, v: the contiguous cache
// or the pages), splits and scale: every check of a decode but the cache's own and the lengths'.
void check_query(const torch::Tensor& q, const torch::Tensor& out, int64_t batch, const torch::Tensor& k,
                 const torch::Tensor& v, const char* k_name, const char* v_name, double scale, int64_t splits) {
  check_typed(q, "q", k.scalar_type(), k_name);
  check_dim(q, "q", 4);
  TORCH_CHECK(q.size(0) == batch && q.size(3) == k.size(3), "q must be (batch, heads, 1, head_dim) with the cache's ",
              "batch (", num(batch), ") and head_dim (", num(k.size(3)), "), got ", shape(q));
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  TORCH_CHECK(heads % kv_heads == 0, "the cache's heads (kv_heads = ", k_name, ".size(1)) must divide q's heads: ",
              "each group of heads / kv_heads query heads shares one key/value head; got heads = ", num(heads),
              " and kv_heads = ", num(kv_heads));
  check_same_device(q, "q", k, k_name);
  TORCH_CHECK(q.size(2) == 1, "q must hold one query per (batch, head) (q.size(2) == 1), got shape ",
              shape(q));
  check_typed(out, "out", k.scalar_type(), k_name);
  TORCH_CHECK(out.sizes() == q.sizes(), "out must have q's shape ", shape(q), ", got ", shape(out));
  check_same_device(out, "out", q, "q");
  const int64_t max_splits = decode_max_splits();
  TORCH_CHECK(splits >= 0 && splits <= max_splits, "splits must be between 0 (let the launcher choose) and ",
              num(max_splits), ", got ", num(splits));
  TORCH_CHECK(std::isfinite(scale), "scale must be finite, got ", std::to_string(scale));
  check_no_overlap(out, "out", q, "q");
  check_no_overlap(out, "out", k, k_name);
  check_no_overlap(out, "out", v, v_name);
  check_fits_int(q.size(0) * heads, "batch * heads");
}

void check_decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                  const torch::Tensor& out, double scale, int64_t splits, at::ScalarType type = torch::kFloat32) {
  check_cache(k_cache, v_cache, type);
  check_query(q, out, k_cache.size(0), k_cache, v_cache, "k_cache", "v_cache", scale, splits);
}

// The splits a decode runs with (0: decode_splits' choice for sequences up to max_length) and, with
// more than one, split-KV's partial outputs and log-sum-exps. They live on the stream until the
// combining kernel has read them: the caching allocator hands this memory out again only to work
// queued after it on this stream.
struct Partials {
  int64_t splits;
  torch::Tensor out, lse;
  float* out_ptr() { return splits > 1 ? out.data_ptr<float>() : nullptr; }
  float* lse_ptr() { return splits > 1 ? lse.data_ptr<float>() : nullptr; }
};

Partials partials_for(const torch::Tensor& q, int64_t kv_heads, int64_t max_length, int64_t head_dim,
                      int64_t splits) {
  const int64_t batch = q.size(0), heads = q.size(1);
  if (splits == 0) {
    const int64_t max_splits = decode_max_splits();
    splits = decode_splits((int)batch, (int)heads, (int)kv_heads, (int)max_length, (int)head_dim);
    TORCH_CHECK(splits >= 1 && splits <= max_splits, "decode_splits returned ", num(splits),
                "; it must return between 1 and ", num(max_splits));
  }
  if (splits == 1) return Partials{1, {}, {}};
  const auto options = q.options().dtype(torch::kFloat32);  // float32 for 16-bit queries too
  return Partials{splits, torch::empty({batch * heads, splits, head_dim}, options),
                  torch::empty({batch * heads, splits}, options)};
}

// What every decode's parameters hold: the tensors, the shapes, length and key_start ((batch,) ints in GPU
// memory; key_start may be nullptr), the scale and the splits.
DecodeParams decode_params(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& out,
                           const int* length, const int* key_start, double scale, Partials& partials) {
  DecodeParams p;
  p.q = q.data_ptr(), p.k_cache = k.data_ptr(), p.v_cache = v.data_ptr(), p.out = out.data_ptr();
  p.batch = (int)q.size(0), p.heads = (int)q.size(1), p.kv_heads = (int)k.size(1), p.head_dim = (int)k.size(3);
  p.length = length, p.key_start = key_start, p.scale = (float)scale;
  p.splits = (int)partials.splits, p.partial_out = partials.out_ptr(), p.partial_lse = partials.lse_ptr();
  return p;
}

// The launch, once everything is checked: length is (batch,) ints in GPU memory, max_length the
// longest any of them may be (the splits are chosen for it).
void run_decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                torch::Tensor& out, const int* length, int64_t max_length, const int* key_start, double scale,
                int64_t splits) {
  const c10::cuda::CUDAGuard guard(q.device());
  if (q.numel() == 0) return;  // no query heads: nothing to do
  Partials partials = partials_for(q, k_cache.size(1), max_length, k_cache.size(3), splits);
  DecodeParams p = decode_params(q, k_cache, v_cache, out, length, key_start, scale, partials);
  p.bf16 = q.scalar_type() == torch::kBFloat16;
  p.max_seq = (int)k_cache.size(2);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (q.scalar_type() != torch::kFloat32)  // checked by cache_type: bfloat16 or float16, like the cache
    check_launch(decode_half_forward(p, stream), "decode_half_forward");
  else
    check_launch(decode_forward(p, stream), "decode_forward");
}

// The type of a paged call's tensors: float32 for step 5's kernels (decode.cu); for step 7's (half = true,
// decode_half.cu), the pool's bfloat16 or float16, once the build is known to hold them.
at::ScalarType pages_type(const torch::Tensor& k_pages, bool half) {
  const auto type = k_pages.scalar_type();
  const bool sixteen = type == torch::kBFloat16 || type == torch::kHalf;
  if (!half) {
    TORCH_CHECK(!sixteen, "k_pages must be float32 for update_cache_paged and decode_paged, got ", dtype_name(type),
                " (a bfloat16 or float16 pool goes to update_cache_paged_half and decode_paged_half: README, Task 5, "
                "step 7)");
    return torch::kFloat32;
  }
  TORCH_CHECK(sixteen, "k_pages must be bfloat16 or float16 for the 16-bit paged cache (update_cache_paged_half, "
              "decode_paged_half), got ", dtype_name(type), " (a float32 pool goes to update_cache_paged and "
              "decode_paged)");
  return cache_type(k_pages, true);  // the build holds the 16-bit kernels
}

// The pools (num_pages, kv_heads, page_size, head_dim) of `type`, page_size a power of two, and the block
// table (batch, max_pages) int32 on their device (its values are the kernels' to check).
void check_pages(const torch::Tensor& k_pages, const torch::Tensor& v_pages, const torch::Tensor& table,
                 at::ScalarType type) {
  check_typed(k_pages, "k_pages", type, "k_pages");
  check_dim(k_pages, "k_pages", 4);
  check_not_empty(k_pages, "k_pages");
  check_typed(v_pages, "v_pages", type, "k_pages");
  TORCH_CHECK(v_pages.sizes() == k_pages.sizes(), "v_pages must have k_pages's shape ", shape(k_pages),
              " (num_pages, kv_heads, page_size, head_dim), got ", shape(v_pages));
  check_same_device(v_pages, "v_pages", k_pages, "k_pages");
  TORCH_CHECK(!overlaps(k_pages, v_pages), "k_pages and v_pages must not share memory");
  const int64_t page_size = k_pages.size(2), head_dim = k_pages.size(3);
  TORCH_CHECK((page_size & (page_size - 1)) == 0, "page_size (k_pages.size(2)) must be a power of two, got ",
              num(page_size));
  TORCH_CHECK(head_dim <= decode_max_head_dim(), "head_dim (k_pages.size(3)) must be at most ",
              num(decode_max_head_dim()), ", got ", num(head_dim));
  check_fits_int(k_pages.numel() / head_dim, "num_pages * kv_heads * page_size");
  TORCH_CHECK(table.is_cuda() && table.scalar_type() == torch::kInt32 && table.dim() == 2 && table.is_contiguous(),
              "block_table must be a contiguous int32 CUDA tensor (batch, max_pages), got ", shape(table), " ",
              c10::toString(table.scalar_type()), " on ", table.device().str());
  check_not_empty(table, "block_table");
  check_same_device(table, "block_table", k_pages, "k_pages");
  check_fits_int(table.size(1) * page_size, "max_pages * page_size (the positions a sequence can hold)");
}

}  // namespace

// Step 5 (optional): k_new, v_new (batch, kv_heads, n_new, head_dim) into the paged cache at positions
// pos[b] .. pos[b] + n_new - 1 of each sequence b (pos int32 (batch,) on the GPU): page
// block_table[b, p / page_size], row p % page_size. What would not fit, or names a page outside the
// pool, is not written. half: step 7's, a pool of bfloat16 or float16.
void update_paged_at(const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_pages,
                     torch::Tensor& v_pages, const torch::Tensor& block_table, const torch::Tensor& pos,
                     bool half = false) {
  const at::ScalarType type = pages_type(k_pages, half);
  check_pages(k_pages, v_pages, block_table, type);
  const int64_t batch = block_table.size(0);
  check_typed(k_new, "k_new", type, "k_pages");
  check_dim(k_new, "k_new", 4);
  TORCH_CHECK(k_new.size(0) == batch && k_new.size(1) == k_pages.size(1) && k_new.size(3) == k_pages.size(3),
              "k_new must be (batch, kv_heads, n_new, head_dim) with block_table's batch and the pages' kv_heads "
              "and head_dim (block_table is ", shape(block_table), ", k_pages ", shape(k_pages), "), got ",
              shape(k_new));
  check_typed(v_new, "v_new", type, "k_pages");
  TORCH_CHECK(v_new.sizes() == k_new.sizes(), "v_new must have k_new's shape ", shape(k_new), ", got ",
              shape(v_new));
  check_same_device(k_new, "k_new", k_pages, "k_pages");
  check_same_device(v_new, "v_new", k_pages, "k_pages");
  TORCH_CHECK(k_new.size(2) >= 1, "k_new must hold at least one new position, got shape ", shape(k_new));
  for (const auto* t : {&k_new, &v_new}) {
    const char* name = t == &k_new ? "k_new" : "v_new";
    check_no_overlap(k_pages, "k_pages", *t, name);
    check_no_overlap(v_pages, "v_pages", *t, name);
  }
  check_per_sequence(pos, "pos", "the first new position", batch, k_pages, "k_pages");
  const c10::cuda::CUDAGuard guard(k_pages.device());
  CacheUpdateParams p;
  p.k_new = k_new.data_ptr(), p.v_new = v_new.data_ptr(), p.k_cache = k_pages.data_ptr(), p.v_cache = v_pages.data_ptr();
  p.batch = (int)batch, p.kv_heads = (int)k_pages.size(1), p.n_new = (int)k_new.size(2), p.head_dim = (int)k_pages.size(3);
  p.pos = pos.data_ptr<int>();
  p.block_table = block_table.data_ptr<int>(), p.max_pages = (int)block_table.size(1);
  p.num_pages = (int)k_pages.size(0), p.page_size = (int)k_pages.size(2), p.max_seq = p.max_pages * p.page_size;
  p.bf16 = type == torch::kBFloat16;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (type != torch::kFloat32)
    check_launch(update_cache_half(p, stream), "update_cache_half (paged)");
  else
    check_launch(update_cache(p, stream), "update_cache (paged)");
}

// Step 5 (optional): decode over a paged cache, as decode with length int32 (batch,) on the GPU; the
// splits chosen for sequences up to max_pages * page_size positions. A sequence whose length or
// key_start is out of range, or whose table names a page outside the pool, gets NaN. half: step 7's, a
// pool of bfloat16 or float16 (q and out of its type).
void decode_paged(const torch::Tensor& q, const torch::Tensor& k_pages, const torch::Tensor& v_pages,
                  torch::Tensor& out, const torch::Tensor& block_table, const torch::Tensor& length, double scale,
                  int64_t splits, const std::optional<torch::Tensor>& key_start, bool half = false) {
  const at::ScalarType type = pages_type(k_pages, half);
  check_pages(k_pages, v_pages, block_table, type);
  const int64_t batch = block_table.size(0), kv_heads = k_pages.size(1);
  check_query(q, out, batch, k_pages, v_pages, "k_pages", "v_pages", scale, splits);
  check_per_sequence(length, "length", "the positions of the cache written so far", batch, q, "q");
  if (key_start.has_value()) check_per_sequence(*key_start, "key_start", "one first valid key", batch, q, "q");
  const int head_dim = (int)k_pages.size(3), page_size = (int)k_pages.size(2);
  const int max_pages = (int)block_table.size(1);
  const c10::cuda::CUDAGuard guard(q.device());
  if (q.numel() == 0) return;
  Partials partials = partials_for(q, kv_heads, (int64_t)max_pages * page_size, head_dim, splits);
  DecodeParams p = decode_params(q, k_pages, v_pages, out, length.data_ptr<int>(),
                                 key_start.has_value() ? key_start->data_ptr<int>() : nullptr, scale, partials);
  p.block_table = block_table.data_ptr<int>(), p.max_pages = max_pages, p.num_pages = (int)k_pages.size(0);
  p.page_size = page_size, p.max_seq = max_pages * page_size;
  p.bf16 = type == torch::kBFloat16;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (type != torch::kFloat32)
    check_launch(decode_half_forward(p, stream), "decode_half_forward (paged)");
  else
    check_launch(decode_forward(p, stream), "decode_forward (paged)");
}

// out = softmax(scale * q K[key_start[b]:length[b]]^T) V[key_start[b]:length[b]] for each sequence b,
// q and out (batch, heads, 1, head_dim), the cache (batch, kv_heads, max_seq, head_dim), heads a multiple
// of kv_heads. length: int32 (batch,) on the GPU, each sequence's positions written so far (values not
// read back: a sequence whose length or key_start is out of range gets NaN from the kernel).
// splits: 1 runs decode_forward (one block per (batch, kv_head) and group of query heads); more runs
// the split-KV kernels with that many splits; 0 lets decode_splits choose, for sequences up to max_seq.
// key_start: none, or (batch,) int32, each sequence's first valid position (left padding).
void decode_lengths(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                    torch::Tensor& out, const torch::Tensor& length, double scale, int64_t splits,
                    const std::optional<torch::Tensor>& key_start, bool half = false) {
  check_decode(q, k_cache, v_cache, out, scale, splits, cache_type(k_cache, half));
  check_per_sequence(length, "length", "the positions of the cache written so far", q.size(0), q, "q");
  if (key_start.has_value()) check_per_sequence(*key_start, "key_start", "one first valid key", q.size(0), q, "q");
  run_decode(q, k_cache, v_cache, out, length.data_ptr<int>(), k_cache.size(2),
             key_start.has_value() ? key_start->data_ptr<int>() : nullptr, scale, splits);
}

// The same with one length for every sequence, a Python int, checked here with key_start's values.
void decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            torch::Tensor& out, int64_t length, double scale, int64_t splits,
            const std::optional<torch::Tensor>& key_start, bool half = false) {
  check_decode(q, k_cache, v_cache, out, scale, splits, cache_type(k_cache, half));
  const int64_t max_seq = k_cache.size(2);
  TORCH_CHECK(length >= 1 && length <= max_seq, "length must be between 1 and max_seq = ", num(max_seq),
              " (the positions of the cache written so far), got ", num(length));
  // The newest position is the query's own key, so it is never padding: key_start < length.
  const c10::cuda::CUDAGuard guard(q.device());
  const int* key_start_data = check_key_start(key_start, q.size(0), length - 1, "length - 1", q, "q");
  const torch::Tensor lengths = torch::full({q.size(0)}, length, q.options().dtype(torch::kInt32));
  run_decode(q, k_cache, v_cache, out, lengths.data_ptr<int>(), length, key_start_data, scale, splits);
}

// Task 6's decode step: out = x @ weight^T for the few rows of a step (one token per sequence), the
// product nn.Linear computes, by the given kernel that streams the weight (common/csrc/linear_rows.cu). In
// float32, or in bfloat16 or float16 (a model in 16 bits), the weight's type, which x and out share.
void linear(const torch::Tensor& x, const torch::Tensor& weight, torch::Tensor& out) {
  TORCH_CHECK(weight.scalar_type() == torch::kFloat32 || weight.scalar_type() == torch::kBFloat16 ||
                  weight.scalar_type() == torch::kHalf,
              "weight must be float32, bfloat16 or float16, got ", dtype_name(weight.scalar_type()));
  const at::ScalarType type = weight.scalar_type();
  check_typed(weight, "weight", type);
  check_typed(x, "x", type, "weight");
  check_typed(out, "out", type, "weight");
  check_dim(x, "x", 2);
  check_dim(weight, "weight", 2);
  check_dim(out, "out", 2);
  check_same_device(x, "x", weight, "weight");
  check_same_device(x, "x", out, "out");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= linear_max_rows(), "x must hold 1 to ", num(linear_max_rows()),
              " rows (one token per sequence), got shape ", shape(x));
  check_size(weight, "weight", 1, x, "x", 1, "in_features");
  const int64_t per_load = 16 / (int64_t)x.element_size();  // the kernel reads 16 bytes at a time
  TORCH_CHECK(x.size(1) % per_load == 0, "in_features (x.size(1)) must be a multiple of ", num(per_load),
              " for ", dtype_name(type), " (the kernel reads 16 bytes at a time), got ", num(x.size(1)));
  TORCH_CHECK(out.size(0) == x.size(0) && out.size(1) == weight.size(0), "out must be (rows, out_features) = [",
              num(x.size(0)), ", ", num(weight.size(0)), "], got shape ", shape(out));
  check_not_empty(weight, "weight");
  check_fits_int(weight.size(0), "out_features (weight.size(0))");
  check_fits_int(weight.size(1), "in_features (weight.size(1))");
  for (const torch::Tensor* t : {&x, &weight, static_cast<const torch::Tensor*>(&out)})
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                "x, weight and out must start on a 16-byte boundary (the kernel reads 16 bytes at a time); a slice "
                "may not");
  check_no_overlap(out, "out", x, "x");
  check_no_overlap(out, "out", weight, "weight");
  const c10::cuda::CUDAGuard guard(x.device());
  const int rows = (int)x.size(0), n = (int)weight.size(0), k = (int)x.size(1);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (type == torch::kFloat32)
    check_launch(linear_rows(x.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), rows, n, k, stream),
                 "linear");
  else
    check_launch(linear_rows_half(x.data_ptr(), weight.data_ptr(), out.data_ptr(), type == torch::kBFloat16, rows, n,
                                  k, stream),
                 "linear");
}

// The paged functions as Python and operators call them: float32 (step 5), or 16-bit (step 7).
void update_paged_op(const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_pages,
                     torch::Tensor& v_pages, const torch::Tensor& block_table, const torch::Tensor& pos) {
  update_paged_at(k_new, v_new, k_pages, v_pages, block_table, pos);
}
void update_paged_half_op(const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_pages,
                          torch::Tensor& v_pages, const torch::Tensor& block_table, const torch::Tensor& pos) {
  update_paged_at(k_new, v_new, k_pages, v_pages, block_table, pos, true);
}
void decode_paged_op(const torch::Tensor& q, const torch::Tensor& k_pages, const torch::Tensor& v_pages,
                     torch::Tensor& out, const torch::Tensor& block_table, const torch::Tensor& length, double scale,
                     int64_t splits, const std::optional<torch::Tensor>& key_start) {
  decode_paged(q, k_pages, v_pages, out, block_table, length, scale, splits, key_start);
}
void decode_paged_half_op(const torch::Tensor& q, const torch::Tensor& k_pages, const torch::Tensor& v_pages,
                          torch::Tensor& out, const torch::Tensor& block_table, const torch::Tensor& length,
                          double scale, int64_t splits, const std::optional<torch::Tensor>& key_start) {
  decode_paged(q, k_pages, v_pages, out, block_table, length, scale, splits, key_start, true);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The tensor forms first: pybind11 tries overloads in order, and a one-element int tensor
  // would also pass as an int (read back to the host, which is what the tensor form avoids).
  const char* update_doc =
      "write k_new and v_new (batch, kv_heads, n_new, head_dim) into the caches (batch, kv_heads, max_seq, "
      "head_dim) at positions pos .. pos + n_new - 1; pos: an int, or int32 (batch,) on the GPU, one per sequence "
      "(a sequence whose rows would not fit writes nothing)";
  m.def(
      "update_cache",
      [](const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache, torch::Tensor& v_cache,
         const torch::Tensor& pos) { update_at(k_new, v_new, k_cache, v_cache, pos); },
      update_doc, py::arg("k_new"), py::arg("v_new"), py::arg("k_cache"), py::arg("v_cache"), py::arg("pos"));
  m.def(
      "update_cache",
      [](const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache, torch::Tensor& v_cache,
         int64_t pos) { update(k_new, v_new, k_cache, v_cache, pos); },
      update_doc, py::arg("k_new"), py::arg("v_new"), py::arg("k_cache"), py::arg("v_cache"), py::arg("pos"));
  const char* decode_doc =
      "out = softmax(scale * q K^T) V over positions key_start .. length - 1 of the cache, read in place; q and "
      "out are (batch, heads, 1, head_dim), the caches (batch, kv_heads, max_seq, head_dim) with kv_heads "
      "dividing heads; length: an int, or int32 (batch,) on the GPU, one per sequence (out of range: NaN); "
      "splits: 1 = no split, 0 = the launcher's choice, more = split-KV with that many splits; key_start "
      "(optional, int32 (batch,)): each sequence's first valid position";
  m.def(
      "decode",
      [](const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache, torch::Tensor& out,
         const torch::Tensor& length, double scale, int64_t splits, const std::optional<torch::Tensor>& key_start) {
        decode_lengths(q, k_cache, v_cache, out, length, scale, splits, key_start);
      },
      decode_doc, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("out"), py::arg("length"),
      py::arg("scale"), py::arg("splits") = 0, py::arg("key_start") = py::none());
  m.def(
      "decode",
      [](const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache, torch::Tensor& out,
         int64_t length, double scale, int64_t splits, const std::optional<torch::Tensor>& key_start) {
        decode(q, k_cache, v_cache, out, length, scale, splits, key_start);
      },
      decode_doc, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("out"), py::arg("length"),
      py::arg("scale"), py::arg("splits") = 0, py::arg("key_start") = py::none());
  // Step 6 (optional): the same for a cache of bfloat16 or float16, q, k_new, v_new and out of its type.
  const char* half_doc = "step 6 (optional): the same for a bfloat16 or float16 cache (every tensor of its type)";
  m.def(
      "update_cache_half",
      [](const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache, torch::Tensor& v_cache,
         const torch::Tensor& pos) { update_at(k_new, v_new, k_cache, v_cache, pos, true); },
      half_doc, py::arg("k_new"), py::arg("v_new"), py::arg("k_cache"), py::arg("v_cache"), py::arg("pos"));
  m.def(
      "update_cache_half",
      [](const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache, torch::Tensor& v_cache,
         int64_t pos) { update(k_new, v_new, k_cache, v_cache, pos, true); },
      half_doc, py::arg("k_new"), py::arg("v_new"), py::arg("k_cache"), py::arg("v_cache"), py::arg("pos"));
  m.def(
      "decode_half",
      [](const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache, torch::Tensor& out,
         const torch::Tensor& length, double scale, int64_t splits, const std::optional<torch::Tensor>& key_start) {
        decode_lengths(q, k_cache, v_cache, out, length, scale, splits, key_start, true);
      },
      half_doc, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("out"), py::arg("length"),
      py::arg("scale"), py::arg("splits") = 0, py::arg("key_start") = py::none());
  m.def(
      "decode_half",
      [](const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache, torch::Tensor& out,
         int64_t length, double scale, int64_t splits, const std::optional<torch::Tensor>& key_start) {
        decode(q, k_cache, v_cache, out, length, scale, splits, key_start, true);
      },
      half_doc, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("out"), py::arg("length"),
      py::arg("scale"), py::arg("splits") = 0, py::arg("key_start") = py::none());
  m.def("has_half", [] { return update_cache_half != nullptr && decode_half_forward != nullptr; },
        "whether this build holds the bf16/fp16 cache kernels (task5/kernels/decode_half.cu)");
  m.def("update_cache_paged", &update_paged_op,
        "step 5: write k_new and v_new (batch, kv_heads, n_new, head_dim) into the paged cache (num_pages, kv_heads, "
        "page_size, head_dim) at positions pos .. pos + n_new - 1 of each sequence (pos int32 (batch,) on the GPU), "
        "position p in page block_table[b, p / page_size]",
        py::arg("k_new"), py::arg("v_new"), py::arg("k_pages"), py::arg("v_pages"), py::arg("block_table"),
        py::arg("pos"));
  m.def("decode_paged", &decode_paged_op,
        "step 5: decode over the paged cache, as decode with length int32 (batch,) on the GPU",
        py::arg("q"), py::arg("k_pages"), py::arg("v_pages"), py::arg("out"), py::arg("block_table"),
        py::arg("length"), py::arg("scale"), py::arg("splits") = 0, py::arg("key_start") = py::none());
  const char* paged_half_doc = "step 7 (optional): the same for a pool of bfloat16 or float16 (every tensor of its "
                               "type but the block table and the int32 positions)";
  m.def("update_cache_paged_half", &update_paged_half_op, paged_half_doc, py::arg("k_new"), py::arg("v_new"),
        py::arg("k_pages"), py::arg("v_pages"), py::arg("block_table"), py::arg("pos"));
  m.def("decode_paged_half", &decode_paged_half_op, paged_half_doc, py::arg("q"), py::arg("k_pages"),
        py::arg("v_pages"), py::arg("out"), py::arg("block_table"), py::arg("length"), py::arg("scale"),
        py::arg("splits") = 0, py::arg("key_start") = py::none());
  m.def("splits_for", &decode_splits, "the number of splits the launcher chooses for sequences up to max_length",
        py::arg("batch"), py::arg("heads"), py::arg("kv_heads"), py::arg("max_length"), py::arg("head_dim"));
  m.def("max_head_dim", &decode_max_head_dim, "the largest head_dim the kernels support");
  m.def("max_splits", &decode_max_splits, "the most splits the split-KV kernels take");
  m.def("linear", &linear,
        "given, for task 6's decode step: out = x @ weight^T, x (rows, in_features) with 1 to linear_max_rows() rows, "
        "weight (out_features, in_features) as nn.Linear keeps it, out (rows, out_features)",
        py::arg("x"), py::arg("weight"), py::arg("out"));
  m.def("linear_max_rows", &linear_max_rows, "the most rows linear takes");
}

// The same functions as operators, in their tensor forms only (positions and lengths on the GPU: an int would be a
// constant baked into a compiled graph or a CUDA graph): torch.ops.<this extension's name>.decode(...) and the
// others. Each schema marks what the function writes (Tensor(a!)).
KIT_OPERATORS(m) {
  m.def("update_cache(Tensor k_new, Tensor v_new, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor pos) -> ()");
  m.def("update_cache_half(Tensor k_new, Tensor v_new, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor pos) -> ()");
  m.def("decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, Tensor length, float scale, int splits=0, "
        "Tensor? key_start=None) -> ()");
  m.def("decode_half(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, Tensor length, float scale, "
        "int splits=0, Tensor? key_start=None) -> ()");
  m.def("update_cache_paged(Tensor k_new, Tensor v_new, Tensor(a!) k_pages, Tensor(b!) v_pages, Tensor block_table, "
        "Tensor pos) -> ()");
  m.def("decode_paged(Tensor q, Tensor k_pages, Tensor v_pages, Tensor(a!) out, Tensor block_table, Tensor length, "
        "float scale, int splits=0, Tensor? key_start=None) -> ()");
  m.def("update_cache_paged_half(Tensor k_new, Tensor v_new, Tensor(a!) k_pages, Tensor(b!) v_pages, "
        "Tensor block_table, Tensor pos) -> ()");
  m.def("decode_paged_half(Tensor q, Tensor k_pages, Tensor v_pages, Tensor(a!) out, Tensor block_table, "
        "Tensor length, float scale, int splits=0, Tensor? key_start=None) -> ()");
  m.def("linear(Tensor x, Tensor weight, Tensor(a!) out) -> ()");
}

void update_op(const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache, torch::Tensor& v_cache,
               const torch::Tensor& pos) {
  update_at(k_new, v_new, k_cache, v_cache, pos);
}
void update_half_op(const torch::Tensor& k_new, const torch::Tensor& v_new, torch::Tensor& k_cache,
                    torch::Tensor& v_cache, const torch::Tensor& pos) {
  update_at(k_new, v_new, k_cache, v_cache, pos, true);
}
void decode_op(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache, torch::Tensor& out,
               const torch::Tensor& length, double scale, int64_t splits, const std::optional<torch::Tensor>& key_start) {
  decode_lengths(q, k_cache, v_cache, out, length, scale, splits, key_start);
}
void decode_half_op(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                    torch::Tensor& out, const torch::Tensor& length, double scale, int64_t splits,
                    const std::optional<torch::Tensor>& key_start) {
  decode_lengths(q, k_cache, v_cache, out, length, scale, splits, key_start, true);
}

void register_impls(torch::Library& m) {
  m.impl("update_cache", &update_op);
  m.impl("update_cache_half", &update_half_op);
  m.impl("decode", &decode_op);
  m.impl("decode_half", &decode_half_op);
  m.impl("update_cache_paged", &update_paged_op);
  m.impl("decode_paged", &decode_paged_op);
  m.impl("update_cache_paged_half", &update_paged_half_op);
  m.impl("decode_paged_half", &decode_paged_half_op);
  m.impl("linear", &linear);
}

KIT_OPERATOR_IMPLS(register_impls)
