"""python -m task5.tune [--half] [--configs NAME=N,... ...] [--solution] [--build-only] [--jobs N] [--csv PATH]

Builds your decode kernel (task5/kernels/decode.cu) at several settings of its constants (warps
per block, rows each lane loads before using them), side by side, then checks each on a few edge
cases and times it at batch 16, 32 heads, 4096 cached tokens, head_dim 128, one block per head,
one at a time. One row per configuration: registers, spills, shared memory, threads and blocks per
SM, time, GB/s of K and V read, and the share of the copy bandwidth measured in the same run; the
fastest correct one is marked with the lines to paste into your file. Then, with the file as it
is and once its split-KV passes a check, the long cache of one sequence (batch 1, 32 heads, 32768
cached tokens) at 1 to 64 splits and at your launcher's choice. Writes task5-tune.csv (and
task5-tune.png when matplotlib is installed). README, Task 5, step 4.

--half tunes step 6's 16-bit decode (task5/kernels/decode_half.cu) the same way: its warps, rows in flight and
query heads a block, checked in bf16 and fp16, timed in bf16 at batch 16, 32 query heads over 8 key/value heads
(Llama 3's grouping), 4096 cached tokens, head_dim 128, the launcher's splits.
"""

import functools
import sys

from harness import bench, tune
import torch

from checks.task5.measure import DECODE_BENCHMARKS, TimedDecode, time_student_decode
from checks.task5.cache_decode import check_decode, describe_decode, describe_grouped
from checks.task4.measure import HALF_TYPES
from checks.task5.half import check_half_decode

# Each sets both constants; the first is the skeleton's untuned start. (Fewer than 4 warps cannot merge a
# head_dim of 128, one column per thread: the kernel's static_assert refuses them.)
CONFIGS = [{"DECODE_WARPS": w, "UNROLL": u} for w, u in ((4, 1), (8, 1), (8, 2), (16, 2), (4, 4), (8, 4), (16, 4),
                                                          (8, 8))]
CHECKS = [((2, 3, 100, 33, 128), 1), ((1, 2, 200, 65, 64), 1), ((1, 3, 150, 129, 17), 1), ((2, 2, 300, 300, 80), 1),
          ((2, 8, 2, 100, 33, 128, None), 1)]  # the last: 4 query heads per cached head


@functools.cache
def copy_gbs() -> float:
    """Measured once, at the first configuration, with no worker busy on the GPU."""
    return bench.copy_bandwidth_gbs()


def measure(worker) -> tune.Measured:
    copy_gbs()  # now, before this configuration's worker runs anything on the GPU
    for n, (shape, splits) in enumerate(CHECKS):
        result = check_decode(worker, shape, 700 + 10 * n, splits)
        if not result.passed:
            described = describe_grouped(shape) if len(shape) > 5 else describe_decode(shape)
            return tune.Measured(error=f"wrong at {described}: {result.message.splitlines()[0]}")
    timed = TimedDecode(*DECODE_BENCHMARKS[0])
    timing = time_student_decode(worker, timed, 1)
    if isinstance(timing, str):
        return tune.Measured(error=f"timed run failed: {timing.splitlines()[0]}")
    gbs = timed.bytes_read / (timing.median_ms * 1e-3) / 1e9
    return tune.Measured(ms=timing.median_ms, throughput=gbs, share=100 * gbs / copy_gbs())


SPLITS = (1, 2, 4, 8, 16, 32, 64, 0)  # 0: the launcher's own choice (decode_splits)


def split_counts(worker) -> list[str]:
    """the long cache of one sequence at several split counts (split-KV, README step 3)"""
    batch, heads, kv_heads, length, d = DECODE_BENCHMARKS[1]
    title = f"split-KV at decode batch {batch} heads {heads} cached tokens {length} head_dim {d} (the file as it is):"
    checked = check_decode(worker, (1, 2, 300, 257, 64), 790, 5)
    if not checked.passed:
        return [title, f"  not timed: split-KV fails a check ({checked.message.splitlines()[0][:200]}); python -m "
                       "task5.test --split"]
    timed = TimedDecode(batch, heads, kv_heads, length, d)
    lines = [title, f"  {'splits':>28}  {'ms':>6}  {'GB/s':>6}  % copy"]
    for splits in SPLITS:
        used = worker.call("splits_for", batch, heads, kv_heads, length, d) if splits == 0 else splits
        timing = time_student_decode(worker, timed, splits)
        if isinstance(timing, str):
            lines.append(f"  {splits:>28}  not timed: {timing.splitlines()[0][:200]}")
            continue
        gbs = timed.bytes_read / (timing.median_ms * 1e-3) / 1e9
        name = f"{str(used)[:12]} (the launcher's choice)" if splits == 0 else str(splits)
        lines.append(f"  {name:>28}  {timing.median_ms:6.3f}  {gbs:6.0f}  {100 * gbs / copy_gbs():5.0f}%")
    return lines + ["  decode_splits picks the count: MIN_KEYS_PER_SPLIT and the SM count are its inputs (README, "
                    "Task 5, step 4)"]


BENCHMARK_SHAPE = [n for i, n in enumerate(DECODE_BENCHMARKS[0]) if i != 2]  # kv_heads == heads: left out
PLAN = tune.Plan(task=5, kernel_file="task5/kernels/decode.cu", timed_kernel="decode_kernel<4, 32, 1>",
                 what="decode batch {} heads {} cached tokens {} head_dim {}, one block per head".format(
                     *BENCHMARK_SHAPE), unit="GB/s", limit="copy bandwidth", configs=CONFIGS, measure=measure,
                 also=split_counts)



# The 16-bit decode's knobs (step 6, kernels/decode_half.cu): the file's first, then fewer rows in flight, fewer warps,
# more of both, and 2 query heads a block (each key/value head then read twice for a group of 4). A block of 4 query
# heads holds UNROLL / 2 rows in flight (attend_rows), so the last one holds 4 where the first holds 2.
HALF_CONFIGS = [{"DECODE_WARPS": w, "UNROLL": u, "MAX_QUERIES": q}
                for w, u, q in ((16, 4, 4), (16, 2, 4), (8, 4, 4), (8, 8, 4), (16, 8, 4), (16, 4, 2))]
HALF_CHECKS = [((2, 8, 2, 100, 33, 128, None), 1), ((1, 12, 3, 60, 41, 8, None), 1), ((2, 6, 3, 600, 513, 80, (0, 500)), 3)]
HALF_BENCHMARK = (16, 32, 8, 4096, 128, torch.bfloat16)  # (batch, heads, kv_heads, cached tokens, head_dim, dtype)


def measure_half(worker) -> tune.Measured:
    copy_gbs()
    for n, (shape, splits) in enumerate(HALF_CHECKS):
        for name, dtype in HALF_TYPES.items():
            passed, message, _ = tune_verdict(check_half_decode(worker, shape, 800 + 10 * n, splits, dtype))
            if not passed:
                return tune.Measured(error=f"wrong at {name} {describe_grouped(shape)}: {message.splitlines()[0]}")
    timed = TimedDecode(*HALF_BENCHMARK)
    timing = time_student_decode(worker, timed, 0)
    if isinstance(timing, str):
        return tune.Measured(error=f"timed run failed: {timing.splitlines()[0]}")
    gbs = timed.bytes_read / (timing.median_ms * 1e-3) / 1e9
    return tune.Measured(ms=timing.median_ms, throughput=gbs, share=100 * gbs / copy_gbs())


def tune_verdict(result) -> tuple[bool, str, dict]:
    """A check's verdict as (passed, message, metrics), from a tuple or a CheckResult (a diagnosed failure)."""
    if isinstance(result, tuple):
        return result
    return result.passed, result.message, {}


HALF_PLAN = tune.Plan(task=5, kernel_file="task5/kernels/decode_half.cu",
                      timed_kernel=lambda values: "decode_kernel<__nv_bfloat16, 8, 16, {}, false>".format(
                          min(4, values.get("MAX_QUERIES", 4))),
                      what="bf16 decode batch {} heads {} ({} kv heads) cached tokens {} head_dim {}, the launcher's "
                           "splits".format(*HALF_BENCHMARK[:5]), unit="GB/s", limit="copy bandwidth",
                      configs=HALF_CONFIGS, measure=measure_half, part="the optional bf16/fp16 decode (step 6)")


def main() -> int:
    return tune.main(PLAN, half=HALF_PLAN)


if __name__ == "__main__":
    sys.exit(main())
