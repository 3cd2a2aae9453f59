"""The CUDA tasks' whole grading flow on the CPU, with PyTorch standing in for the kernels and the GPU.

For the kit's own tests only. CI has no GPU, so a CUDA task's test stops at "needs a CUDA GPU"
and everything after its checks (the benchmarks, loading the reference, the estimate from the
calibration, the record's speed fields) would run for the first time on a grader's GPU. Here
that flow runs in the pytest process: `checks.taskN.test.main([...])` as the grader calls it, then the
record validated and scored as the grader does. Every stand-in is a monkeypatch made by
`stand_in()`, undone when the test ends: no flag, file or environment variable of a student's or
a grader's run leads here, and nothing the real run checks is changed.

What stands in for what:
- the GPU: `CudaOnTheCpu` makes every tensor asked for on "cuda" on the CPU; a tensor made for the
  host (`.cpu()`, or a factory without a CUDA device) is marked `on_host`, so the bindings' "must be
  a CUDA tensor" still refuses it, and `.cuda()` copies it; torch.cuda's availability, synchronize,
  events (a host clock), name and properties are those of a stand-in GPU with one SM; streams are
  one; CUDA graphs are `StandInGraph`, which records a capture and replays it as a GPU would (a
  Python value is kept as captured, memory is read anew, reading a value back refuses);
- its speed: a stand-in kernel's call lasts exactly the time its work takes at FLOPS_PER_S or
  BYTES_PER_S on harness/bench.py's clock (`StandInClock`, the host's clock moved on by what the CPU
  did not take), so its timings do not depend on how busy the machine is;
- the kernels: `Task2Kernels`, `Task4Kernels` and `Task5Kernels` make the bindings' checks with
  the bindings' messages, then compute in PyTorch; `common.build.load_extension` returns them,
  called as the real one is called (a call it would refuse is refused), so each task's
  `extension()` and `harness.bench.load_reference` run as they are;
- the worker: `InProcessWorker` runs taskN/entry.py in this process on the checks' own tensors
  (as a worker writes the checks' shared GPU memory), and its replies cross common/wire.py as a
  real worker's do; requests do not (no CUDA IPC handles here: tests/test_grader.py and the GPU
  tests cover the real worker);
- the operators: each stand-in module is also registered as its build's PyTorch operators
  (`with_operators`: the schemas read from taskN/binding.cpp's KIT_OPERATORS block, under the namespace
  taskN_stand_in_student or taskN_stand_in_solution), so TaskExtension registers their fakes as it does
  a real build's, and a function compiled with torch.compile runs the stand-ins through them;
- compute-sanitizer: a clean report for each tool (the pass's parsing is tested on real reports
  in tests/test_sanitize.py);
- sizes: the benchmarks' shapes are small, and the requests are sized for a CPU (the numbers
  are not the point; the flow that turns them into points is).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import math
import re
import sys
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from common import build, impl, wire

from harness import bench, calibration, cli, sanitize
from harness.reference import attention_flops, causal_mask, expand_kv_heads
from harness.sandbox import WorkerDied, WorkerError
from common.worker import _resolve
from task4.train import Config as TrainingConfig

REPO = Path(__file__).resolve().parent.parent
GPU_NAME = "stand-in GPU (PyTorch on the CPU)"
GPU = types.SimpleNamespace(name=GPU_NAME, multi_processor_count=1, total_memory=8 << 30, major=9, minor=0)
# The stand-in GPU's speed: slow enough that the CPU's own time for a call (and for what a request does
# around its calls) is under 1% of it at the sizes below, so a kernel twice as slow is timed twice as slow.
FLOPS_PER_S = 1e8  # attention: 4 * batch * heads * (query, key) pairs * head_dim
BYTES_PER_S = 1e7  # the cache: bytes read or written
CUDA_TASKS = (2, 4, 5)


# -- the GPU --------------------------------------------------------------------------------

def _on_cuda(device) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"


FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint, torch.arange,
             torch.tensor, torch.eye}


class CudaOnTheCpu(TorchFunctionMode):
    """Tensors asked for on "cuda" are made on the CPU; those made for the host are marked `on_host`."""

    def __init__(self):
        super().__init__()
        # The torch.device objects read from the stand-in GPU's tensors (`model.device`), kept so that their ids
        # stay theirs: a host tensor moved `.to(` one of them moves to the stand-in GPU, as on a real one.
        self.gpu_devices: dict[int, torch.device] = {}

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if CAPTURE.graph is not None and not CAPTURE.in_kernel and func in READ_BACK \
                and not getattr(args[0], "on_host", False):
            raise RuntimeError(f"CUDA error: operation not permitted when stream is capturing ({func.__name__} "
                               "reads a GPU value back to the host)")
        if func is torch.Tensor.cpu:
            return _host(args[0].clone())
        device = kwargs.get("device")
        to_gpu = func is torch.Tensor.cuda or (func is torch.Tensor.to and self._to_the_gpu(args, kwargs))
        if _on_cuda(device):
            kwargs["device"] = "cpu"
        if to_gpu:  # a host tensor is copied to the GPU, a GPU tensor is itself (in the dtype asked for)
            t, args = args[0], tuple("cpu" if _on_cuda(a) else a for a in args)
            result = t if func is torch.Tensor.cuda else func(*args, **kwargs)
            return t.clone() if result is t and getattr(t, "on_host", False) else result
        result = func(*args, **kwargs)
        if func is torch.Tensor.to and getattr(args[0], "on_host", False) and isinstance(result, torch.Tensor):
            return _host(result)  # another dtype, still in host memory
        if getattr(func, "__self__", None) is torch.Tensor.device and not getattr(args[0], "on_host", False):
            self.gpu_devices[id(result)] = result
            if len(self.gpu_devices) > 4096:  # the newest are the ones about to be used
                del self.gpu_devices[next(iter(self.gpu_devices))]
        # made for the host: no device, or "cpu" in words (a torch.device is another tensor's `.device`, which
        # here is the GPU's as often as not, so it is not marked)
        return _host(result) if func in FACTORIES and (device is None or device == "cpu") else result

    def _to_the_gpu(self, args, kwargs) -> bool:
        """Tensor.to's arguments name the GPU: "cuda", or `other.device` of a tensor on the stand-in GPU (a host
        tensor's `.device` keeps it a host tensor, as on a real GPU)."""
        device = kwargs.get("device", args[1] if len(args) > 1 else None)
        return (_on_cuda(device) or any(_on_cuda(a) for a in args[1:])
                or self.gpu_devices.get(id(device)) is device)


def _host(t):
    t.on_host = True  # a tensor in host memory: the bindings refuse it, as they refuse a CPU tensor
    return t


# -- CUDA graphs ----------------------------------------------------------------------------

# What reads a GPU value back to the host: during a capture CUDA refuses it (the value is not computed yet)
READ_BACK = {torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__bool__,
             torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}


class Capture:
    """The graph being captured (None: none), and whether a stand-in kernel is running (its own reads are the
    kernel's, from device memory)."""

    graph = None
    in_kernel = False


CAPTURE = Capture()


class StandInStream:
    """torch.cuda.Stream: the stand-in GPU has one stream, so waiting on another is nothing."""

    def __init__(self, device=None, priority=0):
        pass

    def wait_stream(self, stream):
        pass

    def synchronize(self):
        pass

    def is_capturing(self):  # asked by torch.optim's step where a GPU is available (PyTorch 2.14)
        return CAPTURE.graph is not None


@contextlib.contextmanager
def stand_in_stream(stream):
    yield


class Recorder(TorchDispatchMode):
    """Each operation of a capture, run and recorded with its arguments; a tensor that was there before the
    capture and that an operation writes is saved first, and put back when the capture ends."""

    def __init__(self, graph):
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                target = args[i] if i < len(args) else kwargs.get(arg.name)
                if isinstance(target, torch.Tensor):
                    self.graph.save(target)
        result = func(*args, **kwargs)
        self.graph.steps.append(("op", func, args, kwargs, result))
        inputs = _storages((args, kwargs))
        self.graph.made |= _storages(result) - inputs  # new memory, not a view of an input or the input itself
        return result


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tree_flatten(tensors)[0] if isinstance(t, torch.Tensor)}


class StandInGraph:
    """torch.cuda.CUDAGraph on the stand-in GPU. On a GPU a capture records the kernels with the arguments they
    were launched with and runs none of them; a replay runs them again, on the same memory. Here the capture runs
    each operation (the Python around it needs their results), records it, and puts back afterwards whatever it
    wrote that was there before; a replay runs the record again, on the same tensors, each result copied into
    the tensor the capture made: a Python int stays what it was at the capture, memory is read anew. A stand-in
    kernel is one step of the record, as a kernel is one launch."""

    def __init__(self):
        self.steps, self.saved, self.made = [], {}, set()
        self.recorder = None

    def capture_begin(self, *args, **kwargs):
        CAPTURE.graph = self
        self.recorder = Recorder(self)
        self.recorder.__enter__()

    def capture_end(self):
        self.recorder.__exit__(None, None, None)
        CAPTURE.graph = None
        for storage, before in self.saved.values():
            storage.copy_(before)
        self.saved.clear()

    def save(self, t):
        """t's memory as it was before the capture wrote it, to put back when the capture ends."""
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.made and storage.data_ptr() not in self.saved:
            self.saved[storage.data_ptr()] = (storage, storage.clone())

    def kernel(self, launch, args, kwargs):
        """A stand-in kernel's call while capturing: its tensor arguments saved, run, recorded as one step."""
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                self.save(t)
        self.steps.append(("kernel", launch, args, kwargs, None))
        return run_kernel(launch, args, kwargs)

    def replay(self):
        for kind, func, args, kwargs, made in self.steps:
            if kind == "kernel":
                run_kernel(func, args, kwargs)
                continue
            result, inputs = func(*args, **kwargs), _storages((args, kwargs))
            for new, old in zip(tree_flatten(result)[0], tree_flatten(made)[0]):
                if isinstance(old, torch.Tensor) and old.untyped_storage().data_ptr() not in inputs:
                    old.copy_(new)  # a view or an in-place result follows its input by itself


@contextlib.contextmanager
def stand_in_graph(cuda_graph, pool=None, stream=None, capture_error_mode="global"):
    cuda_graph.capture_begin()
    try:
        yield
    finally:
        cuda_graph.capture_end()


def run_kernel(launch, args, kwargs):
    """A stand-in kernel's body: its reads of lengths and positions are the kernel's own, from device memory."""
    before, CAPTURE.in_kernel = CAPTURE.in_kernel, True
    try:
        return launch(*args, **kwargs)
    finally:
        CAPTURE.in_kernel = before


def launched(method):
    """A stand-in kernel's entry point: one launch, and one step of a CUDA graph being captured."""
    @functools.wraps(method)
    def launch(self, *args, **kwargs):
        if CAPTURE.graph is not None and not CAPTURE.in_kernel:
            with torch.utils._python_dispatch._disable_current_modes():
                return CAPTURE.graph.kernel(lambda *a, **kw: method(self, *a, **kw), args, kwargs)
        return method(self, *args, **kwargs)
    return launch


class StandInClock:
    """harness/bench.py's clock: the host's, moved on by what a stand-in kernel's modelled time exceeds the CPU's."""

    def __init__(self):
        self.ahead = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.ahead


CLOCK = StandInClock()  # the fixture gives each test its own


class HostEvent:
    """torch.cuda.Event on a host clock (the stand-in GPU's work is done when its call returns)."""

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end: "HostEvent") -> float:
        return (end.at - self.at) * 1e3


_REAL_GENERATOR = torch.Generator


class _GeneratorType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _REAL_GENERATOR)


class StandInGenerator(metaclass=_GeneratorType):
    """torch.Generator: one asked for on "cuda" is the CPU's, like the tensors. A class, as libraries imported
    later (transformers, torch.distributed) name torch.Generator in their types and isinstance checks."""

    def __new__(cls, device=None):
        return _REAL_GENERATOR()


# -- the kernels: the bindings' checks, then PyTorch ------------------------------------------

def _check_cuda_float32(t, name):
    if getattr(t, "on_host", False):
        raise RuntimeError(f"{name} must be a CUDA tensor, got one on cpu (move it with .cuda())")
    if t.dtype != torch.float32:
        raise RuntimeError(f"{name} must be float32, got {t.dtype} (this course's kernels work in float32)")
    if not t.is_contiguous():
        raise RuntimeError(f"{name} must be contiguous (call .contiguous() first)")


def _check_dim(t, name, dim):
    if t.dim() != dim:
        raise RuntimeError(f"{name} must have {dim} dimensions, got shape {list(t.shape)}")


def _overlaps(a, b) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


def _check_no_overlap(out, out_name, t, name):
    if _overlaps(out, t):
        raise RuntimeError(f"{out_name} must not share memory with {name} (pass a separate output tensor)")


def _check_finite(scale):
    if not math.isfinite(scale):
        raise RuntimeError(f"scale must be finite, got {scale}")


def _check_per_sequence(t, name, what, batch):
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


def _check_key_start(key_start, batch, most, most_what):
    """common/csrc/checks.h's check_key_start: int32 (batch,) on the GPU, values in [0, most]."""
    if key_start is None:
        return
    _check_per_sequence(key_start, "key_start", "one first valid key", batch)
    if batch and CAPTURE.graph is not None:  # the binding reads the values back: a synchronisation
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing (checking key_start's "
                           "values reads them back to the host)")
    if batch and not (int(key_start.min()) >= 0 and int(key_start.max()) <= most):
        raise RuntimeError(f"key_start must hold values between 0 and {most_what} = {most}, got values from "
                           f"{int(key_start.min())} to {int(key_start.max())}")


def _padded(attend, q, k, v, key_start):
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
    write outputs 1% too large ("wrong"), or nothing ("unwritten", a skeleton's);
    backward: task 4's backward kernels (steps 13-16) do the same with dk ("wrong", "unwritten").
    """

    slowdown: float = 1.0
    wrong_head_dim: int | None = None
    build_error: str | None = None
    half: str | None = None
    backward: str | None = None


class StandInKernels:
    """What the stand-in modules share: the behaviour, and an output written the way it says."""

    def __init__(self, behaviour: Behaviour | None = None):
        self.behaviour = behaviour or Behaviour()
        self.__file__ = str(REPO / "build" / "stand-in.so")  # a module's attribute (tune asks for it)

    @contextlib.contextmanager
    def work(self, seconds: float):
        """On bench's clock the call lasts `seconds` (the stand-in GPU's time for its work; twice that when slow)."""
        started = time.perf_counter()
        yield
        seconds *= self.behaviour.slowdown
        CLOCK.ahead += max(0.0, seconds - (time.perf_counter() - started))

    def write(self, out, result):
        if self.behaviour.wrong_head_dim == out.shape[-1]:
            result = result * 1.01
        out.copy_(result)


def _attention(q, k, v, causal, scale, block_rows=128):
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


def _gradients(q, k, v, d_out, causal, scale):
    """(dq, dk, dv) in float64, written out (not autograd: called as an operator, the stand-in runs where autograd
    records nothing): dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = scale dS K, dK = scale dS^T Q; the heads that
    share a key/value head add up their gradients."""
    heads, kv_heads = q.shape[1], k.shape[1]
    q, k, v, d_out = (t.double() for t in (q, k, v, d_out))
    k_all, v_all = expand_kv_heads(k, heads), expand_kv_heads(v, heads)
    scores = (q @ k_all.transpose(-2, -1)) * scale
    if causal:
        scores = scores.masked_fill(causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
    p = torch.softmax(scores, dim=-1)
    out = p @ v_all
    d_scores = p * (d_out @ v_all.transpose(-2, -1) - (d_out * out).sum(-1, keepdim=True))
    dq = scale * d_scores @ k_all
    dk = scale * d_scores.transpose(-2, -1) @ q
    dv = p.transpose(-2, -1) @ d_out
    group = lambda t: t.unflatten(1, (kv_heads, heads // kv_heads)).sum(2)  # noqa: E731
    return dq, group(dk), group(dv)


def _attention_seconds(q, k, causal):
    batch, heads, seq_q, head_dim = q.shape
    return attention_flops(batch, heads, seq_q, k.shape[2], head_dim, causal) / FLOPS_PER_S


class Task4Kernels(StandInKernels):
    """task4/binding.cpp's `forward`, computed in PyTorch."""

    @launched
    def forward(self, q, k, v, out, causal, scale, key_start=None):
        self._forward(q, k, v, out, causal, scale, key_start, _check_cuda_float32)

    @launched
    def forward_half(self, q, k, v, out, causal, scale, key_start=None):
        """The bf16/fp16 kernel: the same checks for one 16-bit type, computed in float32, written in that type."""
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise RuntimeError(f"q must be bfloat16 or float16 for forward_half, got {str(q.dtype)[6:]} "
                               "(float32 goes to forward)")

        def same_type(t, name):
            if getattr(t, "on_host", False):
                raise RuntimeError(f"{name} must be a CUDA tensor, got one on cpu (move it with .cuda())")
            if t.dtype != q.dtype:
                raise RuntimeError(f"{name} must be {str(q.dtype)[6:]} like q, got {str(t.dtype)[6:]}")
            if not t.is_contiguous():
                raise RuntimeError(f"{name} must be contiguous (call .contiguous() first)")
        kept = out.clone() if self.behaviour.half == "unwritten" else None
        self._forward(q, k, v, out, causal, scale, key_start, same_type)
        if self.behaviour.half == "wrong":
            out.mul_(1.01)
        elif kept is not None:
            out.copy_(kept)

    def _forward(self, q, k, v, out, causal, scale, key_start, check_type):
        check_type(q, "q")
        for t, name in ((q, "q"), (k, "k"), (v, "v"), (out, "out")):
            _check_dim(t, name, 4)
        batch, heads, seq_q, head_dim = q.shape
        kv_heads = k.shape[1]
        if k.shape[0] != batch or k.shape[3] != head_dim:
            raise RuntimeError(f"k must be (batch, kv_heads, seq_k, head_dim) with q's batch and head_dim "
                               f"(q is {list(q.shape)}), got {list(k.shape)}")
        if heads and (kv_heads < 1 or heads % kv_heads):
            raise RuntimeError(f"k's heads (kv_heads = k.size(1)) must divide q's heads: each group of heads / "
                               f"kv_heads query heads shares one key/value head; got heads = {heads} and "
                               f"kv_heads = {kv_heads}")
        if v.shape != k.shape:
            raise RuntimeError(f"v must have k's shape {list(k.shape)}, got {list(v.shape)}")
        if out.shape != q.shape:
            raise RuntimeError(f"out must have q's shape {list(q.shape)}, got {list(out.shape)}")
        if not 1 <= head_dim <= self.max_head_dim():
            raise RuntimeError(f"head_dim must be at most {self.max_head_dim()}, got {head_dim}")
        if causal and seq_q > k.shape[2]:
            raise RuntimeError(f"causal attention needs seq_q <= seq_k, got seq_q = {seq_q} and seq_k = {k.shape[2]}")
        _check_finite(scale)
        for t, name in ((k, "k"), (v, "v"), (out, "out")):
            check_type(t, name)
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            _check_no_overlap(out, "out", t, name)
        if key_start is not None and seq_q > k.shape[2]:
            raise RuntimeError(f"key_start needs seq_q <= seq_k (the queries are the last seq_q positions of the "
                               f"keys), got seq_q = {seq_q} and seq_k = {k.shape[2]}")
        _check_key_start(key_start, batch, k.shape[2], "seq_k")
        if not heads:
            return
        q, k, v = q.float(), expand_kv_heads(k, heads).float(), expand_kv_heads(v, heads).float()
        with self.work(_attention_seconds(q, k, causal)):
            self.write(out, _padded(lambda *qkv: _attention(*qkv, causal, scale), q, k, v, key_start))

    @launched
    def forward_lse(self, q, k, v, out, lse, causal, scale):
        """Step 12: forward without padding, and each row's log-sum-exp."""
        self._forward(q, k, v, out, causal, scale, None, _check_cuda_float32)
        self._check_lse(lse, q, {"q": q, "k": k, "v": v, "out": out})
        scores = (q @ expand_kv_heads(k, q.shape[1]).transpose(-2, -1)) * scale
        if causal:
            scores = scores.masked_fill(causal_mask(q.shape[2], k.shape[2]), -math.inf)
        lse.copy_(torch.logsumexp(scores, dim=-1))

    @launched
    def backward(self, q, k, v, out, dout, lse, dq, dk, dv, causal, scale):
        """Steps 13-16: the binding's checks, then the gradients written out in float64 (`_gradients`; they do not
        depend on out and lse, given that they are the forward's)."""
        self._forward(q, k, v, out.clone(), causal, scale, None, _check_cuda_float32)  # q, k, v, out checked alike
        self._check_lse(lse, q, {})
        for t, name, model, model_name in ((dout, "dout", q, "q"), (dq, "dq", q, "q"), (dk, "dk", k, "k"),
                                           (dv, "dv", k, "k")):
            _check_cuda_float32(t, name)
            if t.shape != model.shape:
                raise RuntimeError(f"{name} must have {model_name}'s shape {list(model.shape)}, got {list(t.shape)}")
        outputs = {"dq": dq, "dk": dk, "dv": dv}
        for o_name, o in outputs.items():
            for name, t in {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse, **outputs}.items():
                if name != o_name:
                    _check_no_overlap(o, o_name, t, name)
        kept = dk.clone() if self.behaviour.backward == "unwritten" else None
        with self.work(2.5 * _attention_seconds(q, expand_kv_heads(k, q.shape[1]), causal)):
            for got, grad in zip((dq, dk, dv), _gradients(q, k, v, dout, causal, scale)):
                got.copy_(grad)
        if self.behaviour.backward == "wrong":
            dk.mul_(1.01)
        elif kept is not None:
            dk.copy_(kept)

    @staticmethod
    def _check_lse(lse, q, others):
        _check_cuda_float32(lse, "lse")
        if lse.shape != q.shape[:3]:
            raise RuntimeError(f"lse must be (batch, heads, seq_q) = {tuple(q.shape[:3])}, got {list(lse.shape)}")
        for name, t in others.items():
            _check_no_overlap(lse, "lse", t, name)

    def max_head_dim(self):
        return 128

    def has_half(self):
        return True

    def has_backward(self):
        return True

    def tile_sizes(self):
        return 64, 64


class Task5Kernels(StandInKernels):
    """task5/binding.cpp's `update_cache`, `decode` and `splits_for` (and step 6's `update_cache_half` and
    `decode_half`), computed in PyTorch."""

    MAX_SPLITS = 256
    half = None  # during a call of step 6's: the cache's 16-bit type, which every tensor of the call must have

    def _check_type(self, t, name):
        if self.half is None:
            return _check_cuda_float32(t, name)
        if getattr(t, "on_host", False):
            raise RuntimeError(f"{name} must be a CUDA tensor, got one on cpu (move it with .cuda())")
        if t.dtype != self.half:
            raise RuntimeError(f"{name} must be {str(self.half)[6:]} like k_cache, got {str(t.dtype)[6:]}")
        if not t.is_contiguous():
            raise RuntimeError(f"{name} must be contiguous (call .contiguous() first)")

    @contextlib.contextmanager
    def _half_call(self, k_cache):
        """A call of step 6's: the binding's cache_type first, then the float32 call's checks for that type."""
        if k_cache.dtype not in (torch.bfloat16, torch.float16):
            raise RuntimeError(f"k_cache must be bfloat16 or float16 for the 16-bit cache (update_cache_half, "
                               f"decode_half), got {str(k_cache.dtype)[6:]} (a float32 cache goes to update_cache "
                               "and decode)")
        self.half = k_cache.dtype
        try:
            yield
        finally:
            self.half = None

    def _check_cache(self, k_cache, v_cache):
        self._check_type(k_cache, "k_cache")
        _check_dim(k_cache, "k_cache", 4)
        self._check_type(v_cache, "v_cache")
        if v_cache.shape != k_cache.shape:
            raise RuntimeError(f"v_cache must have k_cache's shape {list(k_cache.shape)} (batch, heads, max_seq, "
                               f"head_dim), got {list(v_cache.shape)}")
        if _overlaps(k_cache, v_cache):
            raise RuntimeError("k_cache and v_cache must not share memory")
        if k_cache.shape[3] > self.max_head_dim():
            raise RuntimeError(f"head_dim (k_cache.size(3)) must be at most {self.max_head_dim()}, "
                               f"got {k_cache.shape[3]}")

    def _check_matches(self, t, name, k_cache, what):
        self._check_type(t, name)
        _check_dim(t, name, 4)
        if (t.shape[0], t.shape[1], t.shape[3]) != (k_cache.shape[0], k_cache.shape[1], k_cache.shape[3]):
            raise RuntimeError(f"{name} must be {what} with the cache's batch, heads and head_dim (k_cache is "
                               f"{list(k_cache.shape)}), got {list(t.shape)}")

    @launched
    def update_cache(self, k_new, v_new, k_cache, v_cache, pos):
        self._check_cache(k_cache, v_cache)
        self._check_matches(k_new, "k_new", k_cache, "(batch, heads, n_new, head_dim)")
        if v_new.shape != k_new.shape:
            raise RuntimeError(f"v_new must have k_new's shape {list(k_new.shape)}, got {list(v_new.shape)}")
        n_new, max_seq = k_new.shape[2], k_cache.shape[2]
        if isinstance(pos, torch.Tensor):  # one position per sequence, read by the kernel: no fit, no write
            _check_per_sequence(pos, "pos", "the first new position", k_cache.shape[0])
            with self.work(2 * k_new.nbytes / BYTES_PER_S):
                for b, p in enumerate(pos.tolist()):
                    if 0 <= p <= max_seq - n_new:
                        k_cache[b, :, p:p + n_new], v_cache[b, :, p:p + n_new] = k_new[b], v_new[b]
            return
        if pos < 0:
            raise RuntimeError(f"pos must be at least 0, got {pos}")
        if pos + n_new > max_seq:
            raise RuntimeError(f"pos + n_new must be at most max_seq: the cache holds {max_seq} positions, and "
                               f"writing {n_new} at pos {pos} would end at {pos + n_new}")
        with self.work(2 * k_new.nbytes / BYTES_PER_S):
            k_cache[:, :, pos:pos + n_new] = k_new
            v_cache[:, :, pos:pos + n_new] = v_new

    @launched
    def update_cache_half(self, k_new, v_new, k_cache, v_cache, pos):
        kept = [c.clone() for c in (k_cache, v_cache)] if self.behaviour.half == "unwritten" else None
        with self._half_call(k_cache):
            self.update_cache.__wrapped__(self, k_new, v_new, k_cache, v_cache, pos)
        if kept is not None:
            k_cache.copy_(kept[0])
            v_cache.copy_(kept[1])

    @launched
    def decode_half(self, q, k_cache, v_cache, out, length, scale, splits=0, key_start=None):
        """Step 6's decode: the float32 decode's checks for the cache's type, computed in float32, written in it."""
        with self._half_call(k_cache):
            kept = out.clone() if self.behaviour.half == "unwritten" else None
            self.decode.__wrapped__(self, q, k_cache, v_cache, out, length, scale, splits, key_start)
        if self.behaviour.half == "wrong":
            out.mul_(1.01)
        elif kept is not None:
            out.copy_(kept)

    def has_half(self):
        return True

    @launched
    def decode(self, q, k_cache, v_cache, out, length, scale, splits=0, key_start=None):
        self._check_cache(k_cache, v_cache)
        self._check_type(q, "q")
        _check_dim(q, "q", 4)
        if q.shape[0] != k_cache.shape[0] or q.shape[3] != k_cache.shape[3]:
            raise RuntimeError(f"q must be (batch, heads, 1, head_dim) with the cache's batch ({k_cache.shape[0]}) and "
                               f"head_dim ({k_cache.shape[3]}), got {list(q.shape)}")
        heads, kv_heads = q.shape[1], k_cache.shape[1]
        if heads % kv_heads:
            raise RuntimeError(f"the cache's heads (kv_heads = k_cache.size(1)) must divide q's heads: each group of "
                               f"heads / kv_heads query heads shares one key/value head; got heads = {heads} and "
                               f"kv_heads = {kv_heads}")
        if q.shape[2] != 1:
            raise RuntimeError(f"q must hold one query per (batch, head) (q.size(2) == 1), got shape {list(q.shape)}")
        self._check_type(out, "out")
        if out.shape != q.shape:
            raise RuntimeError(f"out must have q's shape {list(q.shape)}, got {list(out.shape)}")
        per_sequence = isinstance(length, torch.Tensor)
        if per_sequence:
            _check_per_sequence(length, "length", "the positions of the cache written so far", q.shape[0])
        elif not 1 <= length <= k_cache.shape[2]:
            raise RuntimeError(f"length must be between 1 and max_seq = {k_cache.shape[2]} (the positions of the "
                               f"cache written so far), got {length}")
        if not 0 <= splits <= self.MAX_SPLITS:
            raise RuntimeError(f"splits must be between 0 (let the launcher choose) and {self.MAX_SPLITS}, "
                               f"got {splits}")
        _check_finite(scale)
        for t, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
            _check_no_overlap(out, "out", t, name)
        row_bytes = k_cache.element_size() * k_cache.shape[3]  # as stored: 16-bit rows take half the time
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()  # 16-bit ones computed in float32
        if per_sequence:  # each sequence over its own rows; a length or key_start out of range gives NaN
            if key_start is not None:
                _check_per_sequence(key_start, "key_start", "one first valid key", q.shape[0])
            starts = [0] * q.shape[0] if key_start is None else key_start.tolist()
            with self.work(2 * k_cache[..., 0].numel() * row_bytes / BYTES_PER_S):
                for b, (end, first) in enumerate(zip(length.tolist(), starts)):
                    if not 0 <= first < end <= k_cache.shape[2]:
                        self.write(out[b:b + 1], torch.full_like(q[b:b + 1], math.nan))
                        continue
                    k, v = (expand_kv_heads(c[b:b + 1, :, first:end], heads) for c in (k_cache, v_cache))
                    self.write(out[b:b + 1], _attention(q[b:b + 1], k, v, False, scale))
            return
        _check_key_start(key_start, q.shape[0], length - 1, "length - 1")
        with self.work(2 * k_cache[:, :, :length, 0].numel() * row_bytes / BYTES_PER_S):  # K, V once, each head once
            k, v = (expand_kv_heads(c[:, :, :length], heads) for c in (k_cache, v_cache))
            self.write(out, _padded(lambda *qkv: _attention(*qkv, False, scale), q, k, v, key_start))

    @launched
    def update_cache_paged(self, k_new, v_new, k_pages, v_pages, block_table, pos):
        """task5/binding.cpp's update_cache_paged: each new row into the page its block table names."""
        _check_cuda_float32(k_pages, "k_pages")
        _check_per_sequence(pos, "pos", "the first new position", block_table.shape[0])
        page_size, max_pages, n_new = k_pages.shape[2], block_table.shape[1], k_new.shape[2]
        with self.work(2 * k_new.nbytes / BYTES_PER_S):
            for b, p in enumerate(pos.tolist()):
                if not 0 <= p <= max_pages * page_size - n_new:
                    continue
                for t in range(n_new):
                    page = int(block_table[b, (p + t) // page_size])
                    if 0 <= page < k_pages.shape[0]:
                        k_pages[page, :, (p + t) % page_size] = k_new[b, :, t]
                        v_pages[page, :, (p + t) % page_size] = v_new[b, :, t]

    @launched
    def decode_paged(self, q, k_pages, v_pages, out, block_table, length, scale, splits=0, key_start=None):
        """task5/binding.cpp's decode_paged: the pages gathered into a contiguous cache, then decode; a sequence
        whose table names a page outside the pool for a row it holds gets NaN (its length taken as 0)."""
        _check_cuda_float32(k_pages, "k_pages")
        _check_per_sequence(length, "length", "the positions of the cache written so far", block_table.shape[0])
        page_size, num_pages = k_pages.shape[2], k_pages.shape[0]
        lengths = length.tolist()
        k, v = (pages[block_table.clamp(0, num_pages - 1).long()] for pages in (k_pages, v_pages))
        k, v = (t.permute(0, 2, 1, 3, 4).flatten(2, 3).contiguous() for t in (k, v))  # (batch, kv_heads, rows, d)
        for b, end in enumerate(lengths):
            used = block_table[b, :max(0, -(-end // page_size))]
            if bool(((used < 0) | (used >= num_pages)).any()):
                lengths[b] = 0
        fixed = torch.tensor(lengths, dtype=torch.int32)
        fixed.on_host = False
        run_kernel(lambda: self.decode.__wrapped__(self, q, k, v, out, fixed, scale, splits, key_start), (), {})

    def splits_for(self, batch, heads, kv_heads, max_length, head_dim):
        return max(1, min(self.MAX_SPLITS, max_length // 512))

    @launched
    def linear(self, x, weight, out):
        """The given product of a decode step's rows with a weight (common/csrc/linear_rows.cu), in float32 or in
        the weight's 16-bit type."""
        if weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise RuntimeError(f"weight must be float32, bfloat16 or float16, got {str(weight.dtype)[6:]}")
        for t, name in ((weight, "weight"), (x, "x"), (out, "out")):
            if weight.dtype == torch.float32:
                _check_cuda_float32(t, name)
            elif getattr(t, "on_host", False):
                raise RuntimeError(f"{name} must be a CUDA tensor, got one on cpu (move it with .cuda())")
            elif t.dtype != weight.dtype:
                raise RuntimeError(f"{name} must be {str(weight.dtype)[6:]} like weight, got {str(t.dtype)[6:]}")
            elif not t.is_contiguous():
                raise RuntimeError(f"{name} must be contiguous (call .contiguous() first)")
        for t, name in ((x, "x"), (weight, "weight"), (out, "out")):
            _check_dim(t, name, 2)
        if not 1 <= x.shape[0] <= self.linear_max_rows():
            raise RuntimeError(f"x must hold 1 to {self.linear_max_rows()} rows (one token per sequence), got shape "
                               f"{list(x.shape)}")
        per_load = 16 // x.element_size()
        if weight.shape[1] != x.shape[1] or x.shape[1] % per_load:
            raise RuntimeError(f"weight must be (out_features, {x.shape[1]}) and in_features a multiple of "
                               f"{per_load}, got {list(weight.shape)}")
        if tuple(out.shape) != (x.shape[0], weight.shape[0]):
            raise RuntimeError(f"out must be (rows, out_features) = {[x.shape[0], weight.shape[0]]}, got {list(out.shape)}")
        out.copy_(x.float() @ weight.float().t())  # float32 sums, rounded once to the type

    def linear_max_rows(self):
        return 8

    def max_head_dim(self):
        return 128

    def max_splits(self):
        return self.MAX_SPLITS


class Task2Kernels(StandInKernels):
    """task2/binding.cpp's `softmax`, `gemm_nt`, `gemm_nn` and `attention`, computed in PyTorch."""

    def softmax(self, x, out):
        _check_cuda_float32(x, "x")
        _check_cuda_float32(out, "out")
        _check_dim(x, "x", 2)
        _check_dim(out, "out", 2)
        if out.shape != x.shape:
            raise RuntimeError(f"out must have the same shape as x: got {list(out.shape)} and {list(x.shape)}")
        if out.data_ptr() != x.data_ptr() and _overlaps(out, x):
            raise RuntimeError("out must be x itself or not share memory with it")
        with self.work(2 * x.nbytes / BYTES_PER_S):
            self.write(out, torch.softmax(x, dim=-1))

    def _gemm(self, a, b, c, nt):
        for t, name in ((a, "a"), (b, "b"), (c, "c")):
            _check_cuda_float32(t, name)
            _check_dim(t, name, 3)
        b_k, b_n = (2, 1) if nt else (1, 2)
        for x, x_name, x_dim, y, y_name, y_dim, what in ((a, "a", 0, b, "b", 0, "batch"), (a, "a", 2, b, "b", b_k, "k"),
                                                         (c, "c", 0, a, "a", 0, "batch"), (c, "c", 1, a, "a", 1, "m"),
                                                         (c, "c", 2, b, "b", b_n, "n")):
            if x.shape[x_dim] != y.shape[y_dim]:
                raise RuntimeError(f"{x_name} and {y_name} disagree on {what}: {x_name}.size({x_dim}) = "
                                   f"{x.shape[x_dim]} but {y_name}.size({y_dim}) = {y.shape[y_dim]}")
        _check_no_overlap(c, "c", a, "a")
        _check_no_overlap(c, "c", b, "b")
        with self.work(2 * a.numel() * c.shape[2] / FLOPS_PER_S):
            self.write(c, a @ (b.transpose(1, 2) if nt else b))

    def gemm_nt(self, a, b, c):
        self._gemm(a, b, c, True)

    def gemm_nn(self, a, b, c):
        self._gemm(a, b, c, False)

    def attention(self, q, k, v, out, causal, scale):
        for t, name in ((q, "q"), (k, "k"), (v, "v"), (out, "out")):
            _check_cuda_float32(t, name)
            _check_dim(t, name, 4)
        if v.shape != k.shape or out.shape != q.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
            raise RuntimeError(f"q, k, v, out: shapes {[list(t.shape) for t in (q, k, v, out)]} disagree")
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            _check_no_overlap(out, "out", t, name)
        if q.shape[3] > 128:
            raise RuntimeError(f"head_dim must be at most 128, got {q.shape[3]}")
        if causal and q.shape[2] > k.shape[2]:
            raise RuntimeError(f"causal attention needs seq_q <= seq_k, got seq_q = {q.shape[2]} and "
                               f"seq_k = {k.shape[2]}")
        _check_finite(scale)
        with self.work(_attention_seconds(q, k, causal)):
            self.write(out, _attention(q, k, v, causal, scale))


KERNELS = {2: Task2Kernels, 4: Task4Kernels, 5: Task5Kernels}


# -- the kernels as operators ---------------------------------------------------------------

def binding_schemas(task: int) -> dict[str, str]:
    """The operators taskN/binding.cpp registers, {name: schema}, read from its KIT_OPERATORS block."""
    source = (REPO / f"task{task}" / "binding.cpp").read_text()
    block = re.search(r"^KIT_OPERATORS\(m\) \{\n(.*?)^\}", source, re.S | re.M).group(1)
    schemas = ["".join(re.findall(r'"([^"]*)"', literals))
               for literals in re.findall(r'm\.def\(((?:\s*"[^"]*")+)\s*\);', block)]
    found = {schema.split("(", 1)[0]: schema for schema in schemas}
    if len(found) != block.count("m.def(") or len(found) != len(schemas):  # a def this reader missed, or twice
        raise ValueError(f"task{task}/binding.cpp: {block.count('m.def(')} m.def calls in KIT_OPERATORS, {len(found)} "
                         "schemas read (write each as m.def(\"...\" \"...\"); with plain string literals only)")
    return found


_LIBRARIES: dict[str, torch.library.Library] = {}  # a namespace is defined once a process, then kept
_OPERATOR_MODULES: dict[str, StandInKernels] = {}  # the stand-in module each namespace's operators call now


OPERATOR_CALLS: dict[str, int] = {}  # "namespace.name": calls that reached a stand-in through its operator


def with_operators(module: StandInKernels, task: int, solution: bool, kernels: str | None = None) -> StandInKernels:
    """module, named and registered as a build of taskN/binding.cpp is: its functions are the operators
    torch.ops.taskN_stand_in_<student|solution>[_<kernels>].<name>, with the binding's schemas, for CPU tensors (a
    real build's namespace is taskN_student, taskN_solution or taskN_solution_<kernels>; these keep clear of them
    where a GPU run loads those)."""
    name = f"task{task}_stand_in_{'solution' if solution else 'student'}{f'_{kernels}' if kernels else ''}"
    module.__name__ = name
    _OPERATOR_MODULES[name] = module
    if name not in _LIBRARIES:
        library = torch.library.Library(name, "DEF")
        for op, schema in binding_schemas(task).items():
            library.define(schema)
            library.impl(op, functools.partial(_operator_call, name, op), "CPU")
        _LIBRARIES[name] = library
    return module


def _operator_call(namespace, op, *args):
    if op == "softmax" and _overlaps(args[1], args[0]):  # the operator form's own rule (task2/binding.cpp)
        raise RuntimeError("out must not share memory with x in the operator form (the module's softmax takes out = x)")
    OPERATOR_CALLS[f"{namespace}.{op}"] = OPERATOR_CALLS.get(f"{namespace}.{op}", 0) + 1
    return getattr(_OPERATOR_MODULES[namespace], op)(*args)
KERNELS_OF = {5: (5, 4), 6: (5, 4), 7: (5, 4)}  # the kernels a task's worker builds: task 5's layer runs task 4's
PYTHON_OVER_KERNELS = (6, 7)  # the student writes Python that runs tasks 4 and 5's kernels


# -- the worker -----------------------------------------------------------------------------

class InProcessWorker:
    """harness.sandbox.Worker's interface, running taskN/entry.py in this process on the checks' own tensors."""

    def __init__(self, task, student_dir, *, solution=False, scratch=None, sanitize=None, harness=None, **options):
        self.task, self.solution, self.sanitize, self.harness = task, solution, sanitize, harness
        self.student_dir = Path(student_dir)
        self.file_notes, self.notes, self.attention_ops = [], [], set()
        self.last_ranges, self.sanitizer_log, self.exit_code = [], bytearray(), None
        self.entry, self.kept, self.resume = None, {}, False

    def start(self):
        self.harness.worker_started(self.task, self.solution)
        if self.task in PYTHON_OVER_KERNELS:  # the worker's view holds the reference's file as the student's
            name = f"task{self.task}.attention"
            own = self.student_dir / f"task{self.task}" / "attention.py"
            if self.solution or not own.is_file():
                module = importlib.import_module(f"task{self.task}.solution.attention" if self.solution else name)
            else:  # the student's checkout's file (the kernels stay the stand-ins)
                spec = importlib.util.spec_from_file_location(name, own)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            self.harness.monkeypatch.setitem(sys.modules, name, module)
        path = REPO / f"task{self.task}" / "entry.py"
        spec = importlib.util.spec_from_file_location(f"task{self.task}.entry", path)
        entry = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(entry)  # a fresh module each start, as in a new worker process
        except Exception as err:  # noqa: BLE001  as the worker reports it
            raise WorkerError(type(err).__name__, str(err), "") from None
        self.entry = entry

    def ready(self):
        if self.entry is None and self.resume:
            self.resume = False
            try:
                self.start()
            except WorkerError:
                self.stop_until_next_call()  # as the real worker: the next call meets it

    def call(self, name, *args, timeout=None, **kwargs):
        if self.entry is None and self.resume:
            self.resume = False
            self.start()
        if self.entry is None:
            raise WorkerDied("the worker is not running")
        try:
            value = getattr(self.entry, name)(*_resolve(args, self.kept), **_resolve(kwargs, self.kept))
        except Exception as err:  # noqa: BLE001  a student's exception is an answer
            raise WorkerError(type(err).__name__, str(err), "") from None
        reply = wire.decode_reply(wire.encode_reply(value))  # what a real worker's reply becomes
        for sent, received in zip(_tensors(value), _tensors(reply)):  # where each was made, as wire says
            received.worker_device = "cpu" if getattr(sent, "on_host", False) else "cuda"
        return reply

    def call_measuring_memory(self, name, *args, timeout=None):
        return self.call(name, *args), None  # the stand-in GPU counts no memory

    def call_on_gpu(self, name, *args, timeout=None):
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # each its own allocation
        self.last_ranges = [(a.data_ptr(), a.nbytes) for a in args if isinstance(a, torch.Tensor)]
        return self.call(name, *args)

    def take_kernels_built_ahead(self):
        pass  # the stand-in kernels are made when the worker starts

    def stop_until_next_call(self):
        self.stop()
        self.resume = True

    def keep(self, name, value):
        self.kept[name] = value
        return wire.Kept(name)

    def drop(self, name):
        self.kept.pop(name, None)

    def stop(self):
        if self.sanitize and self.entry is not None:  # what a clean pass of that tool prints last
            tool = self.sanitize[self.sanitize.index("--tool") + 1]
            self.sanitizer_log += (b"========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
                                   if tool == "racecheck" else b"========= ERROR SUMMARY: 0 errors\n")
            self.exit_code = 0
        self.entry, self.kept = None, {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _tensors(value):
    """The tensors of a reply, in the order common/wire.py encodes them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


# -- the harness ----------------------------------------------------------------------------

SMALL = {  # module: {name: the small value the stand-in uses}
    "checks.task2.measure": {"TIMING_SHAPE": (2, 3, 96, 32)},
    "checks.task4.measure": {"PERF_CASE": (1, 2, 1024, 24), "HEAD_DIM_CASES": [(1, 2, 256, 64), (1, 2, 200, 80)],
                   "HANDOUT_CASES": [(2, 64)], "HANDOUT_LAYER": (64, 4), "ESTIMATE_TFLOPS": FLOPS_PER_S / 1e12,
                   "ESTIMATE_HALF_TFLOPS": FLOPS_PER_S / 1e12, "HALF_BENCHMARKS": [(1, 2, 256, 32)],
                   "BACKWARD_BENCHMARKS": [(1, 2, 256, 32)]},
    # the copy model small enough to train twice on a CPU in seconds, and still learn in its steps
    "task4.train": {"TRAINING": TrainingConfig(layers=2, hidden=32, heads=2, prefix=9, batch=16, steps=150, lr=3e-3)},
    "checks.task5.measure": {"DECODE_BENCHMARKS": [(1, 2, 2, 2048, 48), (1, 1, 1, 4096, 48), (1, 4, 2, 2048, 48)], "LONG_CACHE_NEEDS_SPLITS_BELOW": 2,
                   "PAGED_BENCHMARK": (2, 2, 2, 256, 16), "SHAPE_BENCHMARKS": [(1, 3, 3, 700, 40), (2, 4, 2, 300, 48)],
                   "HANDOUT": dict(batch=2, prompt=40, max_seq=64, hidden=64, heads=4, steps=8),
                   "HALF_BENCHMARKS": [(1, 2, 2, 2048, 48, torch.bfloat16), (1, 4, 2, 2048, 48, torch.float16)]},
}

# Hidden cases timed at their real sizes (hundreds of MB) cost minutes on a CPU: the stand-in's instead.
SMALL_HIDDEN = {(5, "shapes"): [(2, 3, 3, 900, 24), (3, 4, 1, 200, 40)]}


class Harness:
    """The stand-ins of one test: which kernels the worker and the reference get, and the patches."""

    def __init__(self, monkeypatch, tmp_path):
        self.monkeypatch, self.tmp_path = monkeypatch, tmp_path
        self.student = {task: Behaviour() for task in CUDA_TASKS}  # the student's build, by task
        self.worker_kernels: dict[int, StandInKernels] = {}
        self.loads: list[tuple[int, bool, str | None]] = []  # every load_extension call

    def worker_started(self, task, solution):
        """A new worker builds the kernels of its view: the reference's under --solution, else the student's."""
        for number in KERNELS_OF.get(task, (task,)):
            self.worker_kernels[number] = KERNELS[number](Behaviour() if solution else self.student[number])
            module = importlib.import_module(f"task{number}.attention")
            for key in [key for key in module.extension.built if not key[0]]:
                del module.extension.built[key]

    def load_extension(self, task, solution, **options):
        inspect.signature(_REAL_LOAD).bind(task, solution, **options)  # called as the real one must be
        kernels = options.get("kernels")
        self.loads.append((task, solution, kernels))
        if kernels and not build.kernel_sources(task, solution, kernels):
            raise build.BuildError(f"task {task}: source files missing: no task{task}/solution/{kernels}/*.cu")
        if solution:
            return with_operators(KERNELS[task](), task, solution, kernels)  # the reference, built and run by the trusted side
        if self.worker_kernels[task].behaviour.build_error:
            raise build.BuildError(self.worker_kernels[task].behaviour.build_error)
        return with_operators(self.worker_kernels[task], task, solution)

    def run(self, task: int, *args: str) -> dict:
        """`python -m taskN.test ARGS --json PATH`, in this process; the record, validated as the grader does."""
        import json

        from grader.runner import valid_record

        path = self.tmp_path / f"task{task}-{len(list(self.tmp_path.glob('*.json')))}.json"
        test = importlib.import_module(f"checks.task{task}.test")
        with CudaOnTheCpu():
            test.main([*args, "--json", str(path)])
        # every sanitizer pass a test starts ends with it: none may run on into the next test (or, graded, into a
        # timed part)
        passes = [t for t in threading.enumerate() if t.name == sanitize.DAEMON_NAME]
        for thread in passes:
            thread.join(timeout=30)  # a finished pass's thread may take a moment more to end
        assert not any(t.is_alive() for t in passes), f"a sanitizer pass of task {task} outlived its test"
        return valid_record(json.loads(path.read_text()), task)

    def as_handout(self, calibration_file: Path):
        """The student's handout: no reference solutions; the estimate comes from `calibration_file`."""
        self.monkeypatch.setattr(impl, "has_solution", lambda task: False)
        self.monkeypatch.setattr(calibration, "PATH", calibration_file)


_REAL_LOAD = build.load_extension


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """A Harness with every stand-in in place (see the module's docstring)."""
    harness = Harness(monkeypatch, tmp_path)
    for name, value in (("is_available", lambda: True), ("synchronize", lambda device=None: None),
                        ("get_device_name", lambda device=None: GPU_NAME),
                        ("get_device_properties", lambda device=None: GPU), ("Event", HostEvent),
                        ("Stream", StandInStream), ("stream", stand_in_stream),
                        ("current_stream", lambda device=None: StandInStream()), ("CUDAGraph", StandInGraph),
                        ("graph", stand_in_graph)):
        monkeypatch.setattr(torch.cuda, name, value)
    if hasattr(torch, "accelerator"):  # a CUDA build of PyTorch reaches the GPU's stream through it (an optimizer's step)
        monkeypatch.setattr(torch.accelerator, "current_stream", lambda device=None: StandInStream())
    monkeypatch.setattr(torch, "Generator", StandInGenerator)
    monkeypatch.setattr(build, "load_extension", harness.load_extension)
    clock = StandInClock()
    monkeypatch.setattr(f"{__name__}.CLOCK", clock)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    for task in CUDA_TASKS:  # each task's own extension(), with an empty cache: no build of another test is reused
        monkeypatch.setattr(importlib.import_module(f"task{task}.attention").extension, "built", {})
    monkeypatch.setattr("harness.sandbox.Worker", lambda *a, **kw: InProcessWorker(*a, harness=harness, **kw))
    monkeypatch.setattr(sanitize, "find_sanitizer", lambda: "compute-sanitizer (stand-in)")
    monkeypatch.setattr(bench, "COPY_BYTES", 16 << 20)
    measured_copy = bench.copy_bandwidth_gbs

    def copy_bandwidth_gbs(*args, **kwargs):
        measured_copy(*args, **kwargs)  # its own lines run, copying on the CPU
        return BYTES_PER_S / 1e9  # the stand-in GPU's: the rate its kernels are timed at reading the cache
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", copy_bandwidth_gbs)
    for module, values in SMALL.items():
        for name, value in values.items():
            monkeypatch.setattr(f"{module}.{name}", value)
    hidden_cases = cli.extra_cases

    def extra_cases(task, part, hidden):
        cases = hidden_cases(task, part, hidden)  # read as the grader reads them
        return SMALL_HIDDEN.get((task, part), cases) if cases else cases
    monkeypatch.setattr(cli, "extra_cases", extra_cases)
    return harness
