"""python3 notes/tools/sdpa_probe.py [--one]: what SDPA's float32 attention runs on (notes/task4-performance.md).

Accuracy against float64 of SDPA, naive fp32 (and one TF32 pass) and the task 4 reference; with
--one, a single SDPA launch for ncu to look at (it lived in .dev/ when the notes were measured).
"""
import math, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch, torch.nn.functional as F
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
if "--one" in sys.argv:
    q, k, v = (torch.randn(1, 32, 4096, 128, device="cuda") for _ in range(3))
    F.scaled_dot_product_attention(q, k, v); torch.cuda.synchronize(); sys.exit()
from common.build import load_extension
ref = load_extension(4, True, quiet=True)
for d in (64, 80, 128):
    g = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (torch.randn(2, 8, 1024, d, device="cuda", generator=g) for _ in range(3))
    exact = torch.softmax((q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d), -1) @ v.double()
    sdpa = F.scaled_dot_product_attention(q, k, v)
    naive = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(d), -1) @ v
    out = torch.empty_like(q); ref.forward(q, k, v, out, False, 1 / math.sqrt(d))
    with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=False, enable_mem_efficient=True):
        me = F.scaled_dot_product_attention(q, k, v)
    e = lambda x: (x.double() - exact).abs().max().item()
    print(f"D{d}: max |error| vs float64: SDPA {e(sdpa):.2e}, mem-efficient forced {e(me):.2e}, "
          f"naive fp32 {e(naive):.2e}, reference kernel {e(out):.2e}")
    torch.backends.cuda.matmul.allow_tf32 = True
    naive_tf32 = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(d), -1) @ v
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"      naive with TF32 matmuls (one pass, for scale): {e(naive_tf32):.2e}")
