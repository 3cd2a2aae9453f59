"""Task 4's steps 17-22 (optional): the Hopper kernel against float64 on the same 16-bit inputs, and the given
binding's errors for it; run in a process of its own by checks/task4/test.py, on compute capability 9.0 only.
"""

from __future__ import annotations

import torch

from checks.task4.cases import HOPPER_CASES, HOPPER_SHIFTED_CASES
from checks.task4.half import run_16bit_part
from harness.outcome import Cause

# Where the Hopper kernel makes each of the common mistakes (harness/diagnose.py): the scale, the mask and the
# online softmax are step 19's; its key tiles are the reference's widths unless the student's file says otherwise
HOPPER_MISTAKES_STEP = 19
HOPPER_TILES = {"BLOCK_COLS": 192, "BLOCK_COLS_LARGE_D": 128}


# An mbarrier wait traps after seconds (device/hopper.cuh); these two wait forever
HUNG = ("the Hopper kernel hung without trapping: most often a turn that never comes (step 22: consumer 1's first "
        "arrival, the barrier ids) or a registers_take that no registers_release made room for (step 20)")


def is_hopper() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


def hopper_part(report, worker, hidden_cases, constants=None) -> bool:
    """Steps 17-22 (optional): the Hopper kernel in both types; whether every case passed. An mbarrier that never
    completes traps after seconds, a CUDA error that ends the part at its first case (run_16bit_part); a kernel
    that hangs without trapping ends it too, and a note says where such hangs come from. constants: the student's
    attention_hopper.cu's (its key tiles, BLOCK_COLS and BLOCK_COLS_LARGE_D)."""
    report.begin_part("hopper", (17, 18, 19, 20, 21, 22), optional=True)
    before = len(report.cases)
    run_16bit_part(report, worker, "hopper", HOPPER_CASES, hidden_cases, "Hopper ", 23, "the Hopper part",
                   {**HOPPER_TILES, **(constants or {})}, shifted_cases=HOPPER_SHIFTED_CASES, call="forward_hopper",
                   step=HOPPER_MISTAKES_STEP)
    if any(c.cause == Cause.TIMED_OUT for c in report.cases[before:]):
        report.note(HUNG)
    return report.end_part("hopper")
