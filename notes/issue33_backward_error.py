"""Issue 33: the task 3 backward reference's error against float64 autograd, beside PyTorch's own float32 autograd
through naive attention on the same inputs (python notes/issue33_backward_error.py, from the repository root, CPU)."""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from task3.solution.attention import flash_attention_trainable
from harness.reference import naive_attention
torch.manual_seed(0)
CASES = [(1,1,1,1,16,64,64),(2,3,127,127,32,16,16),(2,3,127,127,32,32,64),(2,2,129,129,64,64,32),(1,2,100,300,64,64,64),
         (1,2,1,257,64,64,64),(1,2,200,200,80,128,128),(1,1,70,70,8,1,7)]
worst = 0
for b,h,sq,sk,d,br,bc in CASES:
    for causal in (False, True):
        if causal and sq > sk: continue
        q,k,v = (torch.randn(b,h,n,d) for n in (sq,sk,sk))
        do = torch.randn(b,h,sq,d)
        q32,k32,v32 = (t.clone().requires_grad_() for t in (q,k,v))
        flash_attention_trainable(q32,k32,v32,causal,br,bc).backward(do)
        q64,k64,v64 = (t.double().requires_grad_() for t in (q,k,v))
        naive_attention(q64,k64,v64,causal).backward(do.double())
        q3,k3,v3 = (t.clone().requires_grad_() for t in (q,k,v))
        naive_attention(q3,k3,v3,causal).backward(do)  # PyTorch's own float32 error
        row = []
        for name, a, ref, own in (("dq",q32.grad,q64.grad,q3.grad),("dk",k32.grad,k64.grad,k3.grad),("dv",v32.grad,v64.grad,v3.grad)):
            err = (a.double()-ref).abs().max().item(); own_err = (own.double()-ref).abs().max().item()
            scale = ref.abs().max().item()
            row.append(f"{name} {err:.1e}/{own_err:.1e} (max {scale:.1f})")
            worst = max(worst, err / scale) if scale > 0 else worst
        print((b,h,sq,sk,d,br,bc), causal, "; ".join(row))
print("worst err / max|ref|", worst)
