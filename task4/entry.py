"""Task 4's entry points: how the checks call your kernel (task4/kernels/attention.cu).

Given: not graded; edits here are not submitted. This runs in the worker process: it
builds your kernel with task4/binding.cpp and calls it on tensors the checks own (shared
GPU memory), then waits for the GPU, so the checks read finished outputs.
"""

import torch

from task4 import attention

ext = attention.extension()  # builds on first use; a compiler error is reported as the build check


def forward(q, k, v, out, causal, scale, key_start=None):
    ext.forward(q, k, v, out, causal, scale, key_start)
    torch.cuda.synchronize()


def forward_masks(q, k, v, out, causal, scale, key_start=None, window_left=None, softcap=None, cu_seqlens=None):
    """The float32 kernel with the masks beyond causal (steps 23-24, in kernels/attention.cu)."""
    ext.forward_masks(q, k, v, out, causal, scale, key_start, window_left, softcap, cu_seqlens)
    torch.cuda.synchronize()


def forward_half(q, k, v, out, causal, scale, key_start=None):
    """The bf16/fp16 kernel of kernels/attention_half.cu (steps 8-11)."""
    from common.build import OPTIONAL_LEFT_OUT

    left_out = OPTIONAL_LEFT_OUT.get("task4/kernels/attention_half.cu")
    if left_out and not ext.has_half():  # its compiler errors, where the binding could only say it is absent
        raise RuntimeError(f"task4/kernels/attention_half.cu was left out of the build (the float32 kernel is "
                           f"tested without it): {left_out}")
    ext.forward_half(q, k, v, out, causal, scale, key_start)
    torch.cuda.synchronize()


def forward_hopper(q, k, v, out, causal, scale, key_start=None):
    """The Hopper kernel of kernels/attention_hopper.cu (steps 17-22, compute capability 9.0)."""
    from common.build import OPTIONAL_LEFT_OUT

    left_out = OPTIONAL_LEFT_OUT.get("task4/kernels/attention_hopper.cu")
    if left_out and not ext.has_hopper():
        raise RuntimeError(f"task4/kernels/attention_hopper.cu was left out of the build (the float32 kernel is "
                           f"tested without it): {left_out}")
    ext.forward_hopper(q, k, v, out, causal, scale, key_start)
    try:
        torch.cuda.synchronize()
    except RuntimeError as err:
        if "unspecified launch failure" not in str(err):
            raise
        # a trap: CUDA says no more, and in this kernel it is most often device/hopper.cuh's mbarrier_wait giving up
        raise RuntimeError(f"{err} (in the Hopper kernel, most often an mbarrier wait that never completed: a copy "
                           "never issued, bytes announced that never came, a stage never given back; README, Task 4, "
                           "steps 17-22)") from None


def extension_file():
    """The built extension's path: the Hopper part reads its kernels' instructions there (never runs them)."""
    return getattr(ext, "__file__", None)


def _backward_present(q=None):
    """Raises what left the backward part out of this build (for 16-bit q, the 16-bit one's files: steps 27-30),
    where the binding could only say it is absent."""
    from common.build import OPTIONAL_LEFT_OUT

    half = q is not None and q.dtype in (torch.bfloat16, torch.float16)
    files = ("attention_half.cu", "attention_backward_half.cu") if half else ("attention_backward.cu",)
    for name in files:
        left_out = OPTIONAL_LEFT_OUT.get(f"task4/kernels/{name}")
        if left_out and not (ext.has_backward_half() if half else ext.has_backward()):
            raise RuntimeError(f"task4/kernels/{name} was left out of the build (the float32 kernel is tested "
                               f"without it): {left_out}")


def forward_lse(q, k, v, out, lse, causal, scale, window_left=None, softcap=None, cu_seqlens=None):
    """The forward kernel that also writes each row's log-sum-exp (step 12, optional; with the masks, step 26's; in
    bf16/fp16, step 27's)."""
    _backward_present(q)
    ext.forward_lse(q, k, v, out, lse, causal, scale, window_left, softcap, cu_seqlens)
    torch.cuda.synchronize()


def backward(q, k, v, out, dout, lse, dq, dk, dv, causal, scale, window_left=None, softcap=None, cu_seqlens=None):
    """The backward kernels of kernels/attention_backward.cu (steps 13-16, optional; with the masks, step 26), or for
    bf16/fp16 tensors kernels/attention_backward_half.cu's (steps 28-30)."""
    _backward_present(q)
    ext.backward(q, k, v, out, dout, lse, dq, dk, dv, causal, scale, window_left, softcap, cu_seqlens)
    torch.cuda.synchronize()


def run_batch_backward(sets, causal, scale):
    """The backward kernels over every (q, k, v, out, dout, lse, dq, dk, dv) set, then wait for the GPU: the checks
    time this request."""
    for q, k, v, out, dout, lse, dq, dk, dv in sets:
        ext.backward(q, k, v, out, dout, lse, dq, dk, dv, causal, scale)
    torch.cuda.synchronize()


def train_with_kernels(seed, steps=None, dtype="float32"):
    """task4/train.py's model trained with your forward_lse and backward (flash_attention_trainable): the loss of
    every step (of `steps` only: a warm-up). dtype "bfloat16": under autocast, through the 16-bit kernels."""
    from task4 import train

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype: 'float32' or 'bfloat16' expected, got {dtype!r}")
    dtype = getattr(torch, dtype)
    _backward_present(torch.empty(0, dtype=dtype))
    return train.train(lambda q, k, v: attention.flash_attention_trainable(q, k, v, causal=True), train.TRAINING,
                       seed, "cuda", steps, dtype)


def run_batch(sets, causal, scale):
    """The kernel over every (q, k, v, out) set, then wait for the GPU: the checks time this request."""
    for q, k, v, out in sets:
        ext.forward(q, k, v, out, causal, scale)
    torch.cuda.synchronize()


def run_batch_half(sets, causal, scale):
    """The bf16/fp16 kernel over every set, then wait for the GPU: the checks time this request."""
    for q, k, v, out in sets:
        ext.forward_half(q, k, v, out, causal, scale)
    torch.cuda.synchronize()


def run_batch_hopper(sets, causal, scale):
    """The Hopper kernel over every set, then wait for the GPU: the checks time this request."""
    for q, k, v, out in sets:
        ext.forward_hopper(q, k, v, out, causal, scale)
    torch.cuda.synchronize()


def run_batch_masks(sets, causal, scale, window_left=None, softcap=None, cu_seqlens=None):
    """The kernel with the masks beyond causal (steps 23-24) over every set, then wait for the GPU: the checks time
    this request."""
    for q, k, v, out in sets:
        ext.forward_masks(q, k, v, out, causal, scale, None, window_left, softcap, cu_seqlens)
    torch.cuda.synchronize()


_layer = None


def make_layer(hidden, heads, weights):
    """The whole layer with your kernel inside, kept here for the calls below."""
    global _layer
    _layer = attention.FlashMultiHeadAttention(hidden, heads, device="cuda").load_weights(*weights)


def layer(x, causal):
    with torch.no_grad():
        return _layer(x, x, x, causal=causal)


def layer_batch(inputs, causal):
    """The layer over every input, then wait for the GPU: the checks time this request."""
    with torch.no_grad():
        for x in inputs:
            _layer(x, x, x, causal=causal)
    torch.cuda.synchronize()


def occupancy(symbols):
    """Threads, shared memory and blocks per SM of your kernels as built (python -m task4.tune asks, after a launch)."""
    from common.occupancy import blocks_per_sm

    return blocks_per_sm(ext.__file__, symbols)


def profile_launch(batch, heads, seq, head_dim, causal):
    """One launch on inputs made here, for python -m task4.profile (ncu profiles it)."""
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda") for _ in range(3))
    ext.forward(q, k, v, torch.empty_like(q), causal, head_dim ** -0.5)
    torch.cuda.synchronize()


def profile_launch_backward(batch, heads, seq, head_dim, causal):
    """One backward call on inputs made here (out and lse from your forward_lse), for a profiler."""
    q, k, v, dout = (torch.randn(batch, heads, seq, head_dim, device="cuda") for _ in range(4))
    out, lse = torch.empty_like(q), torch.empty(batch, heads, seq, device="cuda")
    ext.forward_lse(q, k, v, out, lse, causal, head_dim ** -0.5)
    ext.backward(q, k, v, out, dout, lse, *(torch.empty_like(t) for t in (q, k, v)), causal, head_dim ** -0.5)
    torch.cuda.synchronize()


def profile_launch_backward_half(batch, heads, seq, head_dim, causal):
    """The same in bf16 (python -m task4.profile --backward-half): out and lse from your 16-bit forward_lse."""
    q, k, v, dout = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = torch.empty_like(q), torch.empty(batch, heads, seq, device="cuda")
    forward_lse(q, k, v, out, lse, causal, head_dim ** -0.5)
    backward(q, k, v, out, dout, lse, *(torch.empty_like(t) for t in (q, k, v)), causal, head_dim ** -0.5)


def profile_launch_half(batch, heads, seq, head_dim, causal):
    """The same for the bf16 kernel (python -m task4.profile --half)."""
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    forward_half(q, k, v, torch.empty_like(q), causal, head_dim ** -0.5)
    torch.cuda.synchronize()


def profile_launch_hopper(batch, heads, seq, head_dim, causal):
    """The same for the Hopper kernel (python -m task4.profile --hopper)."""
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    forward_hopper(q, k, v, torch.empty_like(q), causal, head_dim ** -0.5)
    torch.cuda.synchronize()
