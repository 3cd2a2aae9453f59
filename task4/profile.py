"""python -m task4.profile [--half | --backward | --hopper | --backward-half] [--solution] [--causal] [--raw]

Runs your kernel once at batch 8, 32 heads, seq 4096, head_dim 128 under Nsight Compute (ncu)
and prints what to act on: compute and memory throughput against the GPU's peaks, how often the
schedulers issued, the warps resident per SM and what limits them, why warps waited, and
shared-memory bank conflicts. README, Task 4, step 7. --half: the optional bf16 kernel of
kernels/attention_half.cu (steps 8-11) instead, same size. --backward: the dK/dV kernel of
kernels/attention_backward.cu (steps 12-16), out and L from your forward_lse, same size. --hopper: the Hopper
kernel of kernels/attention_hopper.cu (steps 17-22, compute capability 9.0) in bf16, same size. --backward-half: the
16-bit dK/dV kernel of kernels/attention_backward_half.cu (steps 27-30) in bf16, out and L from your 16-bit
forward_lse, same size.
"""

import sys

from harness import profile
from checks.task4.measure import PERF_CASE

if __name__ == "__main__":
    sys.exit(profile.main(
        4, "flash_attention_kernel", "profile_launch", lambda o: (*PERF_CASE, o.causal),
        lambda o: ("bf16, " if o.half else "backward, " if o.backward else "Hopper bf16, " if o.hopper
                   else "bf16 backward, " if o.backward_half else "")
        + "batch {} heads {} seq {} head_dim {}".format(*PERF_CASE) + (" causal" if o.causal else ""),
        half=("profile the optional bf16/fp16 kernel (kernels/attention_half.cu) in bf16 instead",
              "flash_attention_half_kernel", "profile_launch_half"),
        backward=("profile the optional backward part's dK/dV kernel (kernels/attention_backward.cu) instead",
                  "flash_attention_dkdv_kernel", "profile_launch_backward"),
        hopper=("profile the optional Hopper kernel (kernels/attention_hopper.cu) in bf16 instead",
                "flash_attention_hopper_kernel", "profile_launch_hopper"),
        backward_half=("profile the optional 16-bit backward part's dK/dV kernel (kernels/attention_backward_half.cu) in "
                       "bf16 instead", "flash_attention_dkdv_half_kernel", "profile_launch_backward_half")))
