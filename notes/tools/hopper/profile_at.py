"""task4.profile --hopper --solution at another head_dim (device only), with each pipe's utilization added to the
report (issue 57: where head_dim 64's time goes: the tensor pipe, MUFU's ex2, the FMA pipe, issue slots, stalls):
PYTHONPATH=. python notes/tools/hopper/profile_at.py HEAD_DIM [--causal] (batch 8, heads 32, seq 4096; --raw report)."""
import runpy
import sys

import checks.task4.measure as measure
from harness import profile

head_dim, flags = int(sys.argv[1]), sys.argv[2:]
measure.PERF_CASE = (8, 32, 4096, head_dim)
at = profile.NCU_ARGS.index("--metrics") + 1  # ncu takes one --metrics: the pipes' added to its list
profile.NCU_ARGS[at] += (",regex:sm__inst_executed_pipe_.*\\.avg\\.pct_of_peak_sustained_active,"
                         "regex:sm__pipe_.*_cycles_active\\.avg\\.pct_of_peak_sustained_active,"
                         "smsp__issue_active.avg.pct_of_peak_sustained_active")
profile.NCU_ARGS += ["--section", "WarpStateStats", "--section", "InstructionStats"]
sys.argv = ["task4.profile", "--solution", "--hopper", "--raw", *flags]
runpy.run_module("task4.profile", run_name="__main__")
