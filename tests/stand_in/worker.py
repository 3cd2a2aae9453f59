"""The stand-in worker: taskN/entry.py run in this process, its replies across common/wire.py."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import torch

from common import wire

from harness.outcome import Cause
from harness.sandbox import CALL_TIMEOUT_S, MAX_RESTARTS, WorkerDied, WorkerError
from common.worker import _resolve
from tests.stand_in.gpu import REPO
from tests.stand_in.kernels import STAND_IN_BUILDS, Hang


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
        # a hang ended the process: the next call starts another, as the real one (never under a sanitizer: one
        # process makes one report there)
        self.died, self.restarts = False, MAX_RESTARTS if sanitize else 0
        self.builds, self.private_builds = STAND_IN_BUILDS, None  # where its kernels say they were loaded from

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
        if self.entry is None and self.died:  # harness.sandbox.Worker's _ensure_running after a crash
            if self.restarts >= MAX_RESTARTS:
                raise WorkerDied(f"not run: the process running your code crashed {MAX_RESTARTS} times already")
            self.restarts, self.died = self.restarts + 1, False
            self.start()
        if self.entry is None:
            raise WorkerDied("the worker is not running")
        try:
            value = getattr(self.entry, name)(*_resolve(args, self.kept), **_resolve(kwargs, self.kept))
        except Hang:  # as the real worker after its call's time: stopped, and the words it says
            self.stop()
            self.died = True
            raise WorkerDied(f"your code did not answer within {timeout or CALL_TIMEOUT_S:.0f} s (an endless loop, "
                             "or a hang?)", Cause.TIMED_OUT) from None
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
