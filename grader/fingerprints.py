"""Fingerprints of what a grade depends on: the student's files, the kit's own code, the hidden cases.

A kept result (python -m grader --keep) must match the first two; a class's report shows the last
two, so one value each says the whole class was graded alike. (What a class's rerun compares is
grader/submissions.py's source_fingerprint: a student's entry as handed in, archive or folder.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from common.impl import REPO
from common.tasks import KIT_FOLDERS, all_student_files

KIT_CODE = (".py", ".cu", ".cuh", ".cpp", ".h")


def checkout_fingerprint(student_dir: Path) -> str:
    """What a kept result must match: the student files as graded, and the kit's code (tests, hidden cases)."""
    digest = hashlib.sha256()
    for rel in sorted(set(all_student_files())):
        path = student_dir / rel
        digest.update(rel.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"(none)") + b"\0")
    digest.update(kit_fingerprint().encode())
    return digest.hexdigest()


def kit_fingerprint() -> str:
    """The kit's own code (tests, checks, grader, reference, hidden cases), without the files students write."""
    student = set(all_student_files())
    digest = hashlib.sha256()
    for folder in KIT_FOLDERS:
        for path in sorted((REPO / folder).rglob("*")):
            rel = path.relative_to(REPO).as_posix()
            if path.suffix in KIT_CODE and path.is_file() and rel not in student and "__pycache__" not in rel:
                digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def hidden_fingerprint() -> str:
    """The hidden cases and secret seed (grader/hidden.py): the same value shows a regrade used the same cases."""
    path = REPO / "grader" / "hidden.py"
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "none"
