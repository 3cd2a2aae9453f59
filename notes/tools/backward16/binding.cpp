// The experiment's binding (bwd16.py builds it with bwd16.cu): tensors in, Backward16Params out, on the current
// stream. Checks what the experiment needs, no more: the kit's binding (task4/binding.cpp) is where the full checks go.
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "bwd16.h"
#include "device/params.h"

// forward_lse.py's patched copy of the reference's 16-bit forward (step 23), built beside bwd16.cu
cudaError_t flash_attention_half_forward(const AttentionParams& p, cudaStream_t stream);

void forward_lse16(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& out,
                   torch::Tensor& lse, bool causal, double scale) {
  for (const torch::Tensor* t : {&q, &k, &v, &out}) {
    TORCH_CHECK(t->is_cuda() && t->is_contiguous() && t->dim() == 4 && t->scalar_type() == q.scalar_type(),
                "q, k, v, out: contiguous 4-d CUDA tensors of one 16-bit type");
  }
  TORCH_CHECK(lse.is_cuda() && lse.is_contiguous() && lse.scalar_type() == torch::kFloat32, "lse: float32");
  AttentionParams p;
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.out = out.data_ptr();
  p.bf16 = q.scalar_type() == torch::kBFloat16;
  p.batch = q.size(0), p.heads = q.size(1), p.kv_heads = k.size(1), p.seq_q = q.size(2), p.seq_k = k.size(2);
  p.head_dim = q.size(3), p.scale = (float)scale, p.causal = causal, p.lse = lse.data_ptr<float>();
  const cudaError_t err = flash_attention_half_forward(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "flash_attention_half_forward: ", cudaGetErrorString(err));
}

void backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& out,
              const torch::Tensor& dout, const torch::Tensor& lse, torch::Tensor& dq, torch::Tensor& dk,
              torch::Tensor& dv, bool causal, double scale, int64_t block_m) {
  for (const torch::Tensor* t : {&q, &k, &v, &out, &dout, &dq, &dk, &dv}) {
    TORCH_CHECK(t->is_cuda() && t->is_contiguous() && t->dim() == 4 && t->scalar_type() == q.scalar_type(),
                "q, k, v, out, dout, dq, dk, dv: contiguous 4-d CUDA tensors of one 16-bit type");
  }
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 || q.scalar_type() == torch::kHalf, "bf16 or fp16");
  TORCH_CHECK(lse.is_cuda() && lse.is_contiguous() && lse.scalar_type() == torch::kFloat32, "lse: float32");
  const auto opts = q.options().dtype(torch::kFloat32);
  torch::Tensor delta = torch::empty({q.size(0), q.size(1), q.size(2)}, opts);
  torch::Tensor dq_accum = torch::empty(q.sizes(), opts);
  Backward16Params p{};
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.out = out.data_ptr(), p.dout = dout.data_ptr();
  p.lse = lse.data_ptr<float>(), p.delta = delta.data_ptr<float>(), p.dq_accum = dq_accum.data_ptr<float>();
  p.dq = dq.data_ptr(), p.dk = dk.data_ptr(), p.dv = dv.data_ptr();
  p.batch = q.size(0), p.heads = q.size(1), p.kv_heads = k.size(1), p.seq_q = q.size(2), p.seq_k = k.size(2);
  p.head_dim = q.size(3), p.scale = (float)scale, p.causal = causal, p.bf16 = q.scalar_type() == torch::kBFloat16;
  p.block_m = (int)block_m;
  const cudaError_t err = backward16(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "backward16: ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("backward", &backward);
  m.def("forward_lse16", &forward_lse16);
}
