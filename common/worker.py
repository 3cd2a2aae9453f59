"""The worker: the process that runs the student's code for the checks, and nothing else.

`harness/sandbox.py` starts it (inside bubblewrap where installed) in a folder that holds
only the student's files and the given code. It serves requests from the checks over the
socket it was handed: import the task's entry points (`taskN/entry.py`), call one, keep
an object for later calls, exit. It never sees the checks' reference, the secret seed or
the place where results are written; what it sends back is validated by the checks.

Your `print` output and `breakpoint()` work as usual: they use the terminal, not the socket.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import resource
import socket
import sys
import warnings

from common import student_module, watch, wire
from common.tasks import TASKS


def limit_memory(budget: int) -> None:
    """Allow `budget` bytes of address space beyond what the worker holds now (PyTorch loaded).

    Set before the student's code is imported; without capabilities (bubblewrap drops them)
    a process can lower this limit but never raise it.
    """
    size_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:"))
    limit = size_kib * 1024 + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _resolve(value, kept: dict):
    if isinstance(value, wire.Kept):
        return kept[value.name]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, kept) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, kept) for k, v in value.items()}
    return value


def serve(sock: socket.socket, task: int) -> None:
    entry, kept = None, {}
    # A CUDA task's own code is kernel files, which cannot call PyTorch (common/kernel_rules.py); the
    # watch costs tens of microseconds per operator, which would weigh on the timings of given layers
    # and models around the kernels (common/tasks.py says which tasks run under it).
    watching = watch.AttentionOpWatch if TASKS[task].watch_operators else contextlib.nullcontext
    while True:
        request = wire.decode_request(wire.recv_frame(sock, wire.MAX_REQUEST_BYTES))
        op = request["op"]
        reply: dict = {}
        try:
            if op == "exit":  # end now: tearing down after a CUDA fault would only print PyTorch's complaints
                # but first let go of the checks' CUDA tensors: an IPC mapping still held at the
                # end is one the checks wait on, and warn about when they exit
                args = kwargs = None
                kept.clear()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
            if op == "start":
                if request.get("block_attention", True):
                    watch.block_pytorch_attention()
                if request.get("memory_budget"):
                    limit_memory(request["memory_budget"])
                if request.get("watch_operators") is False:  # asked by a run that never reads the record
                    watching = contextlib.nullcontext
                entry = importlib.import_module(f"task{task}.entry")
                reply["ok"] = None
            elif op == "keep":
                kept[request["name"]] = request["value"]
                reply["ok"] = None
            elif op == "drop":
                kept.pop(request["name"], None)
                reply["ok"] = None
            elif op == "call_on_gpu":  # the sanitizer pass: each tensor its own allocation, made here
                import torch

                fn = getattr(entry, request["name"])
                args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in request["args"]]
                reply["ranges"] = [[a.data_ptr(), a.numel() * a.element_size()]
                                   for a in args if isinstance(a, torch.Tensor)]
                with watching():
                    fn(*args)
                torch.cuda.synchronize()
                reply["ok"] = None
            elif op == "call":
                fn = getattr(entry, request["name"])
                args, kwargs = _resolve(request["args"], kept), _resolve(request["kwargs"], kept)
                measure = request.get("measure_memory")  # python -m harness.compare: the GPU memory the call adds
                if measure:
                    import torch

                    torch.cuda.synchronize()
                    before = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                with watching():
                    reply["ok"] = fn(*args, **kwargs)
                if measure:
                    torch.cuda.synchronize()
                    reply["peak_bytes"] = torch.cuda.max_memory_allocated() - before
            else:
                raise ValueError(f"unknown request {op!r}")
        except BaseException as err:  # noqa: BLE001  a student's exception is an answer, not the worker's end
            if isinstance(err, KeyboardInterrupt):
                raise
            reply = {"error": {"type": type(err).__name__, "message": str(err)[:wire.MAX_TEXT],
                               "traceback": wire.short_traceback(err, 4)[:wire.MAX_TEXT]}, "ranges": reply.get("ranges", [])}
        reply["attention_ops"] = sorted(watch.seen)
        reply["notes"] = list(student_module.notes)
        try:
            payload = wire.encode_reply(reply)
        except TypeError as err:
            payload = wire.encode_reply({"error": {"type": "TypeError", "message": str(err), "traceback": ""},
                                         "attention_ops": sorted(watch.seen), "notes": list(student_module.notes)})
        wire.send_frame(sock, payload)


def main() -> None:
    # A worker that runs no GPU code (task 1, task 3's CPU cases) may still make PyTorch ask for a GPU (autograd
    # does); where CUDA cannot start, PyTorch's warning would read as a fault of the student's code.
    warnings.filterwarnings("ignore", message="CUDA initialization", category=UserWarning)
    fd, task = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.socket(fileno=fd)
    try:
        serve(sock, task)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the checks are done, or gone (a sanitizer pass ends its worker so): nothing left to do
    finally:
        sock.close()


if __name__ == "__main__":
    main()
