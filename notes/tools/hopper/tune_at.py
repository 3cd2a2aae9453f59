"""task4.tune --hopper at another head_dim, mask and size (device only; the reference solution), the file's
configuration and CONFIG... side by side in one run, each timed output checked:
PYTHONPATH=. python notes/tools/hopper/tune_at.py HEAD_DIM CAUSAL [--shape BATCH,HEADS,SEQ] CONFIG... (CONFIG as
--configs; the shape 8,32,4096 unless given: issue 57 also asks for 1,32,16384 and 16,32,1024)."""
import dataclasses
import sys

from torch.nn.attention import SDPBackend

import checks.task4.tune as t
from checks.task4.measure import time_student
from harness import tune

head_dim, causal, configs = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
shape = (8, 32, 4096)
if configs[:1] == ["--shape"]:
    shape, configs = tuple(int(n) for n in configs[1].split(",")), configs[2:]
case = (*shape, head_dim)


def measure(worker):
    b, h, s, d = case
    timing, count = time_student(worker, b, h, s, d, causal, dtype=t.torch.bfloat16, entry="run_batch_hopper")
    if count is None:
        return tune.Measured(error=f"timed run failed: {timing.splitlines()[0]}")
    tflops = t.attention_flops(b, h, s, s, d, causal) / (timing.median_ms * 1e-3) / 1e12
    return tune.Measured(ms=timing.median_ms, throughput=tflops, share=100 * tflops / t.half_tensor_core_bound_tflops())


also = t.sdpa_beside([("flash backend", SDPBackend.FLASH_ATTENTION), ("cuDNN backend", SDPBackend.CUDNN_ATTENTION)],
                     case, causal)
plan = dataclasses.replace(t.HOPPER_PLAN, measure=measure, also=also,
                           what="Hopper, bf16, batch {} heads {} seq {} head_dim {}".format(*case)
                           + (" causal" if causal else ""))
sys.exit(tune.main(plan, ["--solution", "--csv", f"/tmp/tune_{head_dim}_{int(causal)}.csv", "--configs", *configs]))
