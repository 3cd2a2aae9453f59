"""Task 4's steps 17-20 (optional): the Hopper kernel against float64 on the same 16-bit inputs, and the given
binding's errors for it; run in a process of its own by checks/task4/test.py, on compute capability 9.0 only.
"""

from __future__ import annotations

import torch

from harness.checks import expect_errors
from checks.task4.cases import HOPPER_CASES
from checks.task4.half import run_16bit_part

# Where the Hopper kernel makes each of the common mistakes (harness/diagnose.py): the scale, the mask and the
# online softmax are step 19's; its key tiles are 128 wide
HOPPER_MISTAKES_STEP = 19
HOPPER_TILES = {"BLOCK_COLS": 128}


def is_hopper() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


def check_hopper_errors(worker):
    """The given binding's errors for the Hopper kernel (not the student's work: reported, not scored)."""
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=torch.bfloat16)
    bad = {
        "float32 q": ((q.float(), q.float(), q.float(), q.float()), "must be bfloat16 or float16 for forward_hopper"),
        "k in float16 beside a bfloat16 q": ((q, q.half(), q.clone(), torch.empty_like(q)), "like q"),
        "non-contiguous": ((q.transpose(2, 3), q.clone(), q.clone(), torch.empty_like(q)), "contiguous"),
        "head_dim 256": ((torch.randn(1, 1, 4, 256, device="cuda", dtype=torch.half),) * 4,
                         "head_dim must be at most 128"),
        "out is q": ((q, q.clone(), q.clone(), q), "must not share memory"),
    }
    return expect_errors(lambda *args: worker.call("forward_hopper", *args),
                         [(what, (*args, False, 0.125), words) for what, (args, words) in bad.items()])


def hopper_part(report, worker, hidden_cases) -> bool:
    """Steps 17-20 (optional): the Hopper kernel in both types; whether every case passed. A barrier that never
    completes traps after seconds, a CUDA error that ends the part at its first case (run_16bit_part)."""
    report.begin_part("hopper", (17, 18, 19, 20), optional=True)
    run_16bit_part(report, worker, "hopper", HOPPER_CASES, hidden_cases, "Hopper ", 23, "the Hopper part",
                   HOPPER_TILES, call="forward_hopper", step=HOPPER_MISTAKES_STEP)
    return report.end_part("hopper")
