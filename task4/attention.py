"""Task 4: the Python side of the fused FlashAttention kernel.

Given: not graded; edits here are not submitted (you write kernels/attention.cu).

`flash_attention` hands (batch, heads, seq, head_dim) tensors to the CUDA kernel in
kernels/attention.cu (built on first use; `python -m task4.compile` builds it
ahead), bf16 and fp16 ones to kernels/attention_half.cu's, or on an H100/H200 to
kernels/attention_hopper.cu's once its steps are written (`uses_hopper`).
`FlashMultiHeadAttention` is a whole layer: projections in PyTorch, the kernel for
attention, the output projection.
"""

from __future__ import annotations

import math

import torch

from common.build import TaskExtension
from common.operators import function
from common.layer import AttentionLayer

# The compiled kernel module: extension() is yours, extension(solution=True) the reference.
extension = TaskExtension(4)


# The largest head_dim of the Hopper kernel (kernels/attention_hopper.cu's MAX_HEAD_DIM)
HOPPER_MAX_HEAD_DIM = 128
# Whether each build's Hopper kernel is written: (solution, the module) -> (steps 17-22, step 25's masks), asked once
# a build (the module itself in the key: kept alive, its id is never another's)
_hopper_written: dict[tuple[bool, object], tuple[bool, bool]] = {}


def uses_hopper(q, solution: bool = False) -> bool:
    """Whether flash_attention sends these 16-bit tensors to the Hopper kernel (kernels/attention_hopper.cu, steps
    17-22) rather than to steps 8-11's: on a GPU of compute capability 9.0, head_dim up to 128, with the Hopper kernel
    in the build and, in yours, no step of 17-22 still marked TODO (until then your 16-bit models run steps 8-11's
    kernel, and tasks 5-7 with them)."""
    if q.dtype not in (torch.bfloat16, torch.float16) or q.shape[-1] > HOPPER_MAX_HEAD_DIM:
        return False
    return _hopper_ready(solution, q.device.index if q.is_cuda else None)  # (on the host: either binding refuses q)


def hopper_masks_ready(q, solution: bool = False) -> bool:
    """Whether these 16-bit tensors can take the masks beyond causal: uses_hopper, and the Hopper kernel's step 25
    (the masks) in the build and, in yours, not marked TODO."""
    return uses_hopper(q, solution) and _hopper_ready(solution, q.device.index if q.is_cuda else None, masks=True)


HOPPER_STEPS, HOPPER_MASKS_STEP = range(17, 23), 25


@torch.compiler.assume_constant_result
def _hopper_ready(solution: bool, device: int | None, masks: bool = False) -> bool:
    """The GPU and the build's part of uses_hopper (masks: of hopper_masks_ready). It reads files, so torch.compile
    must not trace it: it calls it once while tracing and takes the answer as a constant (the build and the GPU do
    not change under a graph)."""
    if not _is_hopper_gpu(device):
        return False
    module = extension(solution)
    key = (solution, module)
    if key not in _hopper_written:
        from common.build import kernel_folder
        from common.impl import remaining_todos

        file = kernel_folder(4, solution) / "attention_hopper.cu"
        todo = set() if solution else {int(step.split(":")[0].split()[1]) for step in remaining_todos(file)}
        _hopper_written[key] = (bool(module.has_hopper()) and not todo & set(HOPPER_STEPS),
                                bool(module.has_hopper_masks()) and HOPPER_MASKS_STEP not in todo)
    return _hopper_written[key][masks]


def _is_hopper_gpu(device: int | None) -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability(device) == (9, 0)


def _why_no_hopper_masks(q, solution: bool) -> str:
    if not _is_hopper_gpu(q.device.index if q.is_cuda else None):
        return "this is not an H100/H200"
    if q.shape[-1] > HOPPER_MAX_HEAD_DIM:
        return f"head_dim is {q.shape[-1]}"
    return "your Hopper kernel's steps 17-22 or 25 are not all written yet" if not solution else "it is not built"


def flash_attention(q, k, v, causal: bool = False, scale: float | None = None, out=None, solution: bool = False,
                    key_start=None, hopper: bool | None = None, *, window_left=None, cu_seqlens=None, softcap=None):
    """softmax(scale * q k^T + mask) v in one kernel; q (B, H, Sq, D), k and v (B, KVH, Sk, D), float32 on CUDA,
    or all bfloat16 or all float16 (the tensor-core kernel of kernels/attention_half.cu, steps 8-11, or on an
    H100/H200 the Hopper kernel of kernels/attention_hopper.cu, steps 17-22, once written: `uses_hopper`; hopper=True
    or False picks one of the two).

    KVH may be any divisor of H (grouped-query attention: query head h reads key/value head h // (H // KVH)).
    key_start, int32 (B,) on the GPU: each sequence's first valid key (a batch padded on the left); the
    queries before it are padding, and their rows of the output are zeros.
    window_left, cu_seqlens, softcap: the masks beyond causal (common/masks.py says each), in float32 (steps 23-24 of
    kernels/attention.cu), or in bf16/fp16 on the Hopper kernel once its step 25 is written (hopper_masks_ready)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.empty_like(q) if out is None else out
    if window_left is not None or cu_seqlens is not None or softcap is not None:
        from common.masks import check_masks

        window_left, documents, softcap = check_masks(q.shape[-2], k.shape[-2], causal, window_left, cu_seqlens,
                                                      softcap)
        if q.dtype != torch.float32 and not hopper_masks_ready(q, solution):
            raise ValueError(f"the masks beyond causal in {str(q.dtype)[6:]} are the Hopper kernel's (kernels/"
                             "attention_hopper.cu, step 25: compute capability 9.0, head_dim up to 128, steps 17-22 "
                             f"and 25 written); {_why_no_hopper_masks(q, solution)}: give float32 tensors (steps 23-24)")
        ends = None if documents is None else torch.tensor(documents, dtype=torch.int32, device=q.device)
        window_left = None if window_left is None else min(window_left, k.shape[-2])  # wider sees every key too
        function(extension(solution), "forward_masks")(q, k, v, out, causal, scale, key_start, window_left, softcap,
                                                       ends)
        return out
    if q.dtype not in (torch.bfloat16, torch.float16):
        name = "forward"
    elif hopper if hopper is not None else uses_hopper(q, solution):
        name = "forward_hopper"
    else:
        name = "forward_half"
    function(extension(solution), name)(q, k, v, out, causal, scale, key_start)
    return out


class _FlashAttention(torch.autograd.Function):
    """The kernels as an autograd function: the forward saves what FlashAttention-2 saves (q, k, v, the output and
    each row's log-sum-exp L, from forward_lse: step 12), and the backward runs kernels/attention_backward.cu
    (steps 13-16), which computes the probabilities again from L, tile by tile."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, solution, masks):
        module = extension(solution)
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
        module.forward_lse(q, k, v, out, lse, causal, scale, *masks)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.solution, ctx.masks = causal, scale, solution, masks
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        extension(ctx.solution).backward(q, k, v, out, d_out.contiguous(), lse, dq, dk, dv, ctx.causal, ctx.scale,
                                         *ctx.masks)
        return dq, dk, dv, None, None, None, None


def flash_attention_trainable(q, k, v, causal: bool = False, scale: float | None = None, solution: bool = False, *,
                              window_left=None, cu_seqlens=None, softcap=None):
    """flash_attention (float32, no padding) that autograd can differentiate through your backward kernels; with the
    masks beyond causal (common/masks.py says each) once step 26 is written."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    masks = (None, None, None)
    if window_left is not None or cu_seqlens is not None or softcap is not None:
        from common.masks import check_masks

        window_left, documents, softcap = check_masks(q.shape[-2], k.shape[-2], causal, window_left, cu_seqlens,
                                                      softcap)
        ends = None if documents is None else torch.tensor(documents, dtype=torch.int32, device=q.device)
        masks = (None if window_left is None else min(window_left, k.shape[-2]), softcap, ends)
    return _FlashAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale, solution, masks)


class FlashMultiHeadAttention(AttentionLayer):
    """Multi-head attention (common/layer.py) whose core is the fused kernel."""

    def __init__(self, hidden_size: int, num_heads: int, device=None, solution: bool = False):
        super().__init__(hidden_size, num_heads, device=device)
        self.solution = solution

    def split_heads(self, x):
        return super().split_heads(x).contiguous()  # the kernel reads (B, H, S, D) rows

    def attend(self, q, k, v, causal):
        return flash_attention(q, k, v, causal, solution=self.solution)
