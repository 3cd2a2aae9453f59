"""Task 4's steps 17-22 (optional): the Hopper kernel against float64 on the same 16-bit inputs, and the given
binding's errors for it; run in a process of its own by checks/task4/test.py, on compute capability 9.0 only.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from checks.task4.cases import HOPPER_CASES, HOPPER_SHIFTED_CASES
from checks.task4.half import run_16bit_part
from common.machine_code import MachineCodeError, kernel_instructions, tools_missing
from harness.outcome import Cause
from harness.sandbox import WorkerDied, WorkerError

# Where the Hopper kernel makes each of the common mistakes (harness/diagnose.py): the scale, the mask and the
# online softmax are step 19's; its key tiles are the reference's widths unless the student's file says otherwise
HOPPER_MISTAKES_STEP = 19
HOPPER_TILES = {"BLOCK_COLS": 192, "BLOCK_COLS_LARGE_D": 128}


# An mbarrier wait traps after seconds (device/hopper.cuh); these two wait forever
HUNG = ("the Hopper kernel hung without trapping: most often a turn that never comes (step 22: consumer 1's first "
        "arrival, the barrier ids) or a registers_take that no registers_release made room for (step 20)")


# What a kernel of the part must hold in its machine code (SASS mnemonics), and what each one is
HOPPER_INSTRUCTIONS = {"HGMMA": "wgmma (step 18)", "UTMALDG": "TMA loads (step 17)"}
INSTRUCTIONS_CASE = "the Hopper kernel computes with wgmma and loads with TMA (its machine code)"


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
    elif not report.stopped and all(c.passed for c in report.cases[before:]):
        instructions_case(report, worker)
    return report.end_part("hopper")


def instructions_case(report, worker) -> None:
    """Right numbers are not yet the part: a file that calls steps 8-11's `mma.sync` kernel gets them too. So one
    kernel of the built extension must hold wgmma and TMA loads, read from its machine code (never run). Where the
    disassembler is missing or cannot read the file, a note says it was not checked. A deterrent against a kernel
    of them that is never launched, not a proof: which kernel runs is the student's host code's choice."""
    missing = tools_missing()
    library = built_library(worker) if missing is None else None
    if missing is None and library is None:
        missing = "the worker did not name a built extension in its own build folder"
    try:
        kernels = kernel_instructions(library) if missing is None else {}
    except MachineCodeError as err:
        missing = str(err)
    if missing is not None:
        report.note(f"Not checked that the Hopper kernel computes with wgmma and loads with TMA: {missing}.")
        return
    report.run(INSTRUCTIONS_CASE, lambda: hopper_instructions_verdict(kernels))


def hopper_instructions_verdict(kernels: dict[str, set[str]]) -> tuple[bool, str, dict]:
    """Whether some kernel of `kernels` ({name: SASS mnemonics}) holds every one of HOPPER_INSTRUCTIONS."""
    closest = max(kernels.values(), key=lambda used: len(used & HOPPER_INSTRUCTIONS.keys()), default=set())
    lacking = [what for name, what in HOPPER_INSTRUCTIONS.items() if name not in closest]
    if not lacking:
        return True, "a kernel holds wgmma (HGMMA) and TMA loads (UTMALDG)", {}
    what = (f"holds {' or '.join(lacking)}" if len(lacking) == len(HOPPER_INSTRUCTIONS) else
            f"holds both wgmma and TMA loads (the closest has no {lacking[0]})")
    return False, (f"no kernel of the extension {what}: the right numbers came from other "
                   "instructions (steps 8-11's mma.sync kernel called from attention_hopper.cu gives them too), and "
                   "the Hopper part is the kernel built on Hopper's own (README, Task 4, steps 17-18)"), {}


def built_library(worker) -> Path | None:
    """The extension file the worker loaded, where it lies on this side: a file inside the worker's own build
    folder (mounted elsewhere inside bubblewrap: private_builds), or None."""
    try:
        said = worker.call("extension_file")
    except (WorkerError, WorkerDied):
        return None
    builds = getattr(worker, "builds", None)
    if not isinstance(said, str) or builds is None:
        return None
    path = Path(os.path.normpath(said))
    if not path.is_relative_to(builds):
        return None
    real = Path(getattr(worker, "private_builds", None) or builds) / path.relative_to(builds)
    return real if real.is_file() and not real.is_symlink() else None
