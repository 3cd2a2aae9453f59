"""python -m grader.batch SUBMISSIONS --out DIR [--tasks 1,3] [--regrade] [--no-sandbox]   (instructors)

Grades a whole class, one submission after another on this machine, each exactly as
`python -m grader --submission` grades it (its own process, the trusted harness, the hidden
cases), then writes a gradebook. SUBMISSIONS is a folder as a learning-management system
exports it: one folder, `.zip`, `.tar.gz` or `.tgz` per student, whose name (without the
extension) is the student's id.

Nothing is lost or mixed up:
- archives are unpacked safely into DIR/unpacked/<id> (no path out of that folder, no links or
  devices, at most MAX_FILES files and MAX_BYTES bytes); a broken one is that student's error;
- each student's grade goes to DIR/students/<id> only (Results.md, results.json, grade.log);
- a rerun grades only the students without a results.json (all of them with --regrade), so an
  interrupted class resumes where it stopped;
- DIR/gradebook.csv is rebuilt from every student's results.json each time, so it can be
  rewritten at any time and never holds a grade that is not on disk.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import stat
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from grader.rubric import RUBRIC

MAX_FILES = 2000
MAX_BYTES = 200 * 1024 * 1024
ARCHIVES = (".tar.gz", ".tgz", ".zip")


class BadArchive(Exception):
    """A submission that cannot be unpacked safely; the message is the student's error."""


def student_id(path: Path) -> str:
    name = path.name
    for suffix in ARCHIVES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def discover(submissions: Path) -> list[tuple[str, Path]]:
    """(student id, folder or archive) for every submission, sorted by id; ids must be unique."""
    found: dict[str, Path] = {}
    for path in sorted(submissions.iterdir()):
        if path.name.startswith(".") or path.is_symlink():
            continue
        if not (path.is_dir() or (path.is_file() and path.name.endswith(ARCHIVES))):
            continue
        sid = student_id(path)
        if sid in found:
            raise SystemExit(f"two submissions for student {sid!r}: {found[sid].name} and {path.name}")
        found[sid] = path
    return sorted(found.items())


def _safe_target(dest: Path, name: str) -> Path:
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts:
        raise BadArchive(f"the archive holds a path outside its folder: {name!r}")
    return dest.joinpath(*parts)


def _members(archive: Path):
    """(name, "file" | "folder" | "other", bytes, a function that opens its data) for each entry."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                mode = stat.S_IFMT(info.external_attr >> 16)  # 0 when the archiver did not record it
                kind = ("other" if mode not in (0, stat.S_IFREG, stat.S_IFDIR) else
                        "folder" if info.is_dir() else "file")
                yield info.filename, kind, info.file_size, lambda info=info: zf.open(info)
    else:
        with tarfile.open(archive, "r:gz") as tf:
            for member in tf:
                kind = "folder" if member.isdir() else "file" if member.isfile() else "other"
                yield member.name, kind, member.size, lambda member=member: tf.extractfile(member)


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack into `dest` (created); returns the submission's root (the single top folder, if there is one)."""
    dest.mkdir(parents=True)
    count, size = 0, 0

    def admit(name: str, nbytes: int) -> Path:
        nonlocal count, size
        count, size = count + 1, size + nbytes
        if count > MAX_FILES:
            raise BadArchive(f"more than {MAX_FILES} files in the archive")
        if size > MAX_BYTES:
            raise BadArchive(f"more than {MAX_BYTES // 1024 // 1024} MiB unpacked")
        return _safe_target(dest, name)

    try:
        for name, kind, nbytes, read in _members(archive):
            if kind not in ("file", "folder"):
                raise BadArchive(f"the archive holds a link or device: {name!r}")
            target = admit(name, nbytes)
            if kind == "folder":
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with read() as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as err:
        raise BadArchive(f"not a readable archive: {err}") from None
    entries = [p for p in dest.iterdir() if not p.name.startswith(("__MACOSX", "."))]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def grade_one(sid: str, source: Path, out: Path, tasks: str, no_sandbox: bool, timeout_s: int) -> dict:
    """Grade one student into out/students/<sid>; returns its results.json (or a record of why there is none)."""
    folder = out / "students" / sid
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    try:
        if source.is_dir():
            root = source
        else:
            unpacked = out / "unpacked" / sid
            shutil.rmtree(unpacked, ignore_errors=True)
            root = unpack(source, unpacked)
    except BadArchive as err:
        return _failed(folder, f"archive: {err}")
    cmd = [sys.executable, "-m", "grader", "--submission", str(root), "--out", str(folder), "--tasks", tasks]
    cmd += ["--no-sandbox"] if no_sandbox else []
    (folder / "command.txt").write_text(" ".join(cmd) + "\n")
    started = time.perf_counter()
    with open(folder / "grade.log", "w") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  cwd=Path(__file__).resolve().parent.parent, start_new_session=True)
        except subprocess.TimeoutExpired:
            return _failed(folder, f"the grader did not finish within {timeout_s} s")
    results = folder / "results.json"
    if proc.returncode != 0 or not results.exists():
        return _failed(folder, f"the grader exited with code {proc.returncode} (see grade.log)")
    record = json.loads(results.read_text())
    record["seconds"] = round(time.perf_counter() - started, 1)
    results.write_text(json.dumps(record, indent=2))
    return record


def _failed(folder: Path, reason: str) -> dict:
    record = {"score": 0, "error": reason, "tests": []}
    (folder / "error.json").write_text(json.dumps(record, indent=2))
    return record


def gradebook(out: Path, ids: list[str]) -> Path:
    """DIR/gradebook.csv from every student's folder: id, points per task, total, and what went wrong."""
    path = out / "gradebook.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *(f"task{t}" for t in RUBRIC), "total", "problem"])
        for sid in ids:
            folder = out / "students" / sid
            results, error = folder / "results.json", folder / "error.json"
            points: dict[int, float | str] = {t: "" for t in RUBRIC}
            problem = ""
            if results.exists():
                record = json.loads(results.read_text())
                for test in record.get("tests", []):
                    task = int(test["name"].split(":")[0].split()[-1])
                    points[task] = f"{test['score']:g}"
                total = f"{record.get('score', 0):g}"
            elif error.exists():
                total, problem = 0, json.loads(error.read_text())["error"]
            else:
                total, problem = "", "not graded yet"
            writer.writerow([sid, *points.values(), total, problem])
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.batch", description=__doc__.splitlines()[2])
    parser.add_argument("submissions", type=Path, help="a folder with one folder or archive per student")
    parser.add_argument("--out", type=Path, required=True, help="where every student's results and the gradebook go")
    parser.add_argument("--tasks", default=",".join(map(str, RUBRIC)), help="tasks to grade, e.g. 1,3")
    parser.add_argument("--regrade", action="store_true", help="grade every student again, not only the missing")
    parser.add_argument("--timeout", type=int, default=sum(r.timeout_s for r in RUBRIC.values()) + 600,
                        help="seconds for one student's whole grading (default: the rubric's limits summed)")
    parser.add_argument("--no-sandbox", action="store_true", help="passed to the grader (see python -m grader -h)")
    args = parser.parse_args(argv)
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions}: not a folder")
    students = discover(args.submissions)
    args.out.mkdir(parents=True, exist_ok=True)
    todo = [(sid, path) for sid, path in students
            if args.regrade or not (args.out / "students" / sid / "results.json").exists()]
    print(f"{len(students)} submissions, {len(todo)} to grade ({len(students) - len(todo)} already graded)")
    started, failures = time.perf_counter(), 0
    for n, (sid, path) in enumerate(todo, 1):
        record = grade_one(sid, path, args.out, args.tasks, args.no_sandbox, args.timeout)
        failures += "error" in record
        elapsed = time.perf_counter() - started
        left = elapsed / n * (len(todo) - n)
        said = record.get("error") or f"{record['score']:g} of {sum(t['max_score'] for t in record['tests']):g} points"
        print(f"[{n}/{len(todo)}] {sid}: {said}; {failures} failed; about {left / 60:.0f} min left", flush=True)
    print(f"wrote {gradebook(args.out, [sid for sid, _ in students])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
