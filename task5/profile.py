"""python -m task5.profile [--solution] [--raw]

Runs your decode kernel once at batch 16, 32 heads, 4096 cached tokens, head_dim 128 (one block
per head) under Nsight Compute (ncu) and prints what to act on: memory throughput against the
GPU's peak, the DRAM bytes read against the cache's size (2 x 16 x 32 x 4096 x 128 x 4 bytes =
2.15 GB: more means rows read twice), the warps per SM and what limits them, and why warps
waited. README, Task 5, step 4.
"""

import sys

from harness import profile
from checks.task5.measure import DECODE_BENCHMARKS

BATCH, HEADS, _, LENGTH, HEAD_DIM = DECODE_BENCHMARKS[0]  # as many key/value heads as query heads
SHAPE = (BATCH, HEADS, LENGTH, HEAD_DIM)

if __name__ == "__main__":
    sys.exit(profile.main(
        5, "decode_kernel", "profile_launch", lambda o: (*SHAPE, 1),
        lambda o: "decode batch {} heads {} cached tokens {} head_dim {}".format(*SHAPE),
        causal=False))
