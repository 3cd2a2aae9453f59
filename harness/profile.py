"""Nsight Compute's report of one kernel launch, cut down to the dozen lines a student can act on.

`ncu` (it comes with the CUDA toolkit) replays a kernel many times to read the GPU's hardware
counters and prints tables of metrics. `parse_ncu` reads that text (`ncu --page details`, the
default) and `summary` turns it into: how busy the SMs and memory were, how many warps were
resident and what limited them, how often a warp issued an instruction, why warps waited
(the stall reasons, in cycles per issued instruction), and shared-memory bank conflicts.

NCU_ARGS are the sections and metrics `summary` reads; anything missing from a report is
left out of the summary rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
METRICS = [
    "regex:" + re.escape(STALL_PREFIX) + ".*" + re.escape(STALL_SUFFIX),
    "smsp__inst_executed.sum",
    "smsp__inst_executed_op_shared_ld.sum",
    "smsp__inst_executed_op_shared_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "dram__bytes_read.sum",
]
SECTIONS = ["SpeedOfLight", "LaunchStats", "Occupancy", "ComputeWorkloadAnalysis", "SchedulerStats"]
NCU_ARGS = [a for s in SECTIONS for a in ("--section", s)] + ["--metrics", ",".join(METRICS)]

_KERNEL = re.compile(r"^\s{2}(?:void )?(?:\(anonymous namespace\)::)?(?P<name>[\w:<>, ]+?)\(.*\) "
                     r"(?P<grid>\([\d, ]+\))x(?P<block>\([\d, ]+\))")  # a kernel of an anonymous namespace too
_SECTION = re.compile(r"^\s{4}Section: (?P<name>.+?)\s*$")
_ROW = re.compile(r"^\s{4}(?P<name>\S(?:.*?\S)?)\s{2,}(?:(?P<unit>[^\s\d][^\s]*)\s+)?(?P<value>-?[\d,]*\.?\d+)\s*$")
BYTES = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12}  # ncu's units for byte counts
# Why a warp was not issuing, in the words a student can look up (the rest keep ncu's name).
STALL_WORDS = {
    "barrier": "barrier (__syncthreads: warps wait for the slowest)",
    "dispatch_stall": "dispatch stall (often register bank conflicts)",
    "long_scoreboard": "long scoreboard (waiting for global or local memory)",
    "short_scoreboard": "short scoreboard (waiting for shared memory, shuffles, exp)",
    "mio_throttle": "MIO throttle (too many shared-memory instructions queued)",
    "math_pipe_throttle": "math pipe throttle (the arithmetic unit is busy)",
    "not_selected": "not selected (another warp issued: enough work)",
    "wait": "wait (a fixed-latency dependency)",
    "lg_throttle": "LG throttle (too many global-memory instructions queued)",
}


@dataclass
class Launch:
    kernel: str
    grid: str
    block: str
    metrics: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)  # (section, name) -> (unit, value)

    def _row(self, name: str, section: str | None) -> tuple[str, float] | None:
        """(unit, value) of the first metric of that name, in that section if one is given."""
        return next((row for (sec, metric), row in self.metrics.items()
                     if metric == name and section in (None, sec)), None)

    def get(self, name: str, section: str | None = None) -> float | None:
        row = self._row(name, section)
        return row[1] if row else None

    def unit(self, name: str, section: str | None = None) -> str:
        row = self._row(name, section)
        return row[0] if row else ""


def parse_ncu(text: str) -> list[Launch]:
    """Every profiled launch in ncu's details text, with its metrics by section."""
    launches: list[Launch] = []
    section = ""
    for line in text.splitlines():
        kernel = _KERNEL.match(line)
        if kernel:
            launches.append(Launch(kernel["name"].strip(), kernel["grid"], kernel["block"]))
            continue
        head = _SECTION.match(line)
        if head:
            section = head["name"]
            continue
        row = _ROW.match(line)
        if row and launches:
            launches[-1].metrics[(section, row["name"])] = (row["unit"] or "", float(row["value"].replace(",", "")))
    return launches


AT_THE_BOUND = 80  # percent of peak at which a kernel is said to run at the memory or the compute bound


def _count(x: float) -> str:
    for size, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if x >= size:
            return f"{x / size:.3g}{suffix}"
    return f"{x:g}"


def summary(launch: Launch) -> list[str]:
    """The lines a student acts on; a figure the report lacks is left out."""
    g = launch.get
    lines = [f"kernel {launch.kernel}, grid {launch.grid} x block {launch.block}"]
    duration, clock = g("Duration", "GPU Speed Of Light Throughput"), g("SM Frequency")
    if duration is not None:
        lines.append(f"  duration {duration:g} {launch.unit('Duration')} under ncu"
                     + (f", which fixes the SM clock at {clock:g} GHz: time it with the task's test, not here" if clock else ""))
    sm, mem, dram = g("Compute (SM) Throughput"), g("Memory Throughput", "GPU Speed Of Light Throughput"), g("DRAM Throughput")
    # At one of the bounds, what does not limit the kernel is left out: the rest of it is the bound
    # DRAM's share, not "Memory Throughput" (the busiest of DRAM, L2 and L1, which shared-memory traffic can fill)
    memory_bound = dram is not None and dram >= AT_THE_BOUND
    compute_bound = sm is not None and sm >= AT_THE_BOUND and not memory_bound
    if sm is not None and mem is not None:
        lines.append(f"  compute (SM) {sm:g}% of peak, memory {mem:g}% of peak" + (f" (DRAM {dram:g}%)" if dram is not None else ""))
    if memory_bound:
        lines.append(f"  at the memory bound (DRAM {dram:g}% >= {AT_THE_BOUND}% of peak): instructions, shared-memory "
                     "bank conflicts and occupancy do not limit it; only reading fewer bytes would (the DRAM read below "
                     "against what it must read)")
    elif compute_bound:
        lines.append(f"  at the compute bound (SM {sm:g}% >= {AT_THE_BOUND}% of peak): memory does not limit it; fewer "
                     "or cheaper instructions would (the stalls below)")
    issued = g("Issue Slots Busy")
    if issued is not None and not memory_bound:
        lines.append(f"  issue slots busy {issued:g}%: the share of cycles in which a scheduler issued an instruction")
    achieved, theoretical = g("Achieved Active Warps Per SM"), g("Theoretical Active Warps per SM")
    limits = {what: g(f"Block Limit {name}") for name, what in (("Registers", "registers"), ("Shared Mem", "shared memory"),
                                                               ("Warps", "warps"), ("SM", "the SM's block limit"))}
    limits = {what: v for what, v in limits.items() if v is not None}
    if achieved is not None and theoretical is not None:
        line = f"  occupancy: {achieved:g} warps per SM resident, {theoretical:g} possible"
        if limits:
            fewest = min(limits.values())
            by = [what for what, v in limits.items() if v == fewest]
            line += f"; blocks per SM limited to {fewest:g} by {' and '.join(by)}"
        registers, smem = g("Registers Per Thread"), g("Dynamic Shared Memory Per Block")
        if registers is not None:
            line += f" ({registers:g} registers per thread"
            kb = launch.unit("Dynamic Shared Memory Per Block").lower().startswith("kbyte")
            line += f", {smem:g} {'KB' if kb else 'B'} of dynamic shared memory per block)" if smem else ")"
        lines.append(line)
    stalls = {name[len(STALL_PREFIX):-len(STALL_SUFFIX)]: value for (_, name), (_, value) in launch.metrics.items()
              if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX)}
    stalls.pop("selected", None)  # the cycle the instruction issues: not a stall
    top = sorted((v, k) for k, v in stalls.items() if v >= 0.01)[::-1][:4]
    if top:
        lines.append("  cycles a warp waited per instruction it issued, by reason:")
        lines += [f"    {value:.2f}  {STALL_WORDS.get(name, name.replace('_', ' '))}" for value, name in top]
    for op, what in (() if memory_bound else (("ld", "loads"), ("st", "stores"))):
        conflicts = g(f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum")
        count = g(f"smsp__inst_executed_op_shared_{op}.sum")
        if conflicts is not None and count:
            extra = conflicts / count
            lines.append(f"  shared-memory {what}: {_count(count)} warp instructions, {_count(conflicts)} bank conflicts "
                         f"({extra:.2g} extra pass{'' if extra == 1 else 'es'} per instruction)")
    read = g("dram__bytes_read.sum")
    if read is not None and not compute_bound:
        unit = launch.unit("dram__bytes_read.sum")
        scale = BYTES.get(unit.lower() or "byte")
        lines.append(f"  DRAM read: {read * scale / 1e9:.3g} GB" if scale else f"  DRAM read: {read:g} {unit}")
    return lines


# -- python -m taskN.profile ---------------------------------------------------------------------

NO_NCU = ("ncu (Nsight Compute) was not found: it comes with the CUDA toolkit, next to nvcc (CUDA_HOME/bin), or "
          "as the nsight-compute package; put it on your PATH (for example `module load cuda`) and run this again")
NO_COUNTERS = ("ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM): run it as root, or ask the "
               "administrator to allow profiling for all users (the driver option NVreg_RestrictProfilingToAdminUsers=0; "
               "https://developer.nvidia.com/ERR_NVGPUCTRPERM)")


def main(task: int, kernel: str, entry: str, args_of, what_of, argv=None, causal: bool = True,
         **optional: tuple[str, str, str]) -> int:
    """`python -m taskN.profile`: one launch of the kernel named `kernel` under ncu, in the task's worker.

    The worker runs under ncu (its report goes to a pipe only this process reads, as the
    sanitizer's does); the entry point `entry` makes its own inputs at the standard size,
    `args_of(options)`, and launches the kernel once. optional: (help, kernel, entry) of each of the
    task's optional parts by flag (half=... is profiled instead of `kernel` with --half).
    """
    import argparse
    import time
    from pathlib import Path

    import torch

    from common.impl import REPO, add_solution_flag, label
    from harness.sandbox import Worker, WorkerDied, WorkerError

    parser = argparse.ArgumentParser(prog=f"python -m task{task}.profile",
                                     description=f"One launch of task {task}'s kernel under Nsight Compute, summarised.")
    add_solution_flag(parser, task, "profile the reference solution instead of your code",
                      f"python -m task{task}.profile profiles your own kernel")
    if causal:
        parser.add_argument("--causal", action="store_true", help="with the causal mask")
    parser.add_argument("--student-dir", type=Path, default=REPO, help=argparse.SUPPRESS)
    for flag, (said, _, _) in optional.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag, action="store_true", help=said)
    parser.add_argument("--raw", action="store_true", help="also print ncu's whole report")
    options = parser.parse_args(argv)
    chosen = [flag for flag in optional if getattr(options, flag)]
    if len(chosen) > 1:
        print(f"task {task}: {' and '.join('--' + f for f in chosen)}: one optional part at a time")
        return 2
    if chosen:
        _, kernel, entry = optional[chosen[0]]
    from common.nvcc import find_cuda_tool

    ncu = find_cuda_tool("ncu")
    if ncu is None:
        print(NO_NCU)
        return 1
    if not torch.cuda.is_available():
        print("no CUDA GPU is visible: profiling needs one")
        return 1
    command = [ncu, *NCU_ARGS, "--kernel-name", f"regex:{kernel}", "--launch-count", "1", "--target-processes", "all"]
    print(f"task {task} ({label(options.solution)}): {what_of(options)} under ncu (one launch, replayed for each "
          "counter: under a minute) ...")
    started = time.perf_counter()
    worker = Worker(task, options.student_dir, solution=options.solution, sanitize=command, purpose="profile")
    try:
        worker.start()
        worker.call(entry, *args_of(options), timeout=600)
    except WorkerError as err:
        print(f"task {task}: {err.kind}: {err.message}")
        return 1
    except WorkerDied as err:
        print(f"task {task}: {err}")
        return 1
    finally:
        worker.__exit__(None, None, None)
    text = worker.sanitizer_log.decode(errors="replace")
    if options.raw:
        print(text)
    if "ERR_NVGPUCTRPERM" in text:
        print(NO_COUNTERS)
        return 1
    launches = parse_ncu(text)
    if not launches:
        said = [line for line in text.splitlines() if "ERROR" in line or "WARNING" in line][:5]
        print(f"ncu profiled no launch of {kernel}" + (": " + " / ".join(said) if said else " (run with --raw to see "
                                                           "what ncu said)"))
        return 1
    print("\n".join(summary(launches[0])))
    print(f"({time.perf_counter() - started:.0f} s; --raw prints ncu's whole report)")
    return 0
