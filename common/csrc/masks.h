// The masks beyond causal (task 4, steps 23-25, optional): their arguments checked and made into AttentionMasks
// (device/params.h) for task 4's binding, whichever kernel takes them (float32, or 16-bit on Hopper).
#pragma once

#include <algorithm>
#include <optional>
#include <string>

#include "checks.h"
#include "device/params.h"

// window_left (>= 0, with causal: query i sees keys i + seq_k - seq_q - window_left .. its diagonal), softcap (> 0:
// scores softcap * tanh(S / softcap)), cu_seqlens (int32 (documents + 1,) on q's device, 0 = c_0 < ... < c_n = seq_k,
// seq_q == seq_k: a query sees its own document's keys), any of them left out. q and k are checked already.
inline AttentionMasks checked_masks(const torch::Tensor& q, const torch::Tensor& k, bool causal,
                                    std::optional<int64_t> window_left, std::optional<double> softcap,
                                    const std::optional<torch::Tensor>& cu_seqlens) {
  const int64_t seq_q = q.size(2), seq_k = k.size(2);
  TORCH_CHECK(!window_left || *window_left >= 0, "window_left must be None or >= 0 (the keys a query sees before "
              "its own), got ", num(window_left.value_or(0)));
  TORCH_CHECK(!window_left || causal, "window_left needs causal=True: the window is the window_left keys before a "
              "query's own position, and the query's own");
  // the kernels hold the cap as a float32, times log2(e), and divide by it: a cap float32 cannot hold that way
  // (below about 1e-38 it is 0 or its inverse infinite; above about 2e38 times log2(e) infinite) would be no cap or NaN
  const float cap = softcap ? (float)*softcap : 0.0f;
  TORCH_CHECK(!softcap || (cap >= 1e-30f && cap <= 1e30f), "softcap must be None or a finite number > 0 (from "
              "1e-30 to 1e30: the kernel holds it as a float32), got ", std::to_string(softcap.value_or(0)));
  AttentionMasks masks;
  masks.window_left = window_left ? (int)std::min<int64_t>(*window_left, seq_k) : -1;  // wider is all of them
  masks.softcap = cap;
  if (cu_seqlens) {
    const torch::Tensor& c = *cu_seqlens;
    TORCH_CHECK(c.is_cuda() && c.scalar_type() == torch::kInt && c.dim() == 1 && c.is_contiguous(),
                "cu_seqlens must be a contiguous 1-D int32 CUDA tensor, got ", shape(c), " ", dtype_name(c.scalar_type()),
                " on ", c.device().str());
    check_same_device(c, "cu_seqlens", q, "q");
    TORCH_CHECK(seq_q == seq_k, "cu_seqlens packs documents into one sequence of queries and keys: it needs seq_q == "
                "seq_k, got ", num(seq_q), " and ", num(seq_k));
    const torch::Tensor host = c.cpu();
    const int* ends = host.data_ptr<int>();
    bool rising = c.size(0) >= 2 && ends[0] == 0 && ends[c.size(0) - 1] == seq_k;
    for (int64_t d = 1; rising && d < c.size(0); ++d) rising = ends[d - 1] < ends[d];
    TORCH_CHECK(rising, "cu_seqlens must rise from 0 to the sequence length ", num(seq_k), " (0 = c_0 < c_1 < ... < "
                "c_n = seq_k: each document at least one position), got ", num(c.size(0)), " values from ",
                num(c.size(0) ? ends[0] : 0), " to ", num(c.size(0) ? ends[c.size(0) - 1] : 0));
    masks.cu_seqlens = c.data_ptr<int>(), masks.documents = (int)c.size(0) - 1;
  }
  return masks;
}
