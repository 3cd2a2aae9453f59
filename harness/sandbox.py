"""Where student code runs: a worker process, talked to over a socket (trusted side).

`Worker` makes the worker's view of the files (harness/view.py: inside bubblewrap where installed),
starts `python -m common.worker` there and talks to it over a socket (common/wire.py): every reply
is validated, a crash or a hang costs the case it happened in, and the worker is started again.
Its processes are watched (harness/processes.py): a fork or thread bomb ends it, and the case says why.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import wire
from common.impl import REPO
from common.tasks import TASKS, runs_student_python
from harness import processes
from harness.outcome import Cause
from harness.processes import with_parent
import harness.view
from harness.view import bwrap_command, copy_builds, make_view

START_TIMEOUT_S = 300  # importing torch, and building a CUDA task's extension
CALL_TIMEOUT_S = 300
MAX_RESTARTS = 3  # a crashing case costs that case; after this many crashes the rest fail at once


class WorkerError(Exception):
    """The student's code raised; `kind` is the exception's type name."""

    def __init__(self, kind: str, message: str, trace: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.trace = kind, message, trace


def signal_words(signum: int) -> str:
    """A signal that ended a process, as a student reads it: `SIGSEGV (segmentation fault)`."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    meaning = {"SIGSEGV": "segmentation fault", "SIGABRT": "aborted", "SIGKILL": "killed, perhaps out of memory"}
    return f"{name} ({meaning.get(name, 'killed by a signal')})"


class WorkerDied(Exception):
    """The worker ended, hung, or answered with something that is not a message; `cause` (harness/outcome.py)
    says which where the gradebook flags it."""

    def __init__(self, message: str, cause: str | None = None):
        super().__init__(message)
        self.cause = cause


class Worker:
    """One task's worker. Use as a context manager; `call` runs an entry point of taskN/entry.py."""

    def __init__(self, task: int, student_dir: Path, *, solution: bool = False, scratch: Path | None = None,
                 memory_limit: int | None = None, cuda: bool = True, hide: tuple[Path, ...] = (),
                 block_attention: bool = True, purpose: str = "checks", sanitize: list[str] | None = None,
                 builds: Path | None = None, watch_operators: bool = True):
        # memory_limit: bytes of address space the student's code may add to the worker (PyTorch loaded)
        self.task, self.student_dir, self.solution = task, Path(student_dir), solution
        self.memory_limit, self.cuda, self.hide = memory_limit, cuda, list(hide)
        self.block_attention = block_attention
        # False: no record of the attention operators the student's Python calls (common/tasks.py says what that
        # costs per operator), where nothing reads it: python -m harness.compare, whose timings it would weigh on.
        # PyTorch's attention stays blocked.
        self.watch_operators = watch_operators
        self.sanitize = sanitize  # compute-sanitizer's command line (harness/sanitize.py): the worker runs under it
        self.sanitizer_log = bytearray()
        self.exit_code: int | None = None
        self.last_ranges: list = []
        self.last_peak_bytes: int | None = None
        kind = "solution" if solution else "student"
        self.scratch = Path(scratch) if scratch else REPO / "build"
        # One folder per purpose: two workers of a task at once must not share their view. The path stays
        # the same from run to run, so ninja's cache of the student's build (keyed by source paths) holds.
        self.view = self.scratch / "worker" / f"task{task}-{kind}-{purpose}"
        # Kept between runs: ninja's cache. The workers of the tasks whose student files are only kernels
        # share one folder in a grading (the grader names it), so task 5's worker finds task 4's kernels
        # built. A worker that runs a student's Python never writes there: the code could leave a library
        # that another task's worker would load without its kernels held to kernel_rules. Inside
        # bubblewrap it gets a private copy of the kernels it uses, mounted at the shared folder's path
        # (ninja's commands name that path, so nothing is built again); without, a folder of its own.
        shared = builds or os.environ.get("KIT_WORKER_BUILDS")
        own = self.scratch / "worker-builds" / f"task{task}-{kind}"
        self.private_builds: Path | None = None  # what is really mounted at self.builds, where that differs
        self.taken_builds = False
        if shared and not runs_student_python(task):
            self.builds = Path(shared) / kind
        elif shared and harness.view.sandbox_status() == "bubblewrap":
            self.builds, self.private_builds = Path(shared) / kind, own
        else:
            self.builds = own
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.attention_ops: set[str] = set()
        self.notes: list[str] = []
        self.restarts = MAX_RESTARTS if sanitize else 0  # under a sanitizer, one process makes one report
        self.resume = False  # stopped on purpose: the next call starts it again (stop_until_next_call)
        self.stopped_for = ""  # what the watch of its processes ended the worker for ("": it did not)
        self.file_notes = make_view(task, self.student_dir, self.view, solution)

    # -- process ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker and import the task's entry points (WorkerError if the student's file fails)."""
        self.spawn()
        self.handshake()

    def spawn(self) -> None:
        """Start the worker's process; `handshake` then builds and imports the student's code.

        Call this from a thread that outlives the worker: the parent-death signal (ours and bubblewrap's
        --die-with-parent) fires when the *thread* that spawned the process ends, not the process.
        """
        parent, child = socket.socketpair()
        self.builds.mkdir(parents=True, exist_ok=True)
        if self.private_builds:  # filled by take_kernels_built_ahead
            self.private_builds.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KIT_", "PYTHON"))}
        env |= {"PYTHONPATH": str(self.view), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONSAFEPATH": "1", "KIT_BUILD_ROOT": str(self.builds)}
        if not self.cuda:
            env["CUDA_VISIBLE_DEVICES"] = ""
        cmd = [sys.executable, "-m", "common.worker", str(child.fileno()), str(self.task)]
        fds, writable = [child.fileno()], [(self.private_builds or self.builds, self.builds)]
        if self.sanitize:
            cmd = self._sanitized(cmd, env, fds, writable)
        if harness.view.sandbox_status() == "bubblewrap":
            if not self.sanitize:  # a TMPDIR in a hidden folder is not there (nvcc writes its temporary files there)
                env["TMPDIR"] = "/tmp"  # the sandbox's own, empty
            hide = [self.student_dir, *self.hide, self.scratch]
            if os.environ.get("KIT_BUILD_ROOT"):  # the checks' builds, the published reference among them
                hide.append(Path(os.environ["KIT_BUILD_ROOT"]))
            for grading in ("KIT_WORKER_BUILDS", "KIT_GPU_SHARE"):  # the grading's scratch folder, wherever
                if os.environ.get(grading):                      # TMPDIR puts it: its locks, the builds
                    hide.append(Path(os.environ[grading]).parent)
            cmd = bwrap_command(self.view, writable, hide) + cmd
        if self.memory_limit:  # few threads and malloc arenas: each reserves address space the limit counts
            env |= {"OMP_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"}

        self.proc = subprocess.Popen(with_parent(cmd), cwd=self.view, env=env, pass_fds=tuple(fds),
                                     start_new_session=True)
        child.close()
        for fd in fds[1:]:
            os.close(fd)  # the sanitizer's end of its log: only the worker's side holds it now
        self.sock = parent
        self.stopped_for = ""
        threading.Thread(target=processes.watch, args=(self.proc, self._stopped_for), daemon=True).start()

    def _stopped_for(self, proc: subprocess.Popen, why: str) -> None:
        if self.proc is proc:  # not a worker started since
            self.stopped_for = why

    def handshake(self) -> None:
        """Import the task's entry points in the spawned worker (any thread may wait for this)."""
        self._request({"op": "start", "block_attention": self.block_attention, "memory_budget": self.memory_limit,
                       "watch_operators": self.watch_operators},
                      timeout=START_TIMEOUT_S)

    def _sanitized(self, cmd: list[str], env: dict, fds: list[int], writable: list[tuple[Path, Path]]) -> list[str]:
        """Run the worker under compute-sanitizer, its report written to a pipe only the checks read."""
        import threading

        tmp = (self.private_builds or self.builds).parent / f"sanitizer-tmp-{self.view.name}"  # one per tool
        tmp.mkdir(parents=True, exist_ok=True)
        writable.append((tmp, tmp))
        env |= {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "TMPDIR": str(tmp)}  # every tensor its own allocation
        read_end, write_end = os.pipe()
        fds.append(write_end)

        def collect():
            with os.fdopen(read_end, "rb") as pipe:
                while chunk := pipe.read(65536):
                    if len(self.sanitizer_log) < 4 << 20:
                        self.sanitizer_log += chunk

        self.log_reader = threading.Thread(target=collect, daemon=True)
        self.log_reader.start()
        return [*self.sanitize, "--log-file", f"/dev/fd/{write_end}", *cmd]

    def stop(self) -> None:
        """End the worker and every process it started."""
        if self.sock:
            try:
                self.sock.settimeout(2)
                wire.send_frame(self.sock, wire.encode_request({"op": "exit"}))
            except OSError:
                pass
            self.sock.close()
            self.sock = None
        if self.proc:
            try:  # a leftover thread must not keep the checks waiting; the sanitizer needs time for its report
                self.proc.wait(timeout=60 if self.sanitize else 5)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.exit_code = self.proc.wait()
            self.proc = None
            if self.sanitize:
                self.log_reader.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        shutil.rmtree(self.view, ignore_errors=True)

    def exit_reason(self) -> str:
        if self.proc is None:
            return "the worker is not running"
        code = self.proc.poll()
        if code is None:
            return "the worker stopped answering"
        if self.stopped_for:
            return f"the process running your code was stopped for having {self.stopped_for}"
        if code > 128 and harness.view.sandbox_status() == "bubblewrap":
            code = 128 - code  # bubblewrap reports a signal that ended its child as 128 + the signal
        if code < 0:
            return f"the process running your code crashed with {signal_words(-code)}"
        return f"the process running your code exited with code {code}"

    # -- requests --------------------------------------------------------------------------
    def _request(self, request: dict, timeout: float):
        if self.sock is None:
            raise WorkerDied("the worker is not running")
        try:
            self.sock.settimeout(timeout)
            wire.send_frame(self.sock, wire.encode_request(request))
            payload = wire.recv_frame(self.sock, wire.MAX_REPLY_BYTES)
        except socket.timeout:
            self.stop()
            raise WorkerDied(f"your code did not answer within {timeout:.0f} s (an endless loop, or a hang?)",
                             Cause.TIMED_OUT) from None
        except (EOFError, OSError, wire.ProtocolError) as err:
            time.sleep(0.2)  # let the exit status arrive
            if isinstance(err, (EOFError, OSError)):
                reason, cause = self.exit_reason(), None
            else:
                reason, cause = f"a malformed reply: {err}", Cause.MALFORMED
            self.stop()
            raise WorkerDied(reason, cause) from None
        try:
            reply = wire.decode_reply(payload)
            ranges = reply.get("ranges", [])
            self.last_ranges = [tuple(int(x) for x in r) for r in ranges[:64] if isinstance(r, list) and len(r) == 2]
            ops, notes = reply.get("attention_ops", []), reply.get("notes", [])
            self.attention_ops |= {str(op)[:200] for op in ops}
            self.notes = [str(n)[:1000] for n in notes][:20]
        except (wire.ProtocolError, AttributeError, TypeError, ValueError) as err:
            self.stop()
            raise WorkerDied(f"a malformed reply: {err}", Cause.MALFORMED) from None
        if "error" in reply:
            e = reply["error"]
            if not isinstance(e, dict):
                raise WorkerDied("a malformed error reply", Cause.MALFORMED)
            raise WorkerError(str(e.get("type", "Exception"))[:100], str(e.get("message", ""))[:wire.MAX_TEXT],
                              str(e.get("traceback", ""))[:wire.MAX_TEXT])
        if "ok" not in reply:
            raise WorkerDied("a malformed reply: no result", Cause.MALFORMED)
        peak = reply.get("peak_bytes")
        self.last_peak_bytes = peak if type(peak) is int and peak >= 0 else None
        return reply["ok"]

    def take_kernels_built_ahead(self) -> None:
        """Copy the kernels of the tasks this one uses, as the grading built them ahead, into this worker's own
        folder (waiting for those builds to end): a test calls it before its worker first loads them."""
        if self.private_builds and not self.taken_builds:
            # a worker builds the files it holds as a student's (common/build.py's build_dir)
            copy_builds(self.builds, self.private_builds, [f"task{n}-student" for n in TASKS[self.task].uses])
            self.taken_builds = True

    @property
    def runs_student_python(self) -> bool:
        return runs_student_python(self.task)

    def stop_until_next_call(self) -> None:
        """End the worker on purpose (harness/gpu_share.py): its next call starts it again, not counted as a crash."""
        self.stop()
        self.resume = True

    def _ensure_running(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self.sock is not None:
            return
        if self.resume:
            self.resume = False
            self.start()
            return
        if self.restarts >= MAX_RESTARTS:
            raise WorkerDied(f"not run: the process running your code crashed {MAX_RESTARTS} times already")
        self.restarts += 1
        self.stop()
        self.start()

    def ready(self) -> None:
        """Start the worker now if it was stopped on purpose (before a timed part, so its start is not in it). A
        start that fails is undone: the next call starts it again and meets the failure inside its case."""
        if not self.resume or (self.proc is not None and self.proc.poll() is None):
            return
        try:
            self._ensure_running()
        except Exception:  # noqa: BLE001  the next call starts it again and reports it inside its case
            self.stop_until_next_call()

    def call(self, name: str, *args, timeout: float = CALL_TIMEOUT_S, **kwargs):
        """Run entry point `name` in the worker; returns its validated result (CPU tensors, plain values)."""
        self._ensure_running()
        return self._request({"op": "call", "name": name, "args": args, "kwargs": kwargs}, timeout)

    def call_measuring_memory(self, name: str, *args, timeout: float = CALL_TIMEOUT_S):
        """`call` on the GPU, and the most GPU memory the call allocated beyond what the worker held before it
        (bytes, as the worker's PyTorch counts it; None if the reply lacks it): (result, peak)."""
        self._ensure_running()
        self.last_peak_bytes = None
        result = self._request({"op": "call", "name": name, "args": args, "kwargs": {}, "measure_memory": True},
                               timeout)
        return result, self.last_peak_bytes

    def call_on_gpu(self, name: str, *args, timeout: float = CALL_TIMEOUT_S):
        """Run entry point `name` on copies of `args` the worker allocates itself (no shared memory).

        For the sanitizer pass: every tensor is its own allocation, so an access outside it is
        seen. Afterwards `last_ranges` holds (address, bytes) of each tensor argument, in order.
        """
        self._ensure_running()
        self.last_ranges = []
        return self._request({"op": "call_on_gpu", "name": name, "args": args, "kwargs": {}}, timeout)

    def keep(self, name: str, value) -> wire.Kept:
        """Hand `value` over once (CUDA tensors are mapped then); pass the returned Kept to later calls."""
        self._ensure_running()
        self._request({"op": "keep", "name": name, "value": value}, CALL_TIMEOUT_S)
        return wire.Kept(name)

    def drop(self, name: str) -> None:
        if self.sock is not None:
            self._request({"op": "drop", "name": name}, CALL_TIMEOUT_S)

    def cpu_seconds(self) -> float:
        """CPU time used so far by the worker's processes, read by the checks from /proc: each one's own (utime,
        stime) and that of the children it has waited for (cutime, cstime: work done in a process that has ended,
        a fork's, is counted too)."""
        if self.proc is None:
            return 0.0
        tick = os.sysconf("SC_CLK_TCK")
        stats = processes.descendants(self.proc.pid, include_root=True)
        return sum(sum(int(f) for f in fields[11:15]) for fields in stats.values()) / tick
