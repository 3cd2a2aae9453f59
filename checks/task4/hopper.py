"""Task 4's steps 17-21 (optional): the Hopper kernel against float64 on the same 16-bit inputs, and the given
binding's errors for it; run in a process of its own by checks/task4/test.py, on compute capability 9.0 only.
"""

from __future__ import annotations

import torch

from checks.task4.cases import HOPPER_CASES
from checks.task4.half import run_16bit_part

# Where the Hopper kernel makes each of the common mistakes (harness/diagnose.py): the scale, the mask and the
# online softmax are step 19's; its key tiles are 128 wide
HOPPER_MISTAKES_STEP = 19
HOPPER_TILES = {"BLOCK_COLS": 128}


def is_hopper() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


def hopper_part(report, worker, hidden_cases) -> bool:
    """Steps 17-21 (optional): the Hopper kernel in both types; whether every case passed. A barrier that never
    completes traps after seconds, a CUDA error that ends the part at its first case (run_16bit_part)."""
    report.begin_part("hopper", (17, 18, 19, 20, 21), optional=True)
    run_16bit_part(report, worker, "hopper", HOPPER_CASES, hidden_cases, "Hopper ", 23, "the Hopper part",
                   HOPPER_TILES, call="forward_hopper", step=HOPPER_MISTAKES_STEP)
    return report.end_part("hopper")
