// Given: not graded; edits here are not submitted. Task 4 binding: checks the tensors, then hands raw pointers to the launcher in
// kernels/attention.cu (or solution/kernels/attention.cu) on PyTorch's current stream.
// Shared by the student build and the reference build; students do not edit it.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "../common/csrc/checks.h"
#include "../common/csrc/device/params.h"
#include "../common/csrc/masks.h"
#include "../common/csrc/operators.h"

// Defined in kernels/attention.cu, each taking its parameters as one struct (common/csrc/device/params.h,
// which says what each field holds) and returning the launch's cudaError_t (cudaGetLastError after the
// launch). The tensors are checked here first: contiguous, on the device, float32 (int32 for key_start).
cudaError_t flash_attention_forward(const AttentionParams& p, cudaStream_t stream);
// Defined in kernels/attention_half.cu (optional, steps 8-11): the same for bf16 or fp16 tensors (p.bf16). Weak:
// a build without that file (an earlier term's, or the reference's other kernel folders) still loads, and
// forward_half then says the kernel is missing.
__attribute__((weak)) cudaError_t flash_attention_half_forward(const AttentionParams& p, cudaStream_t stream);
// The backward part (optional, steps 12-16), weak as above. In kernels/attention.cu: the forward without padding,
// also writing p.lse, (batch, heads, seq_q) float32, each row's log-sum-exp of the scaled scores (step 12).
__attribute__((weak)) cudaError_t flash_attention_forward_lse(const AttentionParams& p, cudaStream_t stream);
// The masks beyond causal (steps 23-24, optional), weak as above: in kernels/attention.cu, the forward with p.masks
// (device/params.h's AttentionMasks); key_start is never nullptr there (zeros for a batch without padding).
__attribute__((weak)) cudaError_t flash_attention_forward_masks(const AttentionParams& p, cudaStream_t stream);
// In kernels/attention_backward.cu (steps 13-16): dq, dk, dv from dout and what the forward saved; delta is scratch
// of lse's shape. Shapes as forward's; dq like q, dk and dv like k.
__attribute__((weak)) cudaError_t flash_attention_backward(const AttentionBackwardParams& p, cudaStream_t stream);
// In kernels/attention_backward_half.cu (steps 27-30, optional): the same in bf16 or fp16, lse from the 16-bit
// forward (step 27, in kernels/attention_half.cu), head_dim a multiple of 8 and 16-byte aligned tensors.
__attribute__((weak)) cudaError_t flash_attention_backward_half(const AttentionBackwardHalfParams& p,
                                                                cudaStream_t stream);
int flash_attention_block_rows();
int flash_attention_block_cols();
int flash_attention_max_head_dim();

static bool fits_int(int64_t x) { return x <= std::numeric_limits<int>::max(); }

// q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim) with heads a
// multiple of kv_heads (grouped-query attention; kv_heads == heads is plain multi-head);
// out: (batch, heads, seq_q, head_dim), written in place. key_start: none, or (batch,) int32,
// each sequence's first valid key (left padding).
// check_type(t, name): q's type and layout (float32 for forward, bf16 or fp16 for forward_half).
template <typename CheckType>
static const int* check_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& out, bool causal, double scale,
                                  const std::optional<torch::Tensor>& key_start, CheckType check_type) {
  // q first and completely: the other tensors are measured against it. Then the
  // shapes, and only then the layout of k, v and out: a slice of the wrong length is
  // usually not contiguous either, and its length is the mistake to report.
  check_type(q, "q");
  check_dim(q, "q", 4);
  check_dim(k, "k", 4);
  check_dim(v, "v", 4);
  check_dim(out, "out", 4);

  const int64_t batch = q.size(0), heads = q.size(1), seq_q = q.size(2), head_dim = q.size(3);
  const int64_t kv_heads = k.size(1), seq_k = k.size(2);
  TORCH_CHECK(k.size(0) == batch && k.size(3) == head_dim,
              "k must be (batch, kv_heads, seq_k, head_dim) with q's batch and head_dim (q is ",
              shape(q), "), got ", shape(k));
  TORCH_CHECK((kv_heads >= 1 && heads % kv_heads == 0) || heads == 0,
              "k's heads (kv_heads = k.size(1)) must divide q's heads: each group of heads / kv_heads ",
              "query heads shares one key/value head; got heads = ", num(heads), " and kv_heads = ",
              num(kv_heads));
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have k's shape ", shape(k), ", got ", shape(v));
  TORCH_CHECK(out.sizes() == q.sizes(), "out must have q's shape ", shape(q), ", got ",
              shape(out));

  const int max_head_dim = flash_attention_max_head_dim();
  TORCH_CHECK(head_dim >= 1, "head_dim must be at least 1, got ", num(head_dim));
  TORCH_CHECK(head_dim <= max_head_dim, "head_dim must be at most ", num(max_head_dim), ", got ",
              num(head_dim));
  TORCH_CHECK(seq_q >= 1, "q must have at least one query (seq_q >= 1), got shape ", shape(q));
  TORCH_CHECK(seq_k >= 1, "k must have at least one key (seq_k >= 1), got shape ", shape(k));
  // Query i sees keys j <= i + (seq_k - seq_q): with more queries than keys, the first
  // seq_q - seq_k queries would see no key at all, and their softmax is undefined.
  TORCH_CHECK(!causal || seq_q <= seq_k, "causal attention needs seq_q <= seq_k (the queries ",
              "are the last seq_q positions of the keys), got seq_q = ", num(seq_q),
              " and seq_k = ", num(seq_k));
  TORCH_CHECK(std::isfinite(scale), "scale must be finite, got ", std::to_string(scale));
  TORCH_CHECK(fits_int(batch * heads), "batch * heads must fit in int, got ", num(batch * heads));
  TORCH_CHECK(fits_int(seq_q * head_dim) && fits_int(seq_k * head_dim),
              "one head's q, k and v must each have fewer than 2^31 elements, got seq_q = ",
              num(seq_q), ", seq_k = ", num(seq_k), ", head_dim = ", num(head_dim));

  check_type(k, "k");
  check_type(v, "v");
  check_type(out, "out");
  check_same_device(k, "k", q, "q");
  check_same_device(v, "v", q, "q");
  check_same_device(out, "out", q, "q");
  // The kernel reads q, k and v while it writes out: sharing memory would read its own results.
  check_no_overlap(out, "out", q, "q");
  check_no_overlap(out, "out", k, "k");
  check_no_overlap(out, "out", v, "v");
  const c10::cuda::CUDAGuard guard(q.device());
  // Padding is defined by positions: queries are the last seq_q of the keys, so more queries than keys
  // would put some before key 0, which key_start cannot describe.
  TORCH_CHECK(!key_start.has_value() || seq_q <= seq_k, "key_start needs seq_q <= seq_k (the queries are the ",
              "last seq_q positions of the keys), got seq_q = ", num(seq_q), " and seq_k = ", num(seq_k));
  return check_key_start(key_start, batch, seq_k, "seq_k", q, "q");
}

// The parameters of a forward launch, from tensors check_attention has checked.
static AttentionParams attention_params(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        torch::Tensor& out, const int* key_start, double scale, bool causal) {
  AttentionParams p;
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.out = out.data_ptr();
  p.bf16 = q.scalar_type() == torch::kBFloat16;
  p.batch = (int)q.size(0), p.heads = (int)q.size(1), p.kv_heads = (int)k.size(1);
  p.seq_q = (int)q.size(2), p.seq_k = (int)k.size(2), p.head_dim = (int)q.size(3);
  p.key_start = key_start, p.scale = (float)scale, p.causal = causal;
  return p;
}

void forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
             torch::Tensor& out, bool causal, double scale,
             const std::optional<torch::Tensor>& key_start) {
  const int* key_start_data = check_attention(q, k, v, out, causal, scale, key_start, check_cuda_float32);
  if (q.numel() == 0) return;  // batch or heads is 0: nothing to do
  const c10::cuda::CUDAGuard guard(q.device());
  check_launch(flash_attention_forward(attention_params(q, k, v, out, key_start_data, scale, causal),
                                       c10::cuda::getCurrentCUDAStream()),
               "flash_attention_forward");
}

// The 16-bit kernels' checks: q, k, v and out all bfloat16 or all float16, the rest as forward's. Returns key_start's
// data, as check_attention.
static const int* check_attention_half(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       const torch::Tensor& out, bool causal, double scale,
                                       const std::optional<torch::Tensor>& key_start, const char* function) {
  const auto type = q.scalar_type();
  TORCH_CHECK(type == torch::kBFloat16 || type == torch::kHalf, "q must be bfloat16 or float16 for ", function,
              ", got ", dtype_name(type), " (float32 goes to forward)");
  const auto same_type = [type](const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device().str(),
                " (move it with .cuda())");
    TORCH_CHECK(t.scalar_type() == type, name, " must be ", dtype_name(type), " like q, got ",
                dtype_name(t.scalar_type()));
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (call .contiguous() first)");
  };
  return check_attention(q, k, v, out, causal, scale, key_start, same_type);
}

static std::pair<int, int> compute_capability(const torch::Tensor& q) {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.device().index());
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.device().index());
  return {major, minor};
}

// mma.sync.m16n8k16 and cp.async, what the 16-bit kernels of steps 8-11 and 27-30 are built on: compute capability
// 8.0 or newer (checked on q's device, made the current one for the launch).
static void check_ampere(const torch::Tensor& q, const char* what) {
  const auto [major, minor] = compute_capability(q);
  TORCH_CHECK(major >= 8, what, " uses mma.sync.m16n8k16 and cp.async, which need compute capability 8.0 (Ampere) or "
              "newer; this GPU is ", num(major), ".", num(minor));
}

// The bf16/fp16 forward kernel is in this build and can run on q's GPU.
static void check_half_forward(const torch::Tensor& q) {
  TORCH_CHECK(flash_attention_half_forward != nullptr,
              "this build has no bf16/fp16 kernel: task4/kernels/attention_half.cu is missing, did not compile, or "
              "does not define flash_attention_half_forward with the signature above (README, Task 4, step 8)");
  check_ampere(q, "the bf16/fp16 kernel");
}

static bool is_16_bit(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf;
}

// The optional bf16/fp16 kernel (steps 8-11): q, k, v and out all bfloat16 or all float16, the rest as forward.
void forward_half(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  torch::Tensor& out, bool causal, double scale,
                  const std::optional<torch::Tensor>& key_start) {
  const int* key_start_data = check_attention_half(q, k, v, out, causal, scale, key_start, "forward_half");
  check_half_forward(q);
  if (q.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  check_launch(flash_attention_half_forward(attention_params(q, k, v, out, key_start_data, scale, causal),
                                            c10::cuda::getCurrentCUDAStream()),
               "flash_attention_half_forward");
}

// t itself, or a copy with head_dim padded by zeros to a multiple of 8 and 16-byte aligned: what a kernel that copies
// 16 bytes at a time reads (the 16-bit backward's cp.async; the Hopper kernel's TMA).
static torch::Tensor rows_of_16_bytes(const torch::Tensor& t) {
  const int64_t head_dim = t.size(-1), padded = (head_dim + 7) / 8 * 8;
  if (padded == head_dim && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0) return t;
  return at::constant_pad_nd(t, {0, padded - head_dim});  // a new tensor: PyTorch's allocations are aligned
}

#if CUDART_VERSION >= 12000  // the tensor maps are CUDA 12's (device/params.h)
#include "../common/csrc/tensor_maps.h"  // tensor_map: what TMA reads the tensors through

// Defined in kernels/attention_hopper.cu (optional, steps 17-22): the same on Hopper's wgmma and TMA, given the tensor
// maps this binding makes (device/params.h). Weak, as the others.
__attribute__((weak)) cudaError_t flash_attention_hopper_forward(const HopperAttentionParams& p, cudaStream_t stream);
// The same with p.p.masks (step 25, optional): the masks beyond causal; key_start may be nullptr.
__attribute__((weak)) cudaError_t flash_attention_hopper_forward_masks(const HopperAttentionParams& p,
                                                                       cudaStream_t stream);
static bool has_hopper() { return flash_attention_hopper_forward != nullptr; }
static bool has_hopper_masks() { return has_hopper() && flash_attention_hopper_forward_masks != nullptr; }

// The Hopper kernel (steps 17-22), with the masks of step 25 where given: as forward_half, on compute capability 9.0;
// key_start_data from check_attention_half.
static void launch_hopper(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& out,
                          bool causal, double scale, const int* key_start_data, const AttentionMasks* masks) {
  TORCH_CHECK(has_hopper(),
              "this build has no Hopper kernel: task4/kernels/attention_hopper.cu is missing, did not compile, was "
              "left out (it is built on compute capability 9.0 only), or does not define "
              "flash_attention_hopper_forward with the signature above (README, Task 4, step 17)");
  TORCH_CHECK(!masks || flash_attention_hopper_forward_masks != nullptr, "this build's kernels/attention_hopper.cu has "
              "no flash_attention_hopper_forward_masks (README, Task 4, step 25)");
  const c10::cuda::CUDAGuard guard(q.device());
  const auto [major, minor] = compute_capability(q);
  TORCH_CHECK(major == 9 && minor == 0, "the Hopper kernel uses wgmma, TMA and setmaxnreg, built for sm_90a: it runs "
              "on compute capability 9.0 (H100, H200) only; this GPU is ", num(major), ".", num(minor),
              masks ? " (the masks beyond causal in 16 bits are the Hopper kernel's: give float32 tensors)" : "");
  if (q.numel() == 0) return;
  const torch::Tensor q_ready = rows_of_16_bytes(q), k_ready = rows_of_16_bytes(k), v_ready = rows_of_16_bytes(v);
  torch::Tensor out_ready = q_ready.size(3) == q.size(3) && reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0
                                ? out : torch::empty_like(q_ready);
  HopperAttentionParams p;
  p.p = attention_params(q_ready, k_ready, v_ready, out_ready, key_start_data, scale, causal);
  if (masks) p.p.masks = *masks;
  p.q_map = tensor_map(q_ready, "q", HOPPER_Q_BOX_ROWS);
  p.k_map = tensor_map(k_ready, "k", HOPPER_KV_BOX_ROWS), p.v_map = tensor_map(v_ready, "v", HOPPER_KV_BOX_ROWS);
  if (masks)
    check_launch(flash_attention_hopper_forward_masks(p, c10::cuda::getCurrentCUDAStream()),
                 "flash_attention_hopper_forward_masks");
  else
    check_launch(flash_attention_hopper_forward(p, c10::cuda::getCurrentCUDAStream()), "flash_attention_hopper_forward");
  if (!out_ready.is_same(out)) out.copy_(out_ready.narrow(3, 0, out.size(3)));
}
#else
static bool has_hopper() { return false; }
static bool has_hopper_masks() { return false; }
static void launch_hopper(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, torch::Tensor&, bool,
                          double, const int*, const AttentionMasks*) {
  TORCH_CHECK(false, "the Hopper kernel needs CUDA 12 or newer (its TMA tensor maps); this build's CUDA runtime is ",
              num(CUDART_VERSION));
}
#endif

void forward_hopper(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    torch::Tensor& out, bool causal, double scale,
                    const std::optional<torch::Tensor>& key_start) {
  launch_hopper(q, k, v, out, causal, scale,
                check_attention_half(q, k, v, out, causal, scale, key_start, "forward_hopper"), nullptr);
}

// The masks beyond causal (steps 23-25, optional; masks.h says each argument), the rest as forward: float32 tensors
// to kernels/attention.cu's MASKS instance (steps 23-24), bf16 and fp16 ones to the Hopper kernel's (step 25).
void forward_masks(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& out,
                   bool causal, double scale, const std::optional<torch::Tensor>& key_start,
                   std::optional<int64_t> window_left, std::optional<double> softcap,
                   const std::optional<torch::Tensor>& cu_seqlens) {
  if (q.scalar_type() == torch::kBFloat16 || q.scalar_type() == torch::kHalf) {
    const int* key_start_data = check_attention_half(q, k, v, out, causal, scale, key_start, "forward_masks");
    const AttentionMasks masks = checked_masks(q, k, causal, window_left, softcap, cu_seqlens);
    launch_hopper(q, k, v, out, causal, scale, key_start_data, &masks);
    return;
  }
  const int* key_start_data = check_attention(q, k, v, out, causal, scale, key_start, check_cuda_float32);
  const AttentionMasks masks = checked_masks(q, k, causal, window_left, softcap, cu_seqlens);
  TORCH_CHECK(flash_attention_forward_masks != nullptr, "this build's kernels/attention.cu has no "
              "flash_attention_forward_masks (README, Task 4, step 23)");
  if (q.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const torch::Tensor no_padding = key_start_data ? torch::Tensor() : torch::zeros({q.size(0)}, q.options().dtype(torch::kInt));
  AttentionParams p = attention_params(q, k, v, out, key_start_data ? key_start_data : no_padding.data_ptr<int>(),
                                       scale, causal);
  p.masks = masks;
  check_launch(flash_attention_forward_masks(p, c10::cuda::getCurrentCUDAStream()), "flash_attention_forward_masks");
}

// lse: (batch, heads, seq_q) float32 on q's device, not sharing memory with the tensors named in others.
static void check_lse(const torch::Tensor& lse, const torch::Tensor& q,
                      std::initializer_list<std::pair<const torch::Tensor*, const char*>> others) {
  check_cuda_float32(lse, "lse");
  TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
              "lse must be (batch, heads, seq_q) = (", num(q.size(0)), ", ", num(q.size(1)), ", ",
              num(q.size(2)), "), got ", shape(lse));
  check_same_device(lse, "lse", q, "q");
  for (const auto& [t, name] : others) check_no_overlap(lse, "lse", *t, name);
}

// The 16-bit backward part (steps 27-30) has no masks beyond causal yet: float32's have them (step 26).
static void check_no_16_bit_masks(const AttentionMasks& masks) {
  TORCH_CHECK(!has_masks(masks), "the bf16/fp16 backward part (steps 27-30) takes no window_left, softcap or "
              "cu_seqlens: the masks beyond causal in the backward pass are float32's (step 26): give float32 tensors");
}

// With the masks beyond causal (any of window_left, softcap, cu_seqlens: step 26, for the backward part's masks),
// kernels/attention.cu's MASKS instance writes lse (steps 23-24), key_start zeros.
// bf16 and fp16 tensors go to kernels/attention_half.cu, which writes lse where given (step 27), without the masks.
void forward_lse(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& out,
                 torch::Tensor& lse, bool causal, double scale, std::optional<int64_t> window_left,
                 std::optional<double> softcap, const std::optional<torch::Tensor>& cu_seqlens) {
  const bool half = is_16_bit(q);
  if (half)
    check_attention_half(q, k, v, out, causal, scale, std::nullopt, "forward_lse");
  else
    check_attention(q, k, v, out, causal, scale, std::nullopt, check_cuda_float32);
  check_lse(lse, q, {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}});
  const AttentionMasks masks = checked_masks(q, k, causal, window_left, softcap, cu_seqlens);
  if (half) {
    check_no_16_bit_masks(masks);
    check_half_forward(q);
    if (q.numel() == 0) return;
    const c10::cuda::CUDAGuard guard(q.device());
    AttentionParams p = attention_params(q, k, v, out, nullptr, scale, causal);
    p.lse = lse.data_ptr<float>();
    check_launch(flash_attention_half_forward(p, c10::cuda::getCurrentCUDAStream()), "flash_attention_half_forward");
    return;
  }
  const bool masked = has_masks(masks);
  TORCH_CHECK(masked || flash_attention_forward_lse != nullptr,
              "this build's kernels/attention.cu has no flash_attention_forward_lse (README, Task 4, step 12)");
  TORCH_CHECK(!masked || flash_attention_forward_masks != nullptr, "this build's kernels/attention.cu has no "
              "flash_attention_forward_masks (README, Task 4, step 23)");
  if (q.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const torch::Tensor no_padding = masked ? torch::zeros({q.size(0)}, q.options().dtype(torch::kInt)) : torch::Tensor();
  AttentionParams p = attention_params(q, k, v, out, masked ? no_padding.data_ptr<int>() : nullptr, scale, causal);
  p.lse = lse.data_ptr<float>(), p.masks = masks;
  check_launch(masked ? flash_attention_forward_masks(p, c10::cuda::getCurrentCUDAStream())
                      : flash_attention_forward_lse(p, c10::cuda::getCurrentCUDAStream()), "flash_attention_forward_lse");
}

// backward's bf16/fp16 tensors (checked there) to kernels/attention_backward_half.cu (steps 27-30).
static void backward_half(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& out, const torch::Tensor& dout, const torch::Tensor& lse,
                          torch::Tensor& dq, torch::Tensor& dk, torch::Tensor& dv, bool causal, double scale) {
  TORCH_CHECK(flash_attention_backward_half != nullptr,
              "this build has no bf16/fp16 backward kernels: task4/kernels/attention_backward_half.cu is missing, did "
              "not compile, or does not define flash_attention_backward_half with the signature above (README, Task "
              "4, step 28)");
  check_ampere(q, "the bf16/fp16 backward part");
  TORCH_CHECK(k.size(0) * k.size(1) <= 65535, "the bf16/fp16 backward part runs one row of blocks per (batch, "
              "kv_head): batch * kv_heads must be at most 65535, got ", num(k.size(0) * k.size(1)));
  const c10::cuda::CUDAGuard guard(q.device());
  if (q.numel() == 0) {  // as float32's: no query reads a key
    dk.zero_();
    dv.zero_();
    return;
  }
  // the kernels' rows: head_dim a multiple of 8, 16-byte aligned; a copy where a tensor is not, the results copied back
  const torch::Tensor q16 = rows_of_16_bytes(q), k16 = rows_of_16_bytes(k), v16 = rows_of_16_bytes(v);
  const torch::Tensor out16 = rows_of_16_bytes(out), dout16 = rows_of_16_bytes(dout);
  const auto ready = [&](torch::Tensor& t, const torch::Tensor& like) {
    const bool aligned = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
    return t.size(3) == like.size(3) && aligned ? t : torch::empty_like(like);
  };
  torch::Tensor dq16 = ready(dq, q16), dk16 = ready(dk, k16), dv16 = ready(dv, k16);
  // D = rowsum(dout * out): NaN until the first kernel writes it, as float32's; dQ's float32 sums start at zero
  torch::Tensor delta = torch::full_like(lse, std::numeric_limits<float>::quiet_NaN());
  torch::Tensor dq_accum = torch::zeros(q16.sizes(), lse.options());
  AttentionBackwardHalfParams p;
  p.q = q16.data_ptr(), p.k = k16.data_ptr(), p.v = v16.data_ptr(), p.out = out16.data_ptr();
  p.dout = dout16.data_ptr(), p.lse = lse.data_ptr<float>(), p.delta = delta.data_ptr<float>();
  p.dq_accum = dq_accum.data_ptr<float>(), p.dq = dq16.data_ptr(), p.dk = dk16.data_ptr(), p.dv = dv16.data_ptr();
  p.bf16 = q.scalar_type() == torch::kBFloat16;
  p.batch = (int)q.size(0), p.heads = (int)q.size(1), p.kv_heads = (int)k.size(1);
  p.seq_q = (int)q.size(2), p.seq_k = (int)k.size(2), p.head_dim = (int)q16.size(3);
  p.scale = (float)scale, p.causal = causal;
  check_launch(flash_attention_backward_half(p, c10::cuda::getCurrentCUDAStream()), "flash_attention_backward_half");
  for (auto [mine, theirs] : {std::pair<torch::Tensor*, torch::Tensor*>{&dq16, &dq}, {&dk16, &dk}, {&dv16, &dv}})
    if (!mine->is_same(*theirs)) theirs->copy_(mine->narrow(3, 0, theirs->size(3)));
}

// dq, dk, dv (written) from dout and what forward_lse saved (q, k, v, out, lse), with the masks it was given (step 26);
// bf16 or fp16 tensors to the 16-bit backward part (steps 27-30), without the masks.
void backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& out,
              const torch::Tensor& dout, const torch::Tensor& lse, torch::Tensor& dq, torch::Tensor& dk,
              torch::Tensor& dv, bool causal, double scale, std::optional<int64_t> window_left,
              std::optional<double> softcap, const std::optional<torch::Tensor>& cu_seqlens) {
  const bool half = is_16_bit(q);
  if (half)
    check_attention_half(q, k, v, out, causal, scale, std::nullopt, "backward");
  else
    check_attention(q, k, v, out, causal, scale, std::nullopt, check_cuda_float32);
  const AttentionMasks masks = checked_masks(q, k, causal, window_left, softcap, cu_seqlens);
  check_lse(lse, q, {});
  const std::pair<const torch::Tensor*, const char*> inputs[] = {
      {&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&dout, "dout"}, {&lse, "lse"}};
  const std::tuple<const torch::Tensor*, const char*, const torch::Tensor*, const char*> like[] = {
      {&dout, "dout", &q, "q"}, {&dq, "dq", &q, "q"}, {&dk, "dk", &k, "k"}, {&dv, "dv", &k, "k"}};
  for (const auto& [t, name, model, model_name] : like) {
    if (half) {
      TORCH_CHECK(t->is_cuda(), name, " must be a CUDA tensor, got one on ", t->device().str(), " (move it with .cuda())");
      TORCH_CHECK(t->scalar_type() == q.scalar_type(), name, " must be ", dtype_name(q.scalar_type()), " like q, got ",
                  dtype_name(t->scalar_type()));
      TORCH_CHECK(t->is_contiguous(), name, " must be contiguous (call .contiguous() first)");
    } else {
      check_cuda_float32(*t, name);
    }
    TORCH_CHECK(t->sizes() == model->sizes(), name, " must have ", model_name, "'s shape ", shape(*model), ", got ",
                shape(*t));
    check_same_device(*t, name, q, "q");
  }
  // The kernels read every input while they write dq, dk and dv, and write each of those once: no sharing.
  const std::pair<const torch::Tensor*, const char*> outputs[] = {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
  for (const auto& [o, o_name] : outputs) {
    for (const auto& [t, name] : inputs) check_no_overlap(*o, o_name, *t, name);
    for (const auto& [t, name] : outputs)
      if (t != o) check_no_overlap(*o, o_name, *t, name);
  }
  if (half) {
    check_no_16_bit_masks(masks);
    backward_half(q, k, v, out, dout, lse, dq, dk, dv, causal, scale);
    return;
  }
  TORCH_CHECK(flash_attention_backward != nullptr,
              "this build has no backward kernels: task4/kernels/attention_backward.cu is missing, did not compile, "
              "or does not define flash_attention_backward with the signature above (README, Task 4, step 13)");
  const c10::cuda::CUDAGuard guard(q.device());
  if (q.numel() == 0) {  // heads == 0 (or batch == 0): no query reads a key, so dk and dv are zeros
    dk.zero_();
    dv.zero_();
    return;
  }
  // D = rowsum(dout * out), the kernels' scratch: NaN until the first kernel writes it, so a D never computed shows
  torch::Tensor delta = torch::full_like(lse, std::numeric_limits<float>::quiet_NaN());
  AttentionBackwardParams p;
  p.q = q.data_ptr<float>(), p.k = k.data_ptr<float>(), p.v = v.data_ptr<float>(), p.out = out.data_ptr<float>();
  p.dout = dout.data_ptr<float>(), p.lse = lse.data_ptr<float>(), p.delta = delta.data_ptr<float>();
  p.dq = dq.data_ptr<float>(), p.dk = dk.data_ptr<float>(), p.dv = dv.data_ptr<float>();
  p.batch = (int)q.size(0), p.heads = (int)q.size(1), p.kv_heads = (int)k.size(1);
  p.seq_q = (int)q.size(2), p.seq_k = (int)k.size(2), p.head_dim = (int)q.size(3);
  p.scale = (float)scale, p.causal = causal, p.masks = masks;
  check_launch(flash_attention_backward(p, c10::cuda::getCurrentCUDAStream()), "flash_attention_backward");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward,
        "out = softmax(scale * q k^T + mask) v, fused (FlashAttention-2 forward); q and out are "
        "(batch, heads, seq_q, head_dim), k and v (batch, kv_heads, seq_k, head_dim), float32 CUDA "
        "tensors; out is written in place. key_start (optional, int32 (batch,)): each sequence's "
        "first valid key; queries before it are padding and get zeros",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("causal"),
        py::arg("scale"), py::arg("key_start") = py::none());
  m.def("forward_half", &forward_half,
        "forward for bfloat16 or float16 q, k, v and out (all of one type), on the tensor cores: "
        "README, Task 4, steps 8-11 (optional)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("causal"),
        py::arg("scale"), py::arg("key_start") = py::none());
  m.def("forward_masks", &forward_masks,
        "forward with the masks beyond causal (README, Task 4; optional): float32 (steps 23-24), or bf16/fp16 on the "
        "Hopper kernel (step 25); window_left (>= 0, with causal), softcap (> 0) and cu_seqlens (int32 cumulative "
        "document lengths, seq_q == seq_k), each optional",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("causal"), py::arg("scale"),
        py::arg("key_start") = py::none(), py::arg("window_left") = py::none(), py::arg("softcap") = py::none(),
        py::arg("cu_seqlens") = py::none());
  m.def("has_masks", [] { return flash_attention_forward_masks != nullptr; },
        "whether this build's kernels/attention.cu holds the masks beyond causal (steps 23-24)");
  m.def("has_hopper_masks", &has_hopper_masks,
        "whether this build's Hopper kernel holds the masks beyond causal (step 25)");
  m.def("has_half", [] { return flash_attention_half_forward != nullptr; },
        "whether this build holds the bf16/fp16 kernel (task4/kernels/attention_half.cu)");
  m.def("forward_hopper", &forward_hopper,
        "forward_half on Hopper's wgmma and TMA, compute capability 9.0 only: README, Task 4, steps 17-22 (optional)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("causal"),
        py::arg("scale"), py::arg("key_start") = py::none());
  m.def("has_hopper", &has_hopper,
        "whether this build holds the Hopper kernel (task4/kernels/attention_hopper.cu)");
  m.def("forward_lse", &forward_lse,
        "forward without padding that also writes lse, (batch, heads, seq_q) float32: each row's log-sum-exp of "
        "the scaled scores, what the backward pass needs (README, Task 4, step 12; optional)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("causal"),
        py::arg("scale"), py::arg("window_left") = py::none(), py::arg("softcap") = py::none(),
        py::arg("cu_seqlens") = py::none());
  m.def("backward", &backward,
        "dq, dk, dv (written in place) of the attention forward_lse computed, given dout = dLoss/d(out) and what "
        "it saved: q, k, v, out, lse (README, Task 4, steps 13-16; optional)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("dout"), py::arg("lse"), py::arg("dq"),
        py::arg("dk"), py::arg("dv"), py::arg("causal"), py::arg("scale"), py::arg("window_left") = py::none(),
        py::arg("softcap") = py::none(), py::arg("cu_seqlens") = py::none());
  m.def("has_backward", [] { return flash_attention_forward_lse != nullptr && flash_attention_backward != nullptr; },
        "whether this build holds the backward part (step 12 in kernels/attention.cu, kernels/attention_backward.cu)");
  m.def("has_backward_half",
        [] { return flash_attention_half_forward != nullptr && flash_attention_backward_half != nullptr; },
        "whether this build holds the bf16/fp16 backward part (kernels/attention_half.cu and "
        "kernels/attention_backward_half.cu)");
  m.def("max_head_dim", &flash_attention_max_head_dim, "the largest head_dim the kernel supports");
  m.def(
      "tile_sizes",
      [] { return std::make_tuple(flash_attention_block_rows(), flash_attention_block_cols()); },
      "(Br, Bc): query rows per block and key/value rows per tile");
}

// The same functions as operators: torch.ops.<this extension's name>.forward(...) and the others. Each schema marks
// what the function writes (Tensor(a!)); they return nothing, as above.
KIT_OPERATORS(m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, Tensor(a!) out, bool causal, float scale, Tensor? key_start=None) -> ()");
  m.def("forward_half(Tensor q, Tensor k, Tensor v, Tensor(a!) out, bool causal, float scale, "
        "Tensor? key_start=None) -> ()");
  m.def("forward_hopper(Tensor q, Tensor k, Tensor v, Tensor(a!) out, bool causal, float scale, "
        "Tensor? key_start=None) -> ()");
  m.def("forward_masks(Tensor q, Tensor k, Tensor v, Tensor(a!) out, bool causal, float scale, "
        "Tensor? key_start=None, int? window_left=None, float? softcap=None, Tensor? cu_seqlens=None) -> ()");
  m.def("forward_lse(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, bool causal, float scale, "
        "int? window_left=None, float? softcap=None, Tensor? cu_seqlens=None) -> ()");
  m.def("backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, Tensor(a!) dq, Tensor(b!) dk, "
        "Tensor(c!) dv, bool causal, float scale, int? window_left=None, float? softcap=None, "
        "Tensor? cu_seqlens=None) -> ()");
}

void register_impls(torch::Library& m) {
  m.impl("forward", &forward);
  m.impl("forward_half", &forward_half);
  m.impl("forward_hopper", &forward_hopper);
  m.impl("forward_masks", &forward_masks);
  m.impl("forward_lse", &forward_lse);
  m.impl("backward", &backward);
}

KIT_OPERATOR_IMPLS(register_impls)
