"""Grading a whole class (instructors).

    python -m grader.batch SUBMISSIONS --out DIR [--tasks 1,3] [--regrade | --only ID,ID] [--timeout S]
        grades the class on this machine, one submission after another, then writes the gradebook;
    python -m grader.batch SUBMISSIONS --out DIR --slurm [--partition P] [--account A] [--time MIN]
            [--gres gpu:1] [--cpus N] [--max-running K] [--sbatch=--LINE] [--template FILE]
        submits one Slurm array job (an element per submission, grader/slurm_job.sh) and a gather
        job that runs when they have all ended (grader/slurm.py);
    python -m grader.batch gather DIR
        writes DIR/gradebook.csv and DIR/report.md again from what is on disk (at any time).

The reference kernels a CUDA task is timed against are built once, before the gradings (`prebuild`:
`python -m taskN.compile --solution`, a job of its own on Slurm), and every grading imports that
build read-only (common/build.py); only the student's own code is built per submission.

SUBMISSIONS is a folder as a learning-management system exports it: one folder or archive (`.zip`,
`.tar`, `.tar.gz`, `.tgz`, `.tar.bz2`, `.tar.xz`) per student, whose name (without the extension) is
the student's id. Every entry is a student: one the kit cannot read (a `.rar`, a lone file, a link)
is graded 0 with the reason in the gradebook, never left out. Each submission is graded exactly as
`python -m grader --submission` grades it (its own process, the trusted harness, the hidden cases).

Nothing is lost or mixed up:
- the student's checkout is found where students put it: the folder holding the files students
  write at their places (task1/attention.py, ...), at any depth, in the submission or in the one
  archive it holds (an LMS keeps the uploaded zip in the student's folder); two such folders, or
  none, is a problem the gradebook states;
- archives are unpacked safely into DIR/unpacked/<id>, and only what can be graded is taken out: the
  files students write and archives that may hold them, never what lies in SKIPPED folders (`.venv`,
  `.git`, ...); no path out of that folder, no link or device where a graded file goes, at most
  MAX_ENTRIES entries listed, MAX_FILES files and MAX_BYTES bytes taken out; a broken one is that
  student's error;
- a grading runs in DIR/work/<id> and only then replaces DIR/students/<id>: a grading that
  fails, times out or is stopped never replaces an earlier grade (it is noted beside it);
- every attempt is logged in DIR/attempts/<id>.json (where, when, how it ended), so a grading that
  Slurm stopped (time limit, node failure, preemption, scancel) is tried once more and then
  recorded with the reason;
- a grade remembers what it graded (the tasks, a fingerprint of the submission's gradable files,
  the --regrade it belongs to): a rerun grades the students without a grade for the class's tasks,
  those whose files changed since (it says who), and, after an interrupted --regrade, those that
  regrade had not reached yet; a rerun with other --tasks than the class's is refused without
  --regrade, so a forgotten --tasks never starts the whole class again;
- the gradebook and report are rebuilt from the students' folders each time (grader/gradebook.py).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import zipfile
from pathlib import Path, PurePosixPath

from common.impl import REPO
from common.sandbox import die_with_parent, remove_tree
from common.tasks import TASKS
from grader import gradebook
from grader.rubric import RUBRIC, parse_tasks

MAX_ENTRIES = 200_000  # entries an archive may list: a repository with its .venv has thousands; more is a bomb
MAX_FILES = 2000  # files taken out of one archive
MAX_BYTES = 200 * 1024 * 1024  # bytes taken out of one archive
# what an archive may hold in all, skipped content included: a tar is read through to skip it (a .venv with
# PyTorch's CUDA wheels is about 6 GiB; decompressing 16 GiB takes about a minute)
MAX_LISTED_BYTES = 16 << 30
ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar", ".zip")
# Folders whose contents are never graded: not taken out of archives, not searched for the student's files.
SKIPPED = {".venv", "venv", "env", ".git", "__pycache__", "__MACOSX", "node_modules", "build", "site-packages",
           ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache", ".idea", ".vscode", "grader-work", "graded"}
STUDENT_FILES = sorted({rel for task in TASKS.values() for rel in task.student_files})
MAX_DEPTH = 8  # folders down to the student's checkout inside a submission
TRIES = 2  # a grading stopped from outside (Slurm's time limit, a node failure, scancel) is tried once more
SLACK_S = 600  # a grading's time beyond its tasks' own limits: starting up, building, writing results
PREBUILD_TIMEOUT_S = 900  # one reference extension: nvcc and the binding against PyTorch's headers


class NotGradable(Exception):
    """A submission that cannot be graded; the message is the student's error, as the gradebook states it."""

    kind = "submission"

    def __init__(self, message: str, tampering: bool = False):
        super().__init__(message)
        self.tampering = tampering  # a path out of the folder or a link: not an accident of zipping


class BadArchive(NotGradable):
    """An archive that cannot be unpacked safely."""

    kind = "archive"


def archive_suffix(name: str) -> str | None:
    return next((suffix for suffix in ARCHIVES if name.lower().endswith(suffix)), None)


def student_id(path: Path) -> str:
    """The entry's name without its extension (an archive's, or any other file's last one)."""
    name = path.name
    suffix = archive_suffix(name)
    if suffix:
        return name[: -len(suffix)]
    if not path.is_dir() and not path.is_symlink() and "." in name.strip("."):
        return name.rsplit(".", 1)[0]
    return name


def discover(submissions: Path) -> list[tuple[str, Path]]:
    """(student id, entry) for every entry of the submissions folder but dot files, sorted by id; ids are unique.

    Every entry is a student, also one that is not a folder or archive the kit can read: its grading then
    says why (NotGradable), so nobody disappears from the gradebook.
    """
    found: dict[str, Path] = {}
    for path in sorted(submissions.iterdir()):
        if path.name.startswith("."):
            continue
        sid = student_id(path)
        if sid in found:
            raise SystemExit(f"two submissions for student {sid!r}: {found[sid].name} and {path.name}")
        found[sid] = path
    return sorted(found.items())


def _safe_target(dest: Path, name: str) -> Path:
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
        raise BadArchive(f"the archive holds a path outside its folder: {name!r}", tampering=True)
    return dest.joinpath(*parts)


def _members(archive: Path):
    """(name, "file" | "folder" | "other", bytes, a function that opens its data) for each entry."""
    if archive.name.lower().endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                mode = stat.S_IFMT(info.external_attr >> 16)  # 0 when the archiver did not record it
                kind = ("other" if mode not in (0, stat.S_IFREG, stat.S_IFDIR) else
                        "folder" if info.is_dir() else "file")
                yield info.filename, kind, info.file_size, lambda info=info: zf.open(info)
    else:
        with tarfile.open(archive, "r:*") as tf:  # plain, gzip, bzip2 or xz
            for member in tf:
                kind = "folder" if member.isdir() else "file" if member.isfile() else "other"
                yield member.name, kind, member.size, lambda member=member: tf.extractfile(member)


def graded_file(parts: tuple[str, ...]) -> str | None:
    """The file students write that a path ends with (task1/attention.py), or None."""
    return next((rel for rel in STUDENT_FILES if parts[-len(PurePosixPath(rel).parts):] == PurePosixPath(rel).parts),
                None)


def graded_place(parts: tuple[str, ...]) -> str:
    """"file" where a path ends with a file students write (task1/attention.py), "way" where it ends with a
    folder on the way to one (task1, task2/kernels), else ""."""
    if graded_file(parts):
        return "file"
    for rel in STUDENT_FILES:
        rel_parts = PurePosixPath(rel).parts
        if any(parts[-n:] == rel_parts[:n] for n in range(1, len(rel_parts))):
            return "way"
    return ""


def unpack(archive: Path, dest: Path) -> None:
    """Take out of `archive`, into `dest` (created), what can be graded: the files students write, and archives
    that may hold them, outside SKIPPED folders. The rest is only listed, so a repository zipped with its
    .venv is fine; a link or device where a graded file goes is refused as tampering."""
    dest.mkdir(parents=True)
    entries, files, size, listed = 0, 0, 0, 0
    try:
        for name, kind, nbytes, read in _members(archive):
            entries, listed = entries + 1, listed + max(nbytes, 0)
            if entries > MAX_ENTRIES:
                raise BadArchive(f"more than {MAX_ENTRIES} entries in the archive")
            if listed > MAX_LISTED_BYTES:
                raise BadArchive(f"more than {MAX_LISTED_BYTES >> 30} GiB in the archive, counting what is not graded")
            target = _safe_target(dest, name) if PurePosixPath(name).parts else dest  # "./": `tar -C dir .`
            parts = tuple(p for p in PurePosixPath(name).parts if p != ".")
            if not parts or any(p in SKIPPED or p.startswith("._") for p in parts):
                continue
            place = graded_place(parts)
            if kind == "other":
                if place:
                    raise BadArchive(f"the archive holds a link or device where a graded file goes: {name!r}",
                                     tampering=True)
                continue
            if kind == "folder" or not (place == "file" or archive_suffix(parts[-1])):
                continue
            files += 1
            if files > MAX_FILES:
                raise BadArchive(f"more than {MAX_FILES} files to take out of the archive")
            if size + nbytes > MAX_BYTES:
                raise BadArchive(f"more than {MAX_BYTES // 1024 // 1024} MiB unpacked")
            target.parent.mkdir(parents=True, exist_ok=True)
            with read() as src, open(target, "wb") as out:
                size = _copy_within(src, out, size)
    except NotGradable:
        raise
    except Exception as err:  # noqa: BLE001  bad archives raise many kinds (zlib.error, NotImplementedError, ...)
        raise BadArchive(f"not a readable archive: {type(err).__name__}: {err}") from None


def _copy_within(src, out, size: int) -> int:
    """Copy, counting the bytes an entry really holds (a zip may state fewer), up to MAX_BYTES in all."""
    while chunk := src.read(1 << 20):
        size += len(chunk)
        if size > MAX_BYTES:
            raise BadArchive(f"more than {MAX_BYTES // 1024 // 1024} MiB unpacked")
        out.write(chunk)
    return size


def checkouts(folder: Path) -> tuple[dict[Path, list[str]], list[Path]]:
    """The folders under `folder` that hold files students write at their places, with those files, and the
    archives found on the way. SKIPPED folders are not searched, links not followed."""
    found: dict[Path, list[str]] = {}
    archives = []
    for here, dirs, files in os.walk(folder):
        depth = len(Path(here).relative_to(folder).parts)
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED and depth < MAX_DEPTH)
        for name in sorted(files):
            parts = (Path(here) / name).relative_to(folder).parts
            if archive_suffix(name):
                archives.append(Path(here) / name)
            if rel := graded_file(parts):
                found.setdefault(folder.joinpath(*parts[:-len(PurePosixPath(rel).parts)]), []).append(rel)
    return found, archives


def locate(source: Path, unpacked: Path) -> Path:
    """The student's checkout in the submission `source` (a folder or an archive, unpacked under `unpacked`):
    the one folder that holds files students write at their places, in the submission or in the one archive
    it holds (an LMS keeps the uploaded zip in the student's folder). NotGradable says why there is none."""
    if source.is_symlink():
        raise NotGradable("a link, not a folder or archive of the student's own", tampering=True)
    if source.is_dir():
        folder = source
    elif source.is_file() and archive_suffix(source.name):
        unpack(source, unpacked / "outer")
        folder = unpacked / "outer"
    elif source.is_file():
        raise NotGradable(f"{source.name}: a file the kit cannot read as a submission (a folder or an archive: "
                          f"{', '.join(ARCHIVES)})")
    else:
        raise NotGradable(f"{source.name}: neither a folder nor a file")
    for inner in (False, True):
        found, archives = checkouts(folder)
        if len(found) == 1:
            return next(iter(found))
        if found:
            places = "; ".join(f"{_shown(place, folder)} ({', '.join(files)})" for place, files in found.items())
            raise NotGradable(f"the files students write are in {len(found)} places: {places}; which one counts?")
        if inner or len(archives) != 1:
            break
        unpack(archives[0], unpacked / "inner")  # the upload inside the student's folder or archive
        folder = unpacked / "inner"
    also = f"; it holds {len(archives)} archives ({', '.join(a.name for a in archives[:5])})" if archives else ""
    raise NotGradable(f"none of the files students write ({', '.join(STUDENT_FILES[:3])}, ...) is in it at its "
                      f"place{also}: an empty or unrelated submission")


def _shown(place: Path, folder: Path) -> str:
    rel = place.relative_to(folder)
    return f"{rel}/" if rel.parts else "the top folder"


def linked_files(root: Path) -> list[str]:
    """The files students write that this submission holds through links (the file or a folder on its way)."""
    odd = []
    for rel in sorted({rel for task in TASKS.values() for rel in task.student_files}):
        steps = [root.joinpath(*Path(rel).parts[:n]) for n in range(1, len(Path(rel).parts) + 1)]
        if any(step.is_symlink() for step in steps) or (steps[-1].exists() and not steps[-1].is_file()):
            odd.append(rel)
    return odd


# -- the class (DIR/class.json) ----------------------------------------------------------------

def write_class(out: Path, students: list[tuple[str, Path]], tasks: str, timeout_s: int, no_sandbox: bool,
                regrade: str | None = None) -> dict:
    """What every element and gather reads: the students in array order and how they are graded.

    `round` names this submission of the class: an attempt counts against TRIES only in its own round.
    `regrade` names the last --regrade: a grade from before it is not done until it is graded again.
    """
    klass = {"students": [{"id": sid, "source": str(path.resolve())} for sid, path in students],
             "tasks": tasks, "timeout_s": timeout_s, "no_sandbox": no_sandbox, "round": uuid.uuid4().hex[:12],
             "regrade": regrade}
    _write_json(out / "class.json", klass)
    return klass


def load_class(out: Path) -> dict:
    try:
        return json.loads((out / "class.json").read_text())
    except (OSError, ValueError):
        raise SystemExit(f"{out}: no class.json here (python -m grader.batch SUBMISSIONS --out {out} writes it)")


def _write_json(path: Path, value) -> None:
    """Written whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(value, indent=2))
    os.replace(part, path)


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# -- attempts (DIR/attempts/<id>.json) -----------------------------------------------------------

def attempts(out: Path, sid: str) -> list[dict]:
    try:
        found = json.loads((out / "attempts" / f"{sid}.json").read_text())
        return found if isinstance(found, list) else []
    except (OSError, ValueError):
        return []


def save_attempts(out: Path, sid: str, found: list[dict]) -> None:
    _write_json(out / "attempts" / f"{sid}.json", found)


def this_round(out: Path, sid: str, klass: dict) -> list[dict]:
    return [a for a in attempts(out, sid) if a.get("round") == klass.get("round")]


def tries_left(out: Path, sid: str, klass: dict) -> int:
    return TRIES - len(this_round(out, sid, klass))


def close_open_attempts(out: Path, sid: str) -> list[dict]:
    """An attempt still open when its student is graded again was killed without a word (SIGKILL, a node lost)."""
    tried = attempts(out, sid)
    if any("ended" not in a for a in tried):
        for earlier in tried:
            earlier.setdefault("outcome", "stopped before it finished (killed)")
            earlier.setdefault("ended", _now())
        save_attempts(out, sid, tried)
    return tried


def _job() -> str:
    """This process's Slurm job (array job and element), or "local"."""
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '?')}"
    return os.environ.get("SLURM_JOB_ID", "local")


# -- grading one submission ---------------------------------------------------------------------

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
    attempt = {"round": klass["round"], "job": _job(), "host": socket.gethostname(), "started": _now(),
               "scratch": str(temp)}
    save_attempts(out, sid, tried + [attempt])

    def stopped(signum, _frame):  # Slurm's time limit, scancel or preemption, or a kill here: say so, then go
        why = "Slurm's time limit, a cancel or a preemption" if _job() != "local" else "the grading was stopped"
        attempt.update(ended=_now(), outcome=f"stopped by {signal.Signals(signum).name} ({why})")
        save_attempts(out, sid, tried + [attempt])
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        record = _grade(out / "work" / sid, klass, sid, source, out, temp)
    except Exception as err:  # noqa: BLE001  a fault of this kit: that student's error, not the class's end
        record = _failed(out / "work" / sid, f"internal error of the grading: {type(err).__name__}: {err}")
    finally:
        signal.signal(signal.SIGTERM, previous)
        remove_tree(temp)
    kept = commit(out, sid, out / "work" / sid)
    attempt |= {"ended": _now(), "outcome": "graded" if "error" not in record else f"failed: {record['error']}",
                "seconds": record.get("seconds")}
    if kept:
        attempt["outcome"] += "; the earlier grade was kept"
    save_attempts(out, sid, tried + [attempt])
    return record


def _grade(folder: Path, klass: dict, sid: str, source: Path, out: Path, temp: Path) -> dict:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    from grader.__main__ import hidden_fingerprint, kit_fingerprint

    about = {"student": sid, "source": str(source), "job": _job(), "host": socket.gethostname(), "started": _now(),
             "tasks": klass["tasks"], "kit": kit_fingerprint()[:16], "hidden": hidden_fingerprint(), "tampering": [],
             "source_sha256": source_fingerprint(source), "regrade": klass.get("regrade")}
    unpacked = out / "unpacked" / sid
    shutil.rmtree(unpacked, ignore_errors=True)
    try:
        root = locate(source, unpacked)
    except NotGradable as err:
        about["tampering"] = [str(err)] if err.tampering else []
        _write_json(folder / "grading.json", about)
        return _failed(folder, f"{err.kind}: {err}")
    about["root"] = str(root)
    about["tampering"] = [f"{rel} is a link or not a regular file" for rel in linked_files(root)]
    # the graded tasks' files (and those of the tasks they run) the submission does not hold: graded all the same
    # (the grade says "missing"), and the gradebook states it
    wanted = sorted({rel for t in parse_tasks(klass["tasks"]) for u in (t, *TASKS[t].uses)
                     for rel in TASKS[u].student_files})
    about["missing"] = [rel for rel in wanted if not (root / rel).is_file()]
    cmd = [sys.executable, "-m", "grader", "--submission", str(root), "--name", sid, "--out", str(folder),
           "--tasks", klass["tasks"]]
    cmd += ["--no-sandbox"] if klass["no_sandbox"] else []
    (folder / "command.txt").write_text(" ".join(cmd) + "\n")
    timeout_s = klass["timeout_s"]
    started = time.perf_counter()
    try:
        with open(folder / "grade.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                    env=dict(os.environ, TMPDIR=str(temp)), preexec_fn=die_with_parent)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                _stop(proc)
    finally:
        remove_tree(temp)
    about |= {"ended": _now(), "seconds": round(time.perf_counter() - started, 1)}
    _write_json(folder / "grading.json", about)
    results = folder / "results.json"
    if code is None:
        return _failed(folder, f"timed out: the grading took longer than {timeout_s} s")
    if code != 0 or not results.exists():
        return _failed(folder, f"the grader exited with code {code} (see grade.log)")
    record = json.loads(results.read_text())
    record["seconds"] = about["seconds"]
    return record


def _stop(proc: subprocess.Popen) -> None:
    """End a child (the grader, a prebuild): SIGTERM first (the grader removes its scratch copy), then SIGKILL
    to its whole process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:  # whatever it left behind (its tests end with it: die_with_parent)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _failed(folder: Path, reason: str) -> dict:
    """The grading's error.json; a results.json the grader wrote as it failed is kept, renamed, for its traceback."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "results.json").exists():
        os.replace(folder / "results.json", folder / "grader-failure.json")
    record = {"score": 0, "error": reason, "tests": []}
    _write_json(folder / "error.json", record)
    return record


def source_fingerprint(source: Path) -> str:
    """What a grade of this submission graded: the archive's bytes, or a folder's gradable files (the files
    students write and the archives that may hold them, with their paths; SKIPPED folders left out)."""
    digest = hashlib.sha256()
    mode = os.lstat(source).st_mode
    if stat.S_ISLNK(mode):  # never followed or opened: a link to /dev/zero or a FIFO would never end
        digest.update(f"link to {os.readlink(source)}".encode())
        return digest.hexdigest()[:16]
    if not stat.S_ISDIR(mode):
        if not stat.S_ISREG(mode):
            return hashlib.sha256(f"not a file: {stat.S_IFMT(mode)}".encode()).hexdigest()[:16]
        try:
            with open(source, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError as err:
            digest.update(f"unreadable: {err}".encode())
        return digest.hexdigest()[:16]
    for here, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
        for name in sorted(files):
            path = Path(here) / name
            parts = path.relative_to(source).parts
            if not graded_file(parts) and not archive_suffix(name):
                continue
            digest.update("/".join(parts).encode() + b"\0")
            mode = os.lstat(path).st_mode
            digest.update(f"link to {os.readlink(path)}".encode() if stat.S_ISLNK(mode) else
                          path.read_bytes() if stat.S_ISREG(mode) else b"not a file")
    return digest.hexdigest()[:16]


def grade_state(out: Path, sid: str, source: Path, klass: dict) -> str:
    """"graded", or why this student is graded (again): "missing", "tasks", "changed" or "regrade"."""
    folder = out / "students" / sid
    about = _json_or_none(folder / "grading.json")
    if not (folder / "results.json").exists() or not isinstance(about, dict):
        return "missing"
    now = {"tasks": klass["tasks"], "source_sha256": source_fingerprint(source), "regrade": klass.get("regrade")}
    failed = _json_or_none(folder / "regrade-failed.json")
    if isinstance(failed, dict) and all(failed.get(k) == v for k, v in now.items()):
        return "graded"  # this very regrade was tried and failed; the gradebook says so beside the earlier grade
    if about.get("tasks") != now["tasks"]:
        return "tasks"
    if about.get("source_sha256", now["source_sha256"]) != now["source_sha256"]:  # (none: graded before this kit)
        return "changed"
    if now["regrade"] and about.get("regrade") != now["regrade"]:
        return "regrade"
    return "graded"


def _json_or_none(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def commit(out: Path, sid: str, new: Path) -> bool:
    """Make `new` the student's record, unless it failed and an earlier grade exists; True if that was kept."""
    final = out / "students" / sid
    old = new.with_name(f".{new.name}.old")  # a dot name: never a student's id (discover skips them)
    if old.exists() and not final.exists():
        old.rename(final)  # an earlier commit was killed between its two renames
    if (final / "results.json").exists() and not (new / "results.json").exists():
        failure = json.loads((new / "error.json").read_text())
        about = _json_or_none(new / "grading.json") or {}  # what was tried: a rerun does not try it again
        tried = {k: about.get(k) for k in ("tasks", "source_sha256", "regrade")}
        _write_json(final / "regrade-failed.json", failure | tried | {"when": _now()})
        shutil.rmtree(new)
        return True
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return False


# -- the commands -------------------------------------------------------------------------------

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
    from common.impl import has_solution

    wanted = {u for t in parse_tasks(tasks) for u in (t, *TASKS[t].uses)}
    return sorted(t for t in wanted if TASKS[t].cuda and has_solution(t))


def prebuild(out: Path) -> int:
    """Build the reference extensions the class needs, once: every grading then imports them, read-only.

    common/build.py publishes each build under a name that hashes all its inputs (build/reference/).
    Where this fails (no GPU here, a node of another GPU kind), each grading builds for itself as before.
    """
    for task in reference_builds(load_class(out)["tasks"]):
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", f"task{task}.compile", "--solution"], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent)
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


def write_books(out: Path) -> None:
    klass = load_class(out)
    book = gradebook.write(out, klass)
    report = gradebook.report(out, klass)
    print(f"wrote {book} and {report}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gather"]:
        from grader import slurm

        return slurm.gather_main(argv[1:])
    if argv[:1] == ["prebuild"]:
        parser = argparse.ArgumentParser(prog="python -m grader.batch prebuild")
        parser.add_argument("out", type=Path)
        return prebuild(parser.parse_args(argv[1:]).out)
    if argv[:1] == ["element"]:
        parser = argparse.ArgumentParser(prog="python -m grader.batch element")
        parser.add_argument("out", type=Path)
        parser.add_argument("--index", type=int, help="the student's place in class.json (SLURM_ARRAY_TASK_ID)")
        args = parser.parse_args(argv[1:])
        return element(args.out, args.index)

    from grader import slurm

    parser = argparse.ArgumentParser(prog="python -m grader.batch", description="Grade a whole class.",
                                     epilog="python -m grader.batch gather DIR: the gradebook and report again; "
                                            "python -m grader.batch prebuild DIR: the reference kernels the class "
                                            "needs, built once (a grading runs it first when a CUDA task is graded)")
    parser.add_argument("submissions", type=Path, help="a folder with one folder or archive per student")
    parser.add_argument("--out", type=Path, required=True, help="where every student's results and the gradebook go")
    parser.add_argument("--tasks", help="tasks to grade, e.g. 1,3 (default: the class's, as --out's class.json "
                                         "has them; for a new class, all)")
    parser.add_argument("--regrade", action="store_true",
                        help="grade every student again (a rerun after a stopped --regrade goes on with it)")
    parser.add_argument("--only", metavar="ID[,ID]", action="append",
                        help="grade these students (again), and no one else; repeat it for an id that holds a comma")
    parser.add_argument("--timeout", type=int,
                        help=f"seconds for one student's whole grading (default: the graded tasks' limits in "
                             f"grader/rubric.py summed, and {SLACK_S} s)")
    parser.add_argument("--no-sandbox", action="store_true", help="passed to the grader (see python -m grader -h)")
    slurm.add_options(parser)
    args = parser.parse_args(argv)
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions}: not a folder")
    before = _json_or_none(args.out / "class.json")
    before = before if isinstance(before, dict) else {}
    try:
        tasks = parse_tasks(args.tasks or before.get("tasks") or ",".join(map(str, RUBRIC)))
    except ValueError as err:
        parser.error(str(err))
    tasks_text = ",".join(map(str, tasks))
    args.timeout = args.timeout or sum(RUBRIC[t].timeout_s for t in tasks) + SLACK_S
    if args.slurm:
        slurm.check_options(parser, args)
    if before.get("tasks") and tasks_text != before["tasks"] and args.only:
        parser.error(f"this class ({args.out}) is graded on tasks {before['tasks']}: --only with --tasks {tasks_text} "
                     "would grade some students on other tasks than the rest; leave --tasks out")
    if before.get("tasks") and tasks_text != before["tasks"] and not args.regrade:
        parser.error(f"this class ({args.out}) is graded on tasks {before['tasks']}, not {tasks_text}: leave --tasks "
                     f"out to go on with it, or add --regrade to grade every student on tasks {tasks_text}")
    students = discover(args.submissions)
    ids = {sid for sid, _ in students}
    only = {part.strip() for value in args.only or [] for part in ([value] if value in ids else value.split(","))
            if part.strip()}
    if unknown := sorted(only - ids):
        parser.error(f"--only: no submission for {', '.join(unknown)} in {args.submissions}")
    args.out.mkdir(parents=True, exist_ok=True)
    regrade = uuid.uuid4().hex[:12] if args.regrade and not only else before.get("regrade")
    klass = write_class(args.out, students, tasks_text, args.timeout, args.no_sandbox, regrade)
    states = {sid: grade_state(args.out, sid, source, klass) for sid, source in students}
    todo = [n for n, (sid, _) in enumerate(students) if sid in only or not only and states[sid] != "graded"]
    print(f"{len(students)} submissions, {len(todo)} to grade"
          + ("" if only else f" ({len(students) - len(todo)} graded already, for tasks {klass['tasks']})"))
    for state, words in (("changed", "files changed since their grade"), ("tasks", "graded on other tasks before"),
                         ("regrade", "not yet graded again by the --regrade")):
        who = [sid for sid, _ in students if states[sid] == state and (not only or sid in only)]
        if who:
            print(f"  {words}: {', '.join(who[:20])}{' ...' if len(who) > 20 else ''}")
    if args.slurm:
        return slurm.submit(args, args.out, todo)
    if todo:
        prebuild(args.out)
    grade_locally(args.out, klass, todo)
    write_books(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
