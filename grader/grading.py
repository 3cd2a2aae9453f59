"""Grading one submission of a class, in its own process, and committing the grade (DIR/students/<id>);
the local loop over a class, a Slurm array element, and the prebuild of the reference kernels."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common.impl import REPO
from harness.outcome import Cause, Status
from harness.processes import with_parent
from harness.view import remove_tree
from common.tasks import TASKS
from grader.class_state import (TRIES, close_open_attempts, current_job, json_or_none, load_class,
                                save_attempts, timestamp, tries_left, write_json)
from grader import gradebook
from grader.fingerprints import hidden_fingerprint, kit_fingerprint
from grader.rubric import parse_tasks
from grader.submissions import NotGradable, linked_files, locate, source_fingerprint

PREBUILD_TIMEOUT_S = 900  # one reference extension: nvcc and the binding against PyTorch's headers
# a grading's output kept in grade.log: its first and last halves, the cut said between them (a submission that
# prints 50 MB left a 105 MB log; what matters is the start, each task's summary and the end)
MAX_LOG_BYTES = 4 << 20


def grade_one(out: Path, klass: dict, sid: str, source: Path) -> dict:
    """Grade one student in DIR/work/<id>, then commit it to DIR/students/<id>; returns what it recorded."""
    tried = close_open_attempts(out, sid)
    for earlier in tried:  # a scratch copy a grading killed with grader.batch (SIGKILL) left behind, on this host
        left = Path(earlier.get("scratch") or "/nonexistent")
        if earlier.get("host") == socket.gethostname() and left.name.startswith("grading-") and left.is_dir():
            remove_tree(left)
    # the grader's scratch copy of the student's files: removed once the grader is dead, even a grader killed
    # before its own cleanup (grader.batch's timeout); named in the attempt, so one left by a SIGKILL goes later
    temp = Path(tempfile.mkdtemp(prefix="grading-"))
    attempt = {"round": klass["round"], "job": current_job(), "host": socket.gethostname(), "started": timestamp(),
               "scratch": str(temp)}
    save_attempts(out, sid, tried + [attempt])

    def stopped(signum, _frame):  # Slurm's time limit, scancel or preemption, or a kill here: say so, then go
        why = "Slurm's time limit, a cancel or a preemption" if current_job() != "local" else "the grading was stopped"
        attempt.update(ended=timestamp(), outcome=f"stopped by {signal.Signals(signum).name} ({why})")
        save_attempts(out, sid, tried + [attempt])
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        record = _grade(out / "work" / sid, klass, sid, source, out, temp)
    except KeyboardInterrupt:  # the instructor's Ctrl-C: this student is not graded, and the next run grades them
        attempt.update(ended=timestamp(), outcome="stopped by Ctrl-C (the grading was stopped)")
        save_attempts(out, sid, tried + [attempt])
        raise
    except Exception as err:  # noqa: BLE001  a fault of this kit: that student's error, not the class's end
        record = _failed(out / "work" / sid, f"internal error of the grading: {type(err).__name__}: {err}")
    finally:
        signal.signal(signal.SIGTERM, previous)
        remove_tree(temp)
    kept = commit(out, sid, out / "work" / sid)
    attempt |= {"ended": timestamp(), "outcome": "graded" if "error" not in record else f"failed: {record['error']}",
                "seconds": record.get("seconds")}
    if kept:
        attempt["outcome"] += "; the earlier grade was kept"
    save_attempts(out, sid, tried + [attempt])
    return record


def _grade(folder: Path, klass: dict, sid: str, source: Path, out: Path, temp: Path) -> dict:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    about = {"student": sid, "source": str(source), "job": current_job(), "host": socket.gethostname(),
             "started": timestamp(), "tasks": klass["tasks"], "kit": kit_fingerprint()[:16],
             "hidden": hidden_fingerprint(), "tampering": [], "source_sha256": source_fingerprint(source),
             "regrade": klass.get("regrade"), "no_sandbox": klass["no_sandbox"]}
    unpacked = out / "unpacked" / sid
    shutil.rmtree(unpacked, ignore_errors=True)
    try:
        root = locate(source, unpacked)
    except NotGradable as err:
        about["tampering"] = [str(err)] if err.tampering else []
        write_json(folder / "grading.json", about)
        return _failed(folder, f"{err.kind}: {err}")
    about["root"] = str(root)
    about["tampering"] = [f"{rel} is a link or not a regular file" for rel in linked_files(root)]
    # the graded tasks' files (and those of the tasks they run) the submission does not hold: graded all the same
    # (the grade says "missing"), and the gradebook states it
    wanted = sorted({rel for t in parse_tasks(klass["tasks"]) for u in (t, *TASKS[t].uses)
                     for rel in TASKS[u].student_files if rel not in TASKS[u].optional_files})
    about["missing"] = [rel for rel in wanted if not (root / rel).is_file()]
    cmd = [sys.executable, "-m", "grader", "--submission", str(root), "--name", sid, "--out", str(folder),
           "--tasks", klass["tasks"]]
    cmd += ["--no-sandbox"] if klass["no_sandbox"] else []
    (folder / "command.txt").write_text(" ".join(cmd) + "\n")
    timeout_s = klass["timeout_s"]
    started = time.perf_counter()
    try:
        proc = subprocess.Popen(with_parent(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True, env=dict(os.environ, TMPDIR=str(temp)))
        logger = threading.Thread(target=keep_capped, args=(proc.stdout, folder / "grade.log"), daemon=True)
        logger.start()
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _stop(proc)
            logger.join(timeout=60)  # its pipe ends with the grader's process group
            proc.stdout.close()
    finally:
        remove_tree(temp)
    about |= {"ended": timestamp(), "seconds": round(time.perf_counter() - started, 1)}
    write_json(folder / "grading.json", about)
    results = folder / "results.json"
    if code is None:
        return _failed(folder, f"timed out: the grading took longer than {timeout_s} s", Cause.TIMED_OUT)
    if code != 0 or not results.exists():
        return _failed(folder, f"the grader exited with code {code} (see grade.log)")
    record = json.loads(results.read_text())
    record["seconds"] = about["seconds"]
    about["machine"] = tasks_the_machine_took(folder)  # graded again by the next run (class_state.grade_state)
    if about["machine"]:  # how many gradings in a row the machine took: a cap on grading it again
        before = json_or_none(out / "students" / sid / "grading.json")
        about["machine_tries"] = 1 + (before.get("machine_tries", 1) if isinstance(before, dict)
                                      and before.get("machine") else 0)
    write_json(folder / "grading.json", about)
    return record


def tasks_the_machine_took(folder: Path) -> list[int]:
    """The tasks of a grading in `folder` that the machine could not grade (grader/machine.py)."""
    return [task for task, entry in gradebook.task_entries(folder).items() if entry.get("status") == Status.NOT_GRADED]


def keep_capped(stream, path: Path, limit: int = MAX_LOG_BYTES) -> None:
    """Copy a child's output from `stream` into `path`, keeping at most `limit` bytes: the first half as it comes,
    and the last half, with the number of bytes cut between them said. The pipe is read to its end whatever
    happens to the log (a full disk): a grader whose output nobody reads would block, and time out."""
    try:
        _copy_capped(stream, path, limit)
    except OSError:
        with contextlib.suppress(OSError, ValueError):
            for _ in iter(lambda: stream.read1(1 << 16), b""):
                pass


def _copy_capped(stream, path: Path, limit: int) -> None:
    head_room, tail, tail_bytes, cut = limit // 2, collections.deque(), 0, 0
    with open(path, "wb", buffering=0) as log:  # written as it comes: an instructor may watch a grading's log
        for chunk in iter(lambda: stream.read1(1 << 16), b""):
            if head_room:
                log.write(chunk[:head_room])
                chunk, head_room = chunk[head_room:], max(0, head_room - len(chunk))
            if chunk:
                tail.append(chunk)
                tail_bytes += len(chunk)
                while tail_bytes - len(tail[0]) >= limit - limit // 2:
                    cut, tail_bytes = cut + len(tail[0]), tail_bytes - len(tail[0])
                    tail.popleft()
        if cut:
            log.write(f"\n[... {cut} bytes of output cut here: grade.log keeps the first and the last "
                      f"{limit // 2 >> 20} MiB ...]\n".encode())
        for chunk in tail:
            log.write(chunk)


def _stop(proc: subprocess.Popen) -> None:
    """End a child (the grader, a prebuild): SIGTERM first (the grader removes its scratch copy), then SIGKILL
    to its whole process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:  # whatever it left behind (its tests end with it: harness/processes.py's with_parent)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _failed(folder: Path, reason: str, cause: str | None = None) -> dict:
    """The grading's error.json; a results.json the grader wrote as it failed is kept, renamed, for its traceback."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "results.json").exists():
        os.replace(folder / "results.json", folder / "grader-failure.json")
    record = {"score": 0, "error": reason, "cause": cause, "tests": []}
    write_json(folder / "error.json", record)
    return record


def commit(out: Path, sid: str, new: Path) -> bool:
    """Make `new` the student's record, unless it failed and an earlier grade exists; True if that was kept."""
    final = out / "students" / sid
    old = new.with_name(f".{new.name}.old")  # a dot name: never a student's id (discover skips them)
    if old.exists() and not final.exists():
        old.rename(final)  # an earlier commit was killed between its two renames
    if (final / "results.json").exists() and not (new / "results.json").exists():
        failure = json.loads((new / "error.json").read_text())
        about = json_or_none(new / "grading.json") or {}  # what was tried: a rerun does not try it again
        tried = {k: about.get(k) for k in ("tasks", "source_sha256", "regrade", "no_sandbox")}
        write_json(final / "regrade-failed.json", failure | tried | {"when": timestamp()})
        shutil.rmtree(new)
        return True
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return False


def grade_locally(out: Path, klass: dict, todo: list[int]) -> None:
    started, failures = time.perf_counter(), 0
    for n, index in enumerate(todo, 1):
        student = klass["students"][index]
        record = grade_one(out, klass, student["id"], Path(student["source"]))
        failures += "error" in record
        left = (time.perf_counter() - started) / n * (len(todo) - n)
        said = record.get("error") or f"{record['score']:g} of {sum(t['max_score'] for t in record['tests']):g} points"
        print(f"[{n}/{len(todo)}] {student['id']}: {said}; {failures} failed; about {left / 60:.0f} min left",
              flush=True)


def element(out: Path, index: int | None) -> int:
    """One Slurm array element: the class's index-th student (SLURM_ARRAY_TASK_ID by default)."""
    klass = load_class(out)
    if index is None:
        index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    student = klass["students"][index]
    close_open_attempts(out, student["id"])
    if tries_left(out, student["id"], klass) <= 0:  # Slurm requeued it more often than we try
        print(f"{student['id']}: tried {TRIES} times already in this round; not graded again")
        return 0
    record = grade_one(out, klass, student["id"], Path(student["source"]))
    print(f"{student['id']}: {record.get('error') or record['score']}")
    return 0


def reference_builds(tasks: str) -> list[int]:
    """The tasks whose reference extension the gradings of `tasks` load (tasks 6 and 7 run tasks 4's and 5's)."""
    from grader.runner import reference_extensions

    return [task for task, _ in reference_extensions(parse_tasks(tasks))]


def prebuild(out: Path) -> int:
    """Build the reference extensions the class needs, once: every grading then imports them, read-only.

    common/build.py publishes each build under a name that hashes all its inputs (build/reference/).
    Where this fails (no GPU here, a node of another GPU kind), each grading builds for itself as before.
    """
    for task in reference_builds(load_class(out)["tasks"]):
        started = time.perf_counter()
        proc = subprocess.Popen(with_parent([sys.executable, "-m", f"task{task}.compile", "--solution", "--extension"]), cwd=REPO,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            said = proc.communicate(timeout=PREBUILD_TIMEOUT_S)[0].strip().splitlines()
            said, ok = said or [f"exit code {proc.returncode}"], proc.returncode == 0
        except subprocess.TimeoutExpired:
            said, ok = [f"still building after {PREBUILD_TIMEOUT_S} s"], False
        finally:
            _stop(proc)  # and its nvcc and ninja, which would go on writing in the build folder
        if ok:
            print(f"task {task}'s reference: {said[-1]} ({time.perf_counter() - started:.0f} s)", flush=True)
        else:
            print(f"task {task}'s reference was not prebuilt, so each grading builds it: {said[-1]}", flush=True)
    return 0
