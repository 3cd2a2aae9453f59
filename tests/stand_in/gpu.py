"""The stand-in GPU: tensors asked for on "cuda" made on the CPU, its streams, CUDA graphs, clock, events and
generators (tests/stand_in/__init__.py says what stands in for what)."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import types
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten




REPO = Path(__file__).resolve().parents[2]
GPU_NAME = "stand-in GPU (PyTorch on the CPU)"
GPU = types.SimpleNamespace(name=GPU_NAME, multi_processor_count=1, total_memory=8 << 30, major=9, minor=0)
# The stand-in GPU's speed: a kernel's call lasts its modelled time on the clock, whatever the CPU took (StandInClock),
# and slow enough that the CPU's time for what a request does around its calls is under 1% of it at the sizes below,
# so a kernel twice as slow is timed twice as slow.
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


class Capture(threading.local):
    """The graph being captured (None: none), and whether a stand-in kernel is running (its own reads are the
    kernel's, from device memory). Each thread's own: a sanitizer pass runs the stand-in kernels in a thread beside
    the checks (on a GPU, in processes of its own), and its kernels are no step of the checks' capture."""

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


class StandInClock(threading.local):
    """harness/bench.py's clock: the host's, with each stand-in kernel's call counted at its modelled time instead of
    the CPU's.
    Each thread's own: the kernels a sanitizer pass runs beside the checks do not lengthen the checks' timings."""

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
