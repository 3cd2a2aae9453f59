"""The stand-in kernels' common part: the bindings' checks with their messages, a student's Behaviour, the base
class that times a call at the stand-in GPU's speed, and task 2's kernels."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch


from harness.attention_math import attention_flops
from tests.stand_in import gpu
from tests.stand_in.gpu import BYTES_PER_S, CAPTURE, FLOPS_PER_S, REPO


# -- the kernels: the bindings' checks, then PyTorch ------------------------------------------

class Hang(Exception):
    """A stand-in kernel that never returns: the stand-in worker answers as a real one that ran past its call's
    time (harness/sandbox.py: the worker stopped, WorkerDied timed out)."""


def check_cuda_float32(t, name):
    if getattr(t, "on_host", False):
        raise RuntimeError(f"{name} must be a CUDA tensor, got one on cpu (move it with .cuda())")
    if t.dtype != torch.float32:
        raise RuntimeError(f"{name} must be float32, got {t.dtype} (this course's kernels work in float32)")
    if not t.is_contiguous():
        raise RuntimeError(f"{name} must be contiguous (call .contiguous() first)")


def check_dim(t, name, dim):
    if t.dim() != dim:
        raise RuntimeError(f"{name} must have {dim} dimensions, got shape {list(t.shape)}")


def overlaps(a, b) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


def check_no_overlap(out, out_name, t, name):
    if overlaps(out, t):
        raise RuntimeError(f"{out_name} must not share memory with {name} (pass a separate output tensor)")


def check_finite(scale):
    if not math.isfinite(scale):
        raise RuntimeError(f"scale must be finite, got {scale}")


def check_per_sequence(t, name, what, batch):
    """common/csrc/checks.h's check_per_sequence: int32 (batch,) on the GPU, its values not read."""
    if getattr(t, "on_host", False):
        raise RuntimeError(f"{name} must be a CUDA tensor, got one on cpu")
    if t.dtype != torch.int32:
        raise RuntimeError(f"{name} must be int32 ({what} per sequence), got {t.dtype}")
    if tuple(t.shape) != (batch,):
        raise RuntimeError(f"{name} must have shape [{batch}] (one value per sequence of the batch), "
                           f"got {list(t.shape)}")
    if not t.is_contiguous():
        raise RuntimeError(f"{name} must be contiguous (call .contiguous() first)")


def check_key_start(key_start, batch, most, most_what):
    """common/csrc/checks.h's check_key_start: int32 (batch,) on the GPU, values in [0, most]."""
    if key_start is None:
        return
    check_per_sequence(key_start, "key_start", "one first valid key", batch)
    if batch and CAPTURE.graph is not None:  # the binding reads the values back: a synchronisation
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing (checking key_start's "
                           "values reads them back to the host)")
    if batch and not (int(key_start.min()) >= 0 and int(key_start.max()) <= most):
        raise RuntimeError(f"key_start must hold values between 0 and {most_what} = {most}, got values from "
                           f"{int(key_start.min())} to {int(key_start.max())}")


def with_padding(attend, q, k, v, key_start):
    """attend(q, k, v) over each sequence's valid keys and queries, as the kernels move past left padding:
    keys before key_start[b] are skipped, and so are the queries at those positions (their rows are zeros)."""
    if key_start is None:
        return attend(q, k, v)
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    out = torch.zeros_like(q)
    for b, first in enumerate(key_start.tolist()):
        skip = min(seq_q, max(0, first - (seq_k - seq_q)))
        if skip < seq_q:
            out[b:b + 1, :, skip:] = attend(q[b:b + 1, :, skip:], k[b:b + 1, :, first:], v[b:b + 1, :, first:])
    return out


@dataclass
class Behaviour:
    """How a stand-in kernel module behaves: as the reference, or as a known-bad student's build.

    slowdown: each call takes this many times the stand-in GPU's time for its work;
    wrong_head_dim: outputs of this head_dim (the timed cases') come out 1% too large;
    build_error: the student's build of these kernels fails with this message;
    half: the bf16/fp16 kernels (task 4's of steps 8-11, task 5's decode of step 6; the float32 ones are right)
    write outputs 1% too large ("wrong"), or nothing ("unwritten", a skeleton's); hopper: task 4's Hopper kernel
    (steps 17-22) the same, or "trap" (a kernel that traps: every call a CUDA error), or "hang" (one that never
    returns, as a named barrier no one arrives on);
    backward: task 4's backward kernels (steps 13-16) do the same with dk ("wrong", "unwritten"), or make one of
    harness/diagnose_backward.py's mistakes (its `how`, "no D" say); with the masks (step 26), "no cap slope" (dS not
    taken back through the cap) or "masks unwritten" (the skeleton's: dK and dV zeros, dQ not written);
    backward_half: task 4's 16-bit backward part (steps 27-30) the same with dk ("wrong", "unwritten", a mistake's
    `how`), or "lse unwritten" (step 27's skeleton: forward_lse leaves lse as it was);
    unscaled: the forward and decode kernels (float32 and 16-bit) ignore their scale: a mistake the checks name;
    decode_one_short: task 5's decodes leave out each sequence's last row (a row range ending at end - 1);
    update_rows_late: task 5's update writes each new row this many rows (> 0) late, flat over (batch x heads)
    x max_seq rows as an index `(bh * max_seq + p + late) * head_dim` does: into the next head's first rows, and
    past the cache's end for the last head;
    masks: task 4's masks beyond causal (steps 23-24) write nothing ("unwritten"), or see one key more before the
    window ("window_wide");
    library: the file the module says it was loaded from (its `__file__`), a real object whose instructions the
    Hopper part reads (tests/test_machine_code.py); by default one that does not exist;
    paged_half: task 5's 16-bit paged decode (step 7) reads each sequence's first row in place of its last one
    ("wrong"): right but for one row, so only the bit-for-bit comparison with step 6's decode sees it.
    """

    slowdown: float = 1.0
    wrong_head_dim: int | None = None
    build_error: str | None = None
    half: str | None = None
    hopper: str | None = None
    backward: str | None = None
    backward_half: str | None = None
    unscaled: bool = False
    decode_one_short: bool = False
    update_rows_late: int = 0
    library: Path | None = None
    masks: str | None = None
    paged_half: str | None = None


# The stand-in worker's build folder (harness.sandbox.Worker's `builds`)
STAND_IN_BUILDS = REPO / "build" / "stand-in-builds"


class StandInKernels:
    """What the stand-in modules share: the behaviour, and an output written the way it says."""

    def __init__(self, behaviour: Behaviour | None = None):
        self.behaviour = behaviour or Behaviour()
        # a module's attribute: tune asks for it, and the Hopper part reads the file it names
        self.__file__ = str(self.behaviour.library or STAND_IN_BUILDS / "stand-in.so")

    @contextlib.contextmanager
    def work(self, seconds: float):
        """On bench's clock the call lasts exactly `seconds` (the stand-in GPU's time for its work; twice that when
        slow), however long the CPU took: a busy machine does not slow the stand-in GPU down. The clock is the calling
        thread's own, and no other reads it meanwhile."""
        started = time.perf_counter()
        yield
        seconds *= self.behaviour.slowdown
        gpu.CLOCK.ahead += seconds - (time.perf_counter() - started)

    def applied(self, scale: float) -> float:
        """The scale a kernel computes with: the one it was given, or none (Behaviour.unscaled)."""
        return 1.0 if self.behaviour.unscaled else scale

    def write(self, out, result):
        if self.behaviour.wrong_head_dim == out.shape[-1]:
            result = result * 1.01
        out.copy_(result)


def attention_in_torch(q, k, v, causal, scale, block_rows=128):
    """softmax(scale q k^T + mask) v, a block of query rows at a time; a causal block reads only the keys it sees."""
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    rows = []
    for r0 in range(0, seq_q, block_rows):
        r1 = min(seq_q, r0 + block_rows)
        keys = r1 + seq_k - seq_q if causal else seq_k  # the block's last query sees this many keys
        scores = (q[..., r0:r1, :] @ k[..., :keys, :].transpose(-2, -1)) * scale
        if causal:  # its last r1 - r0 keys are the diagonal: query r0 + i sees the first i + 1 of them
            n = r1 - r0
            scores[..., keys - n:].masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        rows.append(torch.softmax(scores, dim=-1) @ v[..., :keys, :])
    return torch.cat(rows, dim=-2)


def attention_seconds(q, k, causal):
    batch, heads, seq_q, head_dim = q.shape
    return attention_flops(batch, heads, seq_q, k.shape[2], head_dim, causal) / FLOPS_PER_S


class Task2Kernels(StandInKernels):
    """task2/binding.cpp's `softmax`, `gemm_nt`, `gemm_nn` and `attention`, computed in PyTorch."""

    def softmax(self, x, out):
        check_cuda_float32(x, "x")
        check_cuda_float32(out, "out")
        check_dim(x, "x", 2)
        check_dim(out, "out", 2)
        if out.shape != x.shape:
            raise RuntimeError(f"out must have the same shape as x: got {list(out.shape)} and {list(x.shape)}")
        if out.data_ptr() != x.data_ptr() and overlaps(out, x):
            raise RuntimeError("out must be x itself or not share memory with it")
        with self.work(2 * x.nbytes / BYTES_PER_S):
            self.write(out, torch.softmax(x, dim=-1))

    def _gemm(self, a, b, c, nt):
        for t, name in ((a, "a"), (b, "b"), (c, "c")):
            check_cuda_float32(t, name)
            check_dim(t, name, 3)
        b_k, b_n = (2, 1) if nt else (1, 2)
        for x, x_name, x_dim, y, y_name, y_dim, what in ((a, "a", 0, b, "b", 0, "batch"), (a, "a", 2, b, "b", b_k, "k"),
                                                         (c, "c", 0, a, "a", 0, "batch"), (c, "c", 1, a, "a", 1, "m"),
                                                         (c, "c", 2, b, "b", b_n, "n")):
            if x.shape[x_dim] != y.shape[y_dim]:
                raise RuntimeError(f"{x_name} and {y_name} disagree on {what}: {x_name}.size({x_dim}) = "
                                   f"{x.shape[x_dim]} but {y_name}.size({y_dim}) = {y.shape[y_dim]}")
        check_no_overlap(c, "c", a, "a")
        check_no_overlap(c, "c", b, "b")
        with self.work(2 * a.numel() * c.shape[2] / FLOPS_PER_S):
            self.write(c, a @ (b.transpose(1, 2) if nt else b))

    def gemm_nt(self, a, b, c):
        self._gemm(a, b, c, True)

    def gemm_nn(self, a, b, c):
        self._gemm(a, b, c, False)

    def attention(self, q, k, v, out, causal, scale):
        for t, name in ((q, "q"), (k, "k"), (v, "v"), (out, "out")):
            check_cuda_float32(t, name)
            check_dim(t, name, 4)
        if v.shape != k.shape or out.shape != q.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
            raise RuntimeError(f"q, k, v, out: shapes {[list(t.shape) for t in (q, k, v, out)]} disagree")
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            check_no_overlap(out, "out", t, name)
        if q.shape[3] > 128:
            raise RuntimeError(f"head_dim must be at most 128, got {q.shape[3]}")
        if causal and q.shape[2] > k.shape[2]:
            raise RuntimeError(f"causal attention needs seq_q <= seq_k, got seq_q = {q.shape[2]} and "
                               f"seq_k = {k.shape[2]}")
        check_finite(scale)
        with self.work(attention_seconds(q, k, causal)):
            self.write(out, attention_in_torch(q, k, v, causal, scale))
