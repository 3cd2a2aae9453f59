"""The `stand_in` fixture: every stand-in in place for one test, and its Harness (the kernels each build gets)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import threading
import types
from pathlib import Path

import pytest
import torch

from common import build, impl

from harness import bench, calibration, cli, sanitize
from task4.train import Config as TrainingConfig
from tests.stand_in import gpu
from tests.stand_in.gpu import (BYTES_PER_S, CUDA_TASKS, FLOPS_PER_S, GPU, GPU_NAME, REPO, CudaOnTheCpu, HostEvent,
                                 StandInClock, StandInGenerator, StandInGraph, StandInStream, stand_in_graph,
                                 stand_in_stream)
from tests.stand_in.kernels import Behaviour, StandInKernels, Task2Kernels
from tests.stand_in.operators import with_operators
from tests.stand_in.task4 import Task4Kernels
from tests.stand_in.task5 import Task5Kernels
from tests.stand_in.worker import InProcessWorker, KERNELS_OF


KERNELS = {2: Task2Kernels, 4: Task4Kernels, 5: Task5Kernels}


# -- the harness ----------------------------------------------------------------------------

SMALL = {  # module: {name: the small value the stand-in uses}
    "checks.task2.measure": {"TIMING_SHAPE": (2, 3, 96, 32)},
    "checks.task4.measure": {"PERF_CASE": (1, 2, 1024, 24), "HEAD_DIM_CASES": [(1, 2, 256, 64), (1, 2, 200, 80)],
                   "HANDOUT_CASES": [(2, 64)], "HANDOUT_LAYER": (64, 4), "ESTIMATE_TFLOPS": FLOPS_PER_S / 1e12,
                   "ESTIMATE_HALF_TFLOPS": FLOPS_PER_S / 1e12, "ESTIMATE_HOPPER_TFLOPS": FLOPS_PER_S / 1e12,
                   "HALF_BENCHMARKS": [(1, 2, 256, 32)]},
    "checks.task4.measure_backward": {"BACKWARD_BENCHMARKS": [(1, 2, 256, 32)],
                                      "BACKWARD_HALF_BENCHMARKS": [(1, 2, 256, 64)],
                                      "ESTIMATE_BACKWARD_TFLOPS": FLOPS_PER_S / 1e12,
                                      "ESTIMATE_BACKWARD_HALF_TFLOPS": FLOPS_PER_S / 1e12},
    # the Hopper part runs in every task 4 flow here (the stand-in GPU is 9.0): a few of its shapes, each path once
    "checks.task4.hopper": {"HOPPER_CASES": [(1, 1, 1, 1, 1, 64, None), (2, 4, 2, 129, 255, 128, None),
                                             (1, 2, 2, 50, 50, 33, None), (2, 4, 2, 30, 200, 128, (5, 199))]},
    # the masks' skip timed at a size the stand-in computes in a moment (it holds a head's scores whole)
    "checks.task4.masks": {"SKIP_SHAPE": (1, 2, 1024, 32),
                           "SKIP_MASKS": {"causal": {}, "a window of 128 keys": {"window_left": 127},
                                          "causal documents of 64": {"cu_seqlens": list(range(0, 1025, 64))}}},
    # the copy model small enough to train twice on a CPU in seconds, and still learn in its steps
    "task4.train": {"TRAINING": TrainingConfig(layers=2, hidden=32, heads=2, prefix=9, batch=16, steps=150, lr=3e-3)},
    "checks.task5.measure": {"DECODE_BENCHMARKS": [(1, 2, 2, 2048, 48), (1, 1, 1, 4096, 48), (1, 4, 2, 2048, 48)], "LONG_CACHE_NEEDS_SPLITS_BELOW": 2,
                   "PAGED_BENCHMARK": (2, 2, 2, 256, 16), "PAGED_HALF_BENCHMARK": (2, 4, 2, 256, 16),
                   "SHAPE_BENCHMARKS": [(1, 3, 3, 700, 40), (2, 4, 2, 300, 48)],
                   "HALF_BENCHMARKS": [(1, 2, 2, 2048, 48, torch.bfloat16), (1, 4, 2, 2048, 48, torch.float16)]},
    "checks.task5.generation": {"HANDOUT": dict(batch=2, prompt=40, max_seq=64, hidden=64, heads=4, steps=8)},
}

# Hidden cases timed at their real sizes (hundreds of MB) cost minutes on a CPU: the stand-in's instead.
SMALL_HIDDEN = {(5, "shapes"): [(2, 3, 3, 900, 24), (3, 4, 1, 200, 40)]}

# A run's arguments: the hidden cases as the grader passes them (grader/runner.py), and the scored parts alone, for a
# test of a bar, a point or a float32 flow (the optional parts, task 4's bf16/fp16 kernel and backward pass, task 5's
# paged and 16-bit caches, move no point and take most of a run's time on the CPU).
HIDDEN = ("--hidden", str(REPO / "grader" / "hidden.py"))
SCORED = {4: ("--attention",), 5: ("--cache", "--decode", "--split", "--layer")}


def failed(record) -> list[str]:
    """A record's failed cases, name and the start of the message: what an assertion on a run shows."""
    return [f"{c['name']}: {c['message'][:300]}" for c in record["cases"] if not c["passed"]]


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
    """A Harness with every stand-in in place (tests/stand_in/__init__.py says what stands in for what)."""
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
    gpu.CAPTURE.graph, gpu.CAPTURE.in_kernel = None, False  # no capture left over from a test that failed in one
    clock = StandInClock()
    monkeypatch.setattr(gpu, "CLOCK", clock)  # the one tests.stand_in.kernels reads
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
