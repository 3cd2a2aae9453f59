"""Issue 58 on the device: the kit's own 16-bit backward part (task4/solution/kernels/attention_backward_half.cu and
step 27's lse in attention_half.cu, through task4/binding.cpp's forward_lse and backward), checked and timed by
bwd16.py's check and time_cases (the experiment's harness: float64 autograd, 2x SDPA's own error; SDPA's flash
backward beside, one run).

    PYTHONPATH=. python notes/tools/backward16/kit_check.py [check] [time]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bwd16  # noqa: E402


class KitBackward:
    """bwd16.py's extension calls, made on the kit's reference build."""

    def __init__(self):
        from task4.attention import extension

        self.ext = extension(solution=True)

    def forward_lse16(self, q, k, v, out, lse, causal, scale):
        self.ext.forward_lse(q, k, v, out, lse, causal, scale)

    def backward(self, q, k, v, out, dout, lse, dq, dk, dv, causal, scale, block_m):
        self.ext.backward(q, k, v, out, dout, lse, dq, dk, dv, causal, scale)


# beside bwd16.py's: head_dims the binding pads (33) or the 64-wide tile holds partly (40), 96 in the 128-wide one
bwd16.CHECKS += [(1, 2, 2, 77, 131, 33, True, 1), (2, 4, 2, 65, 65, 96, False, 1), (1, 3, 1, 130, 250, 40, True, 1)]

if __name__ == "__main__":
    what = sys.argv[1:] or ["check", "time"]
    ext = KitBackward()
    failed = bwd16.check(ext, 0) if "check" in what else 0
    if "time" in what and not failed:
        bwd16.time_cases(ext, 0)
