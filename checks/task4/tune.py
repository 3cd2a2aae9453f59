"""python -m task4.tune [--half | --backward | --hopper | --backward-half] [--configs NAME=N,... ...] [--solution]
       [--build-only] [--jobs N] [--csv PATH]

Builds your kernel (task4/kernels/attention.cu) at several settings of its tile constants, side
by side, then checks each on a few edge cases and times it at batch 8, 32 heads, seq 4096,
head_dim 128, one at a time. One row per configuration: registers per thread, spills, shared
memory per block, threads and blocks per SM, time, TFLOP/s and the share of the GPU's float32
FFMA peak; the fastest correct one is marked with the lines to paste into your file. Writes
task4-tune.csv (and task4-tune.png when matplotlib is installed). README, Task 4, step 7.

--half: the optional bf16/fp16 kernel (task4/kernels/attention_half.cu, steps 8-11) in bf16, its
knobs (warps per block, tile keys, what is unrolled or kept in registers), against the
tensor cores' bound for 16-bit products, with SDPA's flash backend timed beside the file as it is;
writes task4-half-tune.csv.

--backward: the optional backward kernels (task4/kernels/attention_backward.cu, steps 12-16), their tile sizes
(both kernels share them), timed as python -m task4.test --backward times them (the dK/dV kernel's figures in
the table), with SDPA's backward pass beside; writes task4-backward-tune.csv.

--hopper: the optional Hopper kernel (task4/kernels/attention_hopper.cu, steps 17-22, compute capability 9.0) in bf16,
its K/V stages, step 21's overlap, step 22's turns and the registers' split between producer and consumers, with
SDPA's flash and cuDNN backends timed beside the file as it is; writes task4-hopper-tune.csv.

--backward-half: the optional 16-bit backward kernels (task4/kernels/attention_backward_half.cu, steps 27-30) in
bf16, warps a block and queries a tile, timed as python -m task4.test --backward-half times them, with SDPA's flash
backward beside; writes task4-backward-half-tune.csv.
"""

import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import bench, tune
from harness.attention_math import attention_flops, fp32_peak_tflops, half_tensor_core_bound_tflops
from checks.task4.measure import PERF_CASE, time_here, time_student
from checks.task4.measure_backward import (BACKWARD_FLOPS, BACKWARD_HALF_BENCHMARKS, time_sdpa_backward,
                                           time_student_backward)
from checks.task4.backward import backward_text, check_backward_case
from checks.task4.backward_half import check_backward_half_case
from checks.task4.forward import check_case, shape_text
from checks.task4.half import check_half_case
from checks.task4.hopper import HOPPER_MISTAKES_STEP, HOPPER_TILES

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


PLAN = tune.Plan(task=4, kernel_file="task4/kernels/attention.cu",
                 timed_kernel="flash_attention_kernel<128, false, false>",
                 what="batch {} heads {} seq {} head_dim {}".format(*PERF_CASE), unit="TFLOP/s",
                 limit="FFMA peak", configs=CONFIGS, measure=measure)

# The bf16/fp16 kernel's knobs (the skeleton's values first: 4 warps, 8 above head_dim 96, 64-key tiles, Q's
# k16 steps unrolled). Timed at head_dim 128, where the knobs matter most.
HALF_CONFIGS = [
    {"BLOCK_WARPS_LARGE_D": 8, "BLOCK_COLS": 64, "Q_STEPS_UNROLLED": 8},
    {"BLOCK_WARPS_LARGE_D": 4, "BLOCK_COLS": 64, "Q_STEPS_UNROLLED": 8},
    {"BLOCK_WARPS_LARGE_D": 8, "BLOCK_COLS": 64, "Q_STEPS_UNROLLED": 1},
    {"BLOCK_WARPS_LARGE_D": 8, "BLOCK_COLS": 32, "Q_STEPS_UNROLLED": 8},
    {"BLOCK_WARPS_LARGE_D": 8, "BLOCK_COLS": 64, "Q_STEPS_UNROLLED": 8, "LOADS_UNROLLED_UP_TO": 128},
]


def measure_16bit(worker, call: str = "forward_half") -> tune.Measured:
    """The bf16/fp16 kernel (`call` "forward_hopper": the Hopper one) on the checks, then timed in bf16."""
    hopper = call == "forward_hopper"
    how = dict(constants=HOPPER_TILES, call=call, step=HOPPER_MISTAKES_STEP) if hopper else {}
    for n, (shape, causal) in enumerate(CHECKS):
        result = check_half_case(worker, shape, causal, seed=900 + 10 * n, dtype=torch.bfloat16, **how)
        if not result.passed:
            return tune.Measured(error=f"wrong at {shape_text(shape)}{' causal' if causal else ''}: "
                                       f"{result.message.splitlines()[0]}")
    b, h, s, d = PERF_CASE
    timing, count = time_student(worker, b, h, s, d, False, dtype=torch.bfloat16,
                                 entry="run_batch_hopper" if hopper else None)
    if count is None:
        return tune.Measured(error=f"timed run failed: {timing.splitlines()[0]}")
    tflops = attention_flops(b, h, s, s, d, False) / (timing.median_ms * 1e-3) / 1e12
    return tune.Measured(ms=timing.median_ms, throughput=tflops, share=100 * tflops / half_tensor_core_bound_tflops())


def measure_half(worker) -> tune.Measured:
    return measure_16bit(worker)


def sdpa_beside(backends, case=PERF_CASE, causal=False):
    """SDPA's `backends` ((name, SDPBackend) pairs) at the same case and mask, in bf16, one line each."""
    def lines(worker) -> list[str]:
        b, h, s, d = case
        said = []
        for name, backend in backends:
            def run(q, k, v, o):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0 / math.sqrt(d))
            try:
                timing = time_here(run, b, h, s, d, 1, torch.bfloat16)
            except RuntimeError as err:  # no such kernel for this GPU: said
                timing = f"not available here ({str(err).splitlines()[0][:120]})"
            said.append(f"SDPA's {name}, bf16, same case: {bench.timing_text(timing)}"
                        + (f", {attention_flops(b, h, s, s, d, causal) / (timing.median_ms * 1e-3) / 1e12:.0f} TFLOP/s"
                           if not isinstance(timing, str) else ""))
        return said
    lines.__doc__ = "SDPA's " + " and ".join(name for name, _ in backends) + " at the same case, in bf16"
    return lines


sdpa_flash_beside = sdpa_beside([("flash backend (FlashAttention-2)", SDPBackend.FLASH_ATTENTION)])


def half_timed_kernel(values: dict[str, int]) -> str:
    """The instance the launcher runs at head_dim 128 in bf16: 8-warp blocks of BLOCK_COLS-key tiles where this GPU
    lets a block have their shared memory (H100, A100), else 4 warps and BLOCK_COLS_SMALL (the file's launcher)."""
    warps, cols = values.get("BLOCK_WARPS_LARGE_D"), values.get("BLOCK_COLS")
    rows = warps * 16 * values.get("M_TILES", 2) if warps else 0
    smem = (rows + 4 * (cols or 0)) * (128 + values.get("PAD", 8)) * 2
    per_block = getattr(torch.cuda.get_device_properties(0), "shared_memory_per_block_optin", None) \
        if torch.cuda.is_available() else None
    if per_block is not None and smem > per_block:
        warps, cols = values.get("BLOCK_WARPS"), values.get("BLOCK_COLS_SMALL")
    return f"flash_attention_half_kernel<__nv_bfloat16, 128, {cols}, {warps}, true>"


HALF_PLAN = tune.Plan(task=4, kernel_file="task4/kernels/attention_half.cu", timed_kernel=half_timed_kernel,
                      what="bf16, batch {} heads {} seq {} head_dim {}".format(*PERF_CASE), unit="TFLOP/s",
                      limit="16-bit tensor-core bound", configs=HALF_CONFIGS, measure=measure_half,
                      also=sdpa_flash_beside, part="the optional bf16/fp16 kernel")

# The Hopper kernel's knobs (kernels/attention_hopper.cu, steps 17-22): the skeleton's first, then a third K/V stage
# (it fits beside Q at head_dim 128: 225 KB), step 21's overlap, step 22's turns, persistent blocks with and without
# their turns carried on, and the registers split otherwise between producer and consumers.
_HOPPER_KNOBS = ("STAGES", "PRODUCER_REGISTERS", "CONSUMER_REGISTERS", "OVERLAP", "PINGPONG", "PERSISTENT",
                 "CHAIN_TURNS")
HOPPER_CONFIGS = [dict(zip(_HOPPER_KNOBS, values)) for values in [
    (2, 24, 240, 0, 0, 0, 1),
    (3, 24, 240, 0, 0, 0, 1),
    (3, 24, 240, 1, 0, 0, 1),
    (2, 24, 240, 1, 1, 0, 1),
    (3, 24, 240, 1, 1, 0, 1),
    (3, 24, 240, 1, 1, 1, 0),
    (3, 24, 240, 1, 1, 1, 1),
    (3, 40, 232, 1, 1, 1, 1),
]]


def measure_hopper(worker) -> tune.Measured:
    return measure_16bit(worker, "forward_hopper")


HOPPER_PLAN = tune.Plan(task=4, kernel_file="task4/kernels/attention_hopper.cu",
                        timed_kernel="flash_attention_hopper_kernel<__nv_bfloat16, 2, false, false>",
                        what="Hopper, bf16, batch {} heads {} seq {} head_dim {}".format(*PERF_CASE), unit="TFLOP/s",
                        limit="16-bit tensor-core bound", configs=HOPPER_CONFIGS, measure=measure_hopper,
                        also=sdpa_beside([("flash backend (FlashAttention-2)", SDPBackend.FLASH_ATTENTION),
                                          ("cuDNN backend", SDPBackend.CUDNN_ATTENTION)]),
                        part="the optional Hopper kernel (compute capability 9.0)")

# The backward kernels' tiles (kernels/attention_backward.cu; both kernels share them): the file's first, then
# other shapes of a thread's piece, more rows a block (each walked tile serves more of them; a thread's accumulators
# grow), fewer. Wider walked tiles do not fit in shared memory at head_dim 128 (the file's static_assert says so).
BACKWARD_CONFIGS = [
    {"BLOCK_ROWS": 64, "BLOCK_COLS": 64, "THREAD_ROWS": 4, "THREAD_COLS": 4},
    {"BLOCK_ROWS": 64, "BLOCK_COLS": 32, "THREAD_ROWS": 4, "THREAD_COLS": 2},
    {"BLOCK_ROWS": 64, "BLOCK_COLS": 64, "THREAD_ROWS": 2, "THREAD_COLS": 8},
    {"BLOCK_ROWS": 128, "BLOCK_COLS": 32, "THREAD_ROWS": 8, "THREAD_COLS": 2},
    {"BLOCK_ROWS": 32, "BLOCK_COLS": 64, "THREAD_ROWS": 2, "THREAD_COLS": 4},
]
BACKWARD_CHECKS = [((1, 2, 2, 129, 129, 128), False), ((1, 2, 2, 129, 129, 128), True), ((1, 4, 2, 70, 200, 72), True),
                   ((2, 1, 1, 1, 65, 32), False)]


def measure_backward(worker) -> tune.Measured:
    for n, (shape, causal) in enumerate(BACKWARD_CHECKS):
        result = check_backward_case(worker, shape, causal, seed=900 + 10 * n)
        passed, message = (result.passed, result.message) if hasattr(result, "passed") else result[:2]
        if not passed:
            return tune.Measured(error=f"wrong at {backward_text(shape)}{' causal' if causal else ''}: "
                                       f"{message.splitlines()[0]}")
    b, h, s, d = PERF_CASE
    timing, count = time_student_backward(worker, b, h, s, d, False)
    if count is None:
        return tune.Measured(error=f"timed run failed: {timing.splitlines()[0]}")
    tflops = BACKWARD_FLOPS * attention_flops(b, h, s, s, d, False) / (timing.median_ms * 1e-3) / 1e12
    return tune.Measured(ms=timing.median_ms, throughput=tflops, share=100 * tflops / fp32_peak_tflops())


def sdpa_backward_beside(worker) -> list[str]:
    """SDPA's backward pass (efficient backend, float32) at the same case"""
    b, h, s, d = PERF_CASE
    t_sdpa = time_sdpa_backward(b, h, s, d, False)
    return [f"SDPA's backward pass (efficient backend, float32), same case: {bench.timing_text(t_sdpa)}"]


BACKWARD_PLAN = tune.Plan(task=4, kernel_file="task4/kernels/attention_backward.cu",
                          timed_kernel="flash_attention_dkdv_kernel<128, false>",
                          what="backward, batch {} heads {} seq {} head_dim {}".format(*PERF_CASE),
                          unit="TFLOP/s (2.5x the forward's flops)", limit="FFMA peak", configs=BACKWARD_CONFIGS,
                          measure=measure_backward, also=sdpa_backward_beside, part="the optional backward kernels")



# The 16-bit backward's knobs (kernels/attention_backward_half.cu): the file's first (8 warps: 128 keys a block, 32
# queries a tile), then 64-query tiles (fewer turns of the loop, more registers: they spill at 8 warps) and 4-warp
# blocks (64 keys: more blocks, each walked query tile serving fewer keys).
BACKWARD_HALF_CONFIGS = [{"WARPS": 8, "BLOCK_QUERIES": 32}, {"WARPS": 8, "BLOCK_QUERIES": 64},
                         {"WARPS": 4, "BLOCK_QUERIES": 32}, {"WARPS": 4, "BLOCK_QUERIES": 64}]
BACKWARD_HALF_CASE = BACKWARD_HALF_BENCHMARKS[1]  # batch 4, 32 heads, 2048 tokens, head_dim 128


def measure_backward_half(worker) -> tune.Measured:
    for n, (shape, causal) in enumerate(BACKWARD_CHECKS):
        tiles = (128, 32)  # the mistakes' tiles only name a mistake: a wrong row fails either way
        result = check_backward_half_case(worker, shape, causal, 900 + 10 * n, torch.bfloat16, tiles=tiles)
        passed, message = (result.passed, result.message) if hasattr(result, "passed") else result[:2]
        if not passed:
            return tune.Measured(error=f"wrong at bf16 {backward_text(shape)}{' causal' if causal else ''}: "
                                       f"{message.splitlines()[0]}")
    b, h, s, d = BACKWARD_HALF_CASE
    timing, count = time_student_backward(worker, b, h, s, d, False, torch.bfloat16)
    if count is None:
        return tune.Measured(error=f"timed run failed: {timing.splitlines()[0]}")
    tflops = BACKWARD_FLOPS * attention_flops(b, h, s, s, d, False) / (timing.median_ms * 1e-3) / 1e12
    return tune.Measured(ms=timing.median_ms, throughput=tflops, share=100 * tflops / half_tensor_core_bound_tflops())


def sdpa_flash_backward_beside(worker) -> list[str]:
    """SDPA's backward pass (flash backend, bf16) at the same case"""
    b, h, s, d = BACKWARD_HALF_CASE
    t_sdpa = time_sdpa_backward(b, h, s, d, False, torch.bfloat16)
    flops = BACKWARD_FLOPS * attention_flops(b, h, s, s, d, False)
    return [f"SDPA's backward pass (flash backend, FlashAttention-2's, bf16), same case: {bench.timing_text(t_sdpa)}"
            + (f", {flops / (t_sdpa.median_ms * 1e-3) / 1e12:.0f} TFLOP/s" if not isinstance(t_sdpa, str) else "")]


BACKWARD_HALF_PLAN = tune.Plan(
    task=4, kernel_file="task4/kernels/attention_backward_half.cu",
    timed_kernel=lambda values: "flash_attention_dkdv_half_kernel<__nv_bfloat16, 128, {}>".format(
        values.get("BLOCK_QUERIES")),
    what="bf16 backward, batch {} heads {} seq {} head_dim {}".format(*BACKWARD_HALF_CASE),
    unit="TFLOP/s (2.5x the forward's flops)", limit="16-bit tensor-core bound", configs=BACKWARD_HALF_CONFIGS,
    measure=measure_backward_half, also=sdpa_flash_backward_beside, part="the optional 16-bit backward kernels")


def main() -> int:
    return tune.main(PLAN, half=HALF_PLAN, backward=BACKWARD_PLAN, hopper=HOPPER_PLAN, backward_half=BACKWARD_HALF_PLAN)


if __name__ == "__main__":
    sys.exit(main())
