"""The sanitizer pass (trusted side): the small cases again, in a worker run under compute-sanitizer.

A kernel whose output matches can still read past an array (it got lucky with what lay
there) or race on shared memory (it got lucky with the timing): on another GPU, size or
compiler it gives wrong answers. compute-sanitizer sees both. For each tool (memcheck:
out-of-bounds and misaligned accesses; racecheck: shared-memory races) a fresh worker
runs under it, inside the sandbox, with PyTorch's caching allocator off and every tensor
allocated by the worker itself, so each tensor is its own allocation and an access one
byte past it is seen.

The report goes to a pipe that only this process reads. The pass is clean only when the
report holds no finding, ends with exactly one summary of 0 errors, and the sanitizer
exited normally: a report that was cut short (the process was killed, or never started)
is not clean. Each finding is told once, with its kind, kernel, `file:line` and the line
itself, the tensor its address belongs to (from the addresses the worker reports) and
the README step.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path

import torch

TOOLS = ("memcheck", "racecheck")
MISSING = ("compute-sanitizer was not found: it comes with the CUDA toolkit, next to nvcc (CUDA_HOME/bin); "
           "put that folder on PATH")
BLIND_SPOTS = ("memcheck sees only accesses outside every allocation and racecheck only shared memory between "
               "warps: a clean pass is not a proof (README, Grading)")


def find_sanitizer() -> str | None:
    from common.nvcc import find_cuda_tool

    return find_cuda_tool("compute-sanitizer")


def command(sanitizer: str, tool: str) -> list[str]:
    # the device's frames: where a helper of the device library (common/csrc/device) was called from
    return [sanitizer, "--tool", tool, "--show-backtrace", "device", "--print-limit", "200"]


@dataclass
class Finding:
    kind: str  # e.g. "out-of-bounds read of global memory", "shared-memory race"
    kernel: str
    where: list[str]  # file:line, the first the access, for a race the second the other side
    address: int | None = None
    size: int | None = None
    allocation: tuple[int, int] | None = None  # (start, bytes) of the nearest allocation, as memcheck says
    hazards: int = 0
    called_from: str = ""  # where the access is in a device library header: "kernel at file:line" of its caller

    def key(self) -> tuple:
        return self.kind, self.kernel, tuple(self.where)

    def beyond(self) -> float:
        """How many bytes outside its nearest allocation the access went (infinitely many where unknown:
        an access whose place is known tells the student more)."""
        if self.address is None or self.allocation is None:
            return math.inf
        start, nbytes = self.allocation
        return max(self.address - (start + nbytes), start - self.address, 0)


def closest_to_the_edge(findings: list[Finding]) -> list[Finding]:
    """One finding per place in the code: of the accesses one line made, the one nearest its array's edge.

    Which thread the sanitizer reports first depends on scheduling, so the first report is not the
    one to tell: the access nearest the edge ("right after the end of `c`") is stable from run to run
    and points at the guard that is off by one.
    """
    chosen: dict[tuple, Finding] = {}
    for finding in findings:
        kept = chosen.get(finding.key())
        if kept is None or finding.beyond() < kept.beyond():
            chosen[finding.key()] = finding
    return list(chosen.values())


@dataclass
class SanitizerReport:
    findings: list[Finding]
    summaries: list[str]  # the sanitizer's closing lines ("ERROR SUMMARY: 0 errors")
    errors: int  # what the summaries say, summed

    @property
    def complete(self) -> bool:
        return len(self.summaries) == 1


HEADLINE = re.compile(r"^(Invalid (__\w+__) (read|write) of size (\d+) bytes|Misaligned|Error: Race reported|"
                      r"Warning: Race reported|Barrier error|Uninitialized|Program hit|Out-of-range)")
AT = re.compile(r"(?:at|Access at) (.+?)\+0x[0-9a-f]+ in (\S+?):(\d+)")
FRAME = re.compile(r"Device Frame: ?(.+?)\+0x[0-9a-f]+ in (\S+?):(\d+)")  # a caller of the function above
ADDRESS = re.compile(r"Access to (0x[0-9a-f]+)")
NEAREST = re.compile(r"nearest allocation at (0x[0-9a-f]+) of size ([\d,]+) bytes")
HAZARDS = re.compile(r"\[(\d+) hazards?\]")
SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?$|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?")
SPACES = {"__global__": "global memory", "__shared__": "shared memory", "__local__": "local memory"}


def parse(text: str) -> SanitizerReport:
    """compute-sanitizer's log (every line starts with '========= ') as findings and summaries."""
    blocks: list[list[str]] = []
    summaries, errors = [], 0
    for raw in text.splitlines():
        if not raw.startswith("========="):
            continue
        line = raw[len("========="):]
        body = line.strip()
        match = SUMMARY.search(body)
        if match:
            summaries.append(body)
            errors += int(match.group(1) or match.group(2))
        elif line.startswith(" ") and not line.startswith("     ") and HEADLINE.match(body):
            blocks.append([body])
        elif blocks and body:
            blocks[-1].append(body)
    findings = [f for f in map(_finding, blocks) if f is not None]
    return SanitizerReport(findings, summaries, errors)


def _finding(block: list[str]) -> Finding | None:
    head = block[0]
    places = [m for line in block if "Device Frame" not in line for m in [AT.search(line)] if m]
    frames = [m for line in block for m in [FRAME.search(line)] if m]
    functions = [_function(m.group(1)) for m in places]
    in_kernel_file = [f for f, m in zip(functions, places) if m.group(2).endswith(".cu")]
    kernel = (in_kernel_file or functions or ["?"])[0]
    where = [f"{m.group(2)}:{m.group(3)}" for m in places]
    if functions and functions[0] == "cp_async":
        where[0] = "cp_async"  # the write is an asynchronous copy (inlined from the toolkit's pipeline header)
    access = re.match(r"Invalid (__\w+__) (read|write) of size (\d+) bytes", head)
    if access:
        address = next((int(m.group(1), 16) for line in block for m in [ADDRESS.search(line)] if m), None)
        nearest = next((m for line in block for m in [NEAREST.search(line)] if m), None)
        allocation = (int(nearest.group(1), 16), int(nearest.group(2).replace(",", ""))) if nearest else None
        kind = f"out-of-bounds {access.group(2)} of {SPACES.get(access.group(1), access.group(1))}"
        return Finding(kind, kernel, where[:1], address, int(access.group(3)), allocation,
                       called_from=_caller(places[:1], frames))
    if "Race reported" in head:
        if head.startswith("Warning"):
            return None  # racecheck's warnings are hazards it judges harmless; the errors are the races
        hazards = sum(int(m.group(1)) for line in block for m in [HAZARDS.search(line)] if m)
        others = sorted(set(where[1:]), key=where.index)
        return Finding("shared-memory race", kernel, where[:1] + others, hazards=hazards)
    if head.startswith("Program hit"):
        return None  # a CUDA call failing after a bad access: the access itself is the finding
    return Finding(head.split(" at ")[0].lower(), kernel, where[:1])


def _caller(places: list, frames: list) -> str:
    """For an access inside a device library header (a .cuh), the nearest frame in a kernel file: the call
    the student wrote. Empty where the access is in a kernel file itself."""
    if not places or not places[0].group(2).endswith(".cuh"):
        return ""
    caller = next((m for m in frames if m.group(2).endswith(".cu")), None)
    return f"{_function(caller.group(1))} at {caller.group(2)}:{caller.group(3)}" if caller else ""


def _function(signature: str) -> str:
    """`void flash_attention_kernel<(int)64>(const float *, ...)` -> flash_attention_kernel; a kernel in an
    anonymous namespace (`void (anonymous namespace)::decode_kernel<...>(...)`) by its own name too."""
    signature = signature.replace("(anonymous namespace)::", "")
    while True:
        shorter = re.sub(r"<[^<>]*>", "", signature)
        if shorter == signature:
            break
        signature = shorter
    head = signature.split("(")[0].split()
    return head[-1].split("::")[-1] if head else "?"


def name_address(finding: Finding, tensors: list[tuple[str, tuple, int, int]]) -> str:
    """Where a bad access went, by tensor: tensors are (name, shape, start address, bytes)."""
    if finding.address is None:
        return ""
    start, nbytes = finding.allocation or (None, None)
    match = [t for t in tensors if t[2] == start] or [t for t in tensors if t[2] <= finding.address < t[2] + t[3]]
    size = f"{finding.size} bytes" if finding.size else "an access"
    if not match:
        if nbytes is None:
            return ""
        return f"{size} {_offset(finding.address, start, nbytes)} an allocation of {nbytes} bytes the binding made"
    name, shape, start, nbytes = match[0]
    what = f"`{name}` ({' x '.join(map(str, shape))})"
    if start <= finding.address < start + nbytes:
        return f"{size} inside {what} (misaligned?)"
    return f"{size} {_offset(finding.address, start, nbytes)} {what}"


def _offset(address: int, start: int, nbytes: int) -> str:
    if address >= start + nbytes:
        past = address - (start + nbytes)
        return "right after the end of" if past == 0 else f"{past} byte{'s' if past != 1 else ''} after the end of"
    return f"{start - address} byte{'s' if start - address != 1 else ''} before the start of"


def finding_message(finding: Finding, source_lines: dict[str, list[str]], tensors, step_of) -> str:
    """One line a student can act on: what, where (file:line and the line), which tensor, which README step."""
    def quoted(place):
        file, _, number = place.rpartition(":")
        lines = source_lines.get(file, [])
        n = int(number)
        text = lines[n - 1].strip() if 0 < n <= len(lines) else ""
        return f"{place}" + (f" `{text[:100]}`" if text else "")

    kernel = finding.kernel
    step = step_of(kernel) or (step_of(finding.called_from.split(" at ")[0]) if finding.called_from else None)
    if finding.kind == "shared-memory race":
        first, *others = finding.where or ["?"]
        against = "; ".join(quoted(p) for p in others[:2]) or "?"
        if first == "cp_async":
            message = (f"shared-memory race in {kernel}: an asynchronous copy (cp.async) is still writing what "
                       f"{against} reads ({finding.hazards} hazards; wait for the copy with __pipeline_wait_prior, "
                       "then __syncthreads(), before reading)")
        else:
            message = (f"shared-memory race in {kernel}: {quoted(first)} against {against} "
                       f"({finding.hazards} hazards; a __syncthreads() missing between them?)")
    else:
        message = f"{finding.kind} in {kernel} at {quoted(finding.where[0]) if finding.where else '?'}"
        if finding.called_from:
            caller, _, place = finding.called_from.partition(" at ")
            message += f" (the device library's, given), called from {caller} at {quoted(place)}"
        named = name_address(finding, tensors)
        if named:
            message += f": {named}"
    return message + (f" (README, {step})" if step else "")


@dataclass
class Call:
    """One small case for the pass: an entry point and its arguments, the tensors named in order."""
    label: str
    entry: str
    args: tuple
    names: tuple[str, ...]  # one per tensor argument, as the messages call them


def run_pass(start_worker, calls: list[Call], sources: dict[str, list[str]], step_of) -> tuple:
    """Every call under each tool; (clean, message, metrics) for the report, and the Cause of a failed call
    where it hung or answered malformed (harness/outcome.py).

    start_worker(cmd) returns a started Worker (a context manager) running under `cmd`.
    sources: the lines of each kernel file by name (attention.cu), to quote from.
    step_of(kernel name): the README step that kernel belongs to, or None.
    """
    from harness.sandbox import WorkerDied, WorkerError

    sanitizer = find_sanitizer()
    if sanitizer is None:
        return False, MISSING, {}

    def under(tool: str):
        """Every call in one worker under `tool`: (its report, the worker's exit code, the tensors of each call,
        the calls that failed, what a hang or a crash was, seconds)."""
        started = time.perf_counter()
        tensors_by_call, failed_calls, died = [], [], None
        with start_worker(command(sanitizer, tool)) as worker:
            for call in calls:
                try:
                    worker.call_on_gpu(call.entry, *call.args)
                except WorkerError as err:
                    if err.kind == "NotImplementedError" or "not implemented" in err.message:
                        continue
                    failed_calls.append(f"{call.label}: {err.kind}: {err.message.splitlines()[0][:200]}")
                except WorkerDied as err:
                    failed_calls.append(f"{call.label}: {err}")
                    died = err.cause  # a hang under the sanitizer is flagged as one
                    break
                finally:
                    shapes = [tuple(a.shape) for a in call.args if isinstance(a, torch.Tensor)]
                    names = list(call.names) + [f"tensor {j + 1}" for j in range(len(call.names), len(shapes))]
                    tensors_by_call += [(names[j], shapes[j], start, nbytes)
                                        for j, (start, nbytes) in enumerate(worker.last_ranges[:len(shapes)])]
            worker.stop()
            text = worker.sanitizer_log.decode("utf-8", errors="replace")
            keep = os.environ.get("KIT_KEEP_SANITIZER_LOGS")  # a folder: the raw reports, for whoever debugs this
            if keep:
                Path(keep, f"{tool}.log").write_text(text)
            return parse(text), worker.exit_code, tensors_by_call, failed_calls, died, time.perf_counter() - started

    # The tools run at once, each in its own worker: a pass takes the time of its slowest tool, not their sum. Both
    # end before the pass does, also when one fails: no worker of the pass outlives it (a timed part may follow).
    running = [in_daemon(under, tool) for tool in TOOLS]
    wait(running)
    runs = [run.result() for run in running]
    problems, metrics, seen, died_of = [], {}, set(), None
    for tool, (report, exit_code, tensors_by_call, failed_calls, died, seconds) in zip(TOOLS, runs):
        died_of = died_of or died
        metrics[f"{tool}_s"] = round(seconds, 1)
        for finding in closest_to_the_edge(report.findings):
            if finding.key() in seen:
                continue
            seen.add(finding.key())
            problems.append(f"{tool}: " + finding_message(finding, sources, tensors_by_call, step_of))
        if not report.findings:
            if report.errors and not failed_calls:  # a failed call's own API errors are said below, once
                problems.append(f"{tool}: the report counts {report.errors} errors")
            if not report.complete:
                why = "no summary" if not report.summaries else f"{len(report.summaries)} summaries"
                problems.append(f"{tool}: the sanitizer's report is incomplete ({why}; the process ended with "
                                f"code {exit_code}): nothing can be certified")
            elif exit_code not in (0, None):
                problems.append(f"{tool}: the process running your code ended with code {exit_code}")
        if failed_calls and not report.findings:
            problems.append(f"{tool}: a call failed under the sanitizer, so nothing can be certified (fix the "
                            f"failing checks above first): {failed_calls[0]}")
    metrics["findings"] = len(seen)
    if problems:
        shown = problems[:6] + ([f"... and {len(problems) - 6} more"] if len(problems) > 6 else [])
        return False, "\n".join(shown), metrics, died_of
    return True, (f"memcheck and racecheck clean on {len(calls)} small cases ({metrics['memcheck_s']:.0f} s and "
                  f"{metrics['racecheck_s']:.0f} s, side by side; {BLIND_SPOTS})"), metrics


PASS_NAME = "memory-safe and race-free (compute-sanitizer)"


def add_to_report(report, task: int, args, calls: list[Call], step_of, name: str = PASS_NAME,
                  kind: str = "rule", part: str = "") -> None:
    """Run the pass as a rule of the task: a finding costs the task's points (kind="optional": the pass of an
    optional part, reported under `name`, costing nothing; `part` names it, so its workers have views of their own).

    Without compute-sanitizer a student's own run says so and goes on; the grader (which
    passes --hidden) cannot certify the task and scores it 0.
    """
    finish(report, start(report, task, args, calls, step_of, name, kind, part))


DAEMON_NAME = "sanitizer pass"


def in_daemon(fn, *args) -> Future:
    """fn(*args) in a daemon thread; its result, or the exception it raised, in the Future. A daemon: a test stopped
    meanwhile (Ctrl-C, the grader's time limit) does not wait for it, and the workers it started end with it (they
    die with the thread that started them, harness/sandbox.py's Worker.spawn)."""
    result = Future()

    def run():
        try:
            result.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001  raised again where the result is read
            result.set_exception(err)

    threading.Thread(target=run, name=DAEMON_NAME, daemon=True).start()
    return result


@dataclass
class Pending:
    """A pass running beside the checks that follow it (`start`); `finish` waits for it and reports it."""

    name: str
    kind: str
    result: Future


def start(report, task: int, args, calls: list[Call], step_of, name: str = PASS_NAME, kind: str = "rule",
          part: str = "") -> Pending | None:
    """add_to_report's pass, started in a thread of its own: the test goes on with its next checks meanwhile (the
    pass's workers are processes of their own). None when there is no pass to run (then a note says why)."""
    from common.impl import source_of
    from common.nvcc import device_library_files
    from harness.sandbox import Worker
    from common.tasks import TASKS

    if find_sanitizer() is None and not args.hidden:
        report.note(f"sanitizer pass skipped: {MISSING}. The grader runs it, and a finding there costs the task")
        return None
    spec = TASKS[task]
    files = {}
    for rel in spec.student_files:
        path = source_of(rel, args.student_dir, args.solution)
        files[Path(rel).name] = _read_lines(path)
    for path in device_library_files():  # the given helpers a finding may lie in (quoted as the student's lines are)
        files[path.name] = _read_lines(path)

    def start_worker(cmd):
        tool = cmd[cmd.index("--tool") + 1]  # each pass's and each tool's workers have their own view: they run at once
        worker = Worker(task, args.student_dir, solution=args.solution, scratch=args.scratch, sanitize=cmd,
                        purpose=f"sanitizer{f'-{part}' if part else ''}-{tool}")
        worker.start()
        return worker

    return Pending(name, kind, in_daemon(run_pass, start_worker, calls, files, step_of))


def finish(report, pending: Pending | None) -> None:
    """Wait for a pass `start` began and add its case (its errors are the case's, as if run in place)."""
    if pending is not None:
        wait([pending.result])  # also when the report takes no more cases: no worker of the pass outlives the test
        report.run(pending.name, pending.result.result, kind=pending.kind)


def _read_lines(path: Path) -> list[str]:
    """A student's file, not following links (it is quoted in the results)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        return f.read(2_000_000).decode("utf-8", errors="replace").splitlines()
