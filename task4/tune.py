"""python -m task4.tune [--configs NAME=N,... ...] [--solution] [--build-only] [--jobs N] [--csv PATH]

Builds your kernel (task4/kernels/attention.cu) at several settings of its tile constants, side
by side, then checks each on a few edge cases and times it at batch 8, 32 heads, seq 4096,
head_dim 128, one at a time. One row per configuration: registers per thread, spills, shared
memory per block, threads and blocks per SM, time, TFLOP/s and the share of the GPU's float32
FFMA peak; the fastest correct one is marked with the lines to paste into your file. Writes
task4-tune.csv (and task4-tune.png when matplotlib is installed). README, Task 4, step 7.
"""

import sys

from harness import tune
from harness.reference import attention_flops, fp32_peak_tflops
from task4.measure import PERF_CASE, time_student
from task4.test import check_case, shape_text

# Each sets every constant, so a row means the same whatever the file says. The first is the
# skeleton's untuned start; the list covers the tile shapes, the micro-tile per thread, and
# the blocks per SM that __launch_bounds__ allows (registers per thread: 65536 / (threads x blocks)).
CONFIGS = [
    {"BLOCK_ROWS": 64, "BLOCK_COLS": 64, "THREAD_ROWS": 4, "THREAD_COLS": 4, "MIN_BLOCKS_PER_SM": 1},
    {"BLOCK_ROWS": 64, "BLOCK_COLS": 64, "THREAD_ROWS": 4, "THREAD_COLS": 4, "MIN_BLOCKS_PER_SM": 2},
    {"BLOCK_ROWS": 64, "BLOCK_COLS": 64, "THREAD_ROWS": 8, "THREAD_COLS": 4, "MIN_BLOCKS_PER_SM": 2},
    {"BLOCK_ROWS": 128, "BLOCK_COLS": 64, "THREAD_ROWS": 8, "THREAD_COLS": 4, "MIN_BLOCKS_PER_SM": 1},
    {"BLOCK_ROWS": 64, "BLOCK_COLS": 128, "THREAD_ROWS": 4, "THREAD_COLS": 8, "MIN_BLOCKS_PER_SM": 1},
    {"BLOCK_ROWS": 128, "BLOCK_COLS": 128, "THREAD_ROWS": 4, "THREAD_COLS": 8, "MIN_BLOCKS_PER_SM": 1},
    {"BLOCK_ROWS": 128, "BLOCK_COLS": 128, "THREAD_ROWS": 8, "THREAD_COLS": 8, "MIN_BLOCKS_PER_SM": 1},
]

# Edge cases each configuration must pass before it is timed: partial tiles, seq_q != seq_k,
# a padded head_dim, causal and not. The full checks stay `python -m task4.test`'s.
CHECKS = [((1, 2, 129, 129, 128), False), ((1, 2, 129, 129, 128), True), ((1, 2, 70, 200, 72), True),
          ((2, 1, 1, 65, 32), False)]


def measure(worker) -> tune.Measured:
    for n, (shape, causal) in enumerate(CHECKS):
        result = check_case(worker, shape, causal, seed=900 + 10 * n)
        if not result.passed:
            return tune.Measured(error=f"wrong at {shape_text(shape)}{' causal' if causal else ''}: "
                                       f"{result.message.splitlines()[0]}")
    b, h, s, d = PERF_CASE
    timing, count = time_student(worker, b, h, s, d, False)
    if count is None:
        return tune.Measured(error=f"timed run failed: {timing.splitlines()[0]}")
    tflops = attention_flops(b, h, s, s, d, False) / (timing.median_ms * 1e-3) / 1e12
    return tune.Measured(ms=timing.median_ms, throughput=tflops, share=100 * tflops / fp32_peak_tflops())


PLAN = tune.Plan(task=4, kernel_file="task4/kernels/attention.cu", timed_kernel="flash_attention_kernel<128, false>",
                 what="batch {} heads {} seq {} head_dim {}".format(*PERF_CASE), unit="TFLOP/s",
                 limit="FFMA peak", configs=CONFIGS, measure=measure)

if __name__ == "__main__":
    sys.exit(tune.main(PLAN))
