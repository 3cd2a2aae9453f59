"""The class on disk: DIR/class.json (the students and how they are graded), DIR/attempts/<id>.json
(every grading tried, where and how it ended), and whether a student's grade is done."""

from __future__ import annotations

import datetime
import json
import os
import uuid
from pathlib import Path

from grader.submissions import source_fingerprint

TRIES = 2  # a grading stopped from outside (Slurm's time limit, a node failure, scancel) is tried once more


def write_class(out: Path, students: list[tuple[str, Path]], tasks: str, timeout_s: int, no_sandbox: bool,
                regrade: str | None = None, superseded: dict[str, list[str]] | None = None) -> dict:
    """What every element and gather reads: the students in array order and how they are graded.

    `round` names this submission of the class: an attempt counts against TRIES only in its own round.
    `regrade` names the last --regrade: a grade from before it is not done until it is graded again.
    A source is kept as the entry's own path, never resolved: a link stays a link (locate refuses it).
    `superseded`: a student's earlier uploads that the LMS export shows the latest replaced (not graded).
    """
    klass = {"students": [{"id": sid, "source": str(path.absolute())} | ({"superseded": superseded[sid]}
                                                                         if superseded and sid in superseded else {})
                          for sid, path in students],
             "tasks": tasks, "timeout_s": timeout_s, "no_sandbox": no_sandbox, "round": uuid.uuid4().hex[:12],
             "regrade": regrade}
    write_json(out / "class.json", klass)
    return klass


def load_class(out: Path) -> dict:
    try:
        return json.loads((out / "class.json").read_text())
    except (OSError, ValueError):
        raise SystemExit(f"{out}: no class.json here (python -m grader.batch SUBMISSIONS --out {out} writes it)")


def write_json(path: Path, value) -> None:
    """Written whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(value, indent=2))
    os.replace(part, path)


def json_or_none(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def timestamp() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def attempts(out: Path, sid: str) -> list[dict]:
    try:
        found = json.loads((out / "attempts" / f"{sid}.json").read_text())
        return found if isinstance(found, list) else []
    except (OSError, ValueError):
        return []


def save_attempts(out: Path, sid: str, found: list[dict]) -> None:
    write_json(out / "attempts" / f"{sid}.json", found)


def this_round(out: Path, sid: str, klass: dict) -> list[dict]:
    return [a for a in attempts(out, sid) if a.get("round") == klass.get("round")]


def last_round(out: Path, sid: str) -> list[dict]:
    """The attempts of the last round this student was graded in: what their gradebook row tells (a later
    round that left them out, `--only` others, does not change it)."""
    tried = attempts(out, sid)
    return [a for a in tried if a.get("round") == tried[-1].get("round")] if tried else []


def tries_left(out: Path, sid: str, klass: dict) -> int:
    return TRIES - len(this_round(out, sid, klass))


def close_open_attempts(out: Path, sid: str) -> list[dict]:
    """An attempt still open when its student is graded again was killed without a word (SIGKILL, a node lost)."""
    tried = attempts(out, sid)
    if any("ended" not in a for a in tried):
        for earlier in tried:
            earlier.setdefault("outcome", "stopped before it finished (killed)")
            earlier.setdefault("ended", timestamp())
        save_attempts(out, sid, tried)
    return tried


def current_job() -> str:
    """This process's Slurm job (array job and element), or "local"."""
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '?')}"
    return os.environ.get("SLURM_JOB_ID", "local")


def grade_state(out: Path, sid: str, source: Path, klass: dict) -> str:
    """"graded", or why this student is graded (again): "missing", "tasks", "changed", "sandbox" (graded
    with --no-sandbox, and the class is now graded in the sandbox), "regrade", or "machine" (a task the
    machine could not grade: grader/machine.py)."""
    folder = out / "students" / sid
    about = json_or_none(folder / "grading.json")
    if not (folder / "results.json").exists() or not isinstance(about, dict):
        return "missing"
    now = {"tasks": klass["tasks"], "source_sha256": source_fingerprint(source), "regrade": klass.get("regrade"),
           "no_sandbox": klass["no_sandbox"]}
    failed = json_or_none(folder / "regrade-failed.json")
    if isinstance(failed, dict):
        if all(failed.get(k, False if k == "no_sandbox" else None) == v for k, v in now.items()):
            return "graded"  # this very regrade was tried and failed; the gradebook says so beside the earlier grade
        return "changed"  # what failed is no longer what is there: try again (its note goes with a new grade)
    if about.get("tasks") != now["tasks"]:
        return "tasks"
    if about.get("source_sha256", now["source_sha256"]) != now["source_sha256"]:  # (none: graded before this kit)
        return "changed"
    if graded_without_sandbox(folder, about) and not klass["no_sandbox"]:  # it could read the hidden cases then
        return "sandbox"
    if now["regrade"] and about.get("regrade") != now["regrade"]:
        return "regrade"
    if about.get("machine") and about.get("machine_tries", 1) < TRIES:  # a task the machine took
        return "machine"  # (grader/machine.py): no grade yet, so grade it again, TRIES times in all at most
    return "graded"


def graded_without_sandbox(folder: Path, about: dict) -> bool:
    """Whether this grade was made with --no-sandbox (a grade from before grading.json said so: its command)."""
    if "no_sandbox" in about:
        return bool(about["no_sandbox"])
    try:
        return "--no-sandbox" in (folder / "command.txt").read_text().split()
    except OSError:
        return False
