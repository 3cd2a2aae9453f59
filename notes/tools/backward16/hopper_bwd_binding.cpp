// The Hopper backward experiment's binding (hopper_bwd.py builds it with hopper_bwd.cu): tensors in, the TMA maps
// and HopperBackwardParams out. Checks what the experiment needs, no more.
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "hopper_bwd.h"
#include "tensor_maps.h"  // tensor_map: cuTensorMapEncodeTiled through the runtime's driver entry point

void backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& out,
              const torch::Tensor& dout, const torch::Tensor& lse, torch::Tensor& dq, torch::Tensor& dk,
              torch::Tensor& dv, bool causal, double scale) {
  const std::initializer_list<const torch::Tensor*> tensors = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
  for (const torch::Tensor* t : tensors) {
    TORCH_CHECK(t->is_cuda() && t->is_contiguous() && t->dim() == 4 && t->scalar_type() == q.scalar_type(),
                "q, k, v, out, dout, dq, dk, dv: contiguous 4-d CUDA tensors of one 16-bit type");
  }
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 || q.scalar_type() == torch::kHalf, "bf16 or fp16");
  TORCH_CHECK(q.size(3) == 64 || q.size(3) == 128, "head_dim 64 or 128 (the experiment's)");
  TORCH_CHECK(lse.is_cuda() && lse.is_contiguous() && lse.scalar_type() == torch::kFloat32, "lse: float32");
  TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
              "lse: (batch, heads, seq_q)");
  TORCH_CHECK(q.size(0) >= 1 && k.size(1) >= 1 && q.size(1) % k.size(1) == 0 && q.size(0) * k.size(1) <= 65535,
              "batch >= 1, heads a multiple of kv_heads, batch * kv_heads <= 65535 (the grid's y)");
  const auto opts = q.options().dtype(torch::kFloat32);
  torch::Tensor delta = torch::empty({q.size(0), q.size(1), q.size(2)}, opts);
  torch::Tensor dq_accum = torch::zeros(q.sizes(), opts);
  HopperBackwardParams p{};
  p.q_map = tensor_map(q, "q", 64), p.k_map = tensor_map(k, "k", 64), p.v_map = tensor_map(v, "v", 64);
  p.do_map = tensor_map(dout, "dout", 64);
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.out = out.data_ptr(), p.dout = dout.data_ptr();
  p.lse = lse.data_ptr<float>(), p.delta = delta.data_ptr<float>(), p.dq_accum = dq_accum.data_ptr<float>();
  p.dq = dq.data_ptr(), p.dk = dk.data_ptr(), p.dv = dv.data_ptr();
  p.batch = q.size(0), p.heads = q.size(1), p.kv_heads = k.size(1), p.seq_q = q.size(2), p.seq_k = k.size(2);
  p.head_dim = q.size(3), p.scale = (float)scale, p.causal = causal, p.bf16 = q.scalar_type() == torch::kBFloat16;
  const cudaError_t err = hopper_backward(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "hopper_backward: ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("backward", &backward); }
