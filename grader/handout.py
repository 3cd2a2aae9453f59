"""python -m grader.handout DEST

Export the student repository: every tracked file except the reference
solutions, the hidden cases, the instructors' notes (notes/) and the tests built on the
reference (they hold its lines as known-bad variants, and would only be skipped), the
skeletons in place (regenerated, so they match the reference), the README without its
instructors' section, and a blank Results.md. DEST must not exist yet.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from common.impl import REPO
from harness.skeleton import generate

BLANK_RESULTS = "# Results\n\nNot graded yet: run `python -m grader` to fill this in.\n"


INSTRUCTORS = re.compile(r"^<!-- instructors\b.*?^<!-- /instructors -->\n", re.S | re.M)


# Test helpers that only tests built on the reference use, by module name under tests/ (a file or a package): the
# CPU stand-ins of the CUDA tasks' grading flow, tests/stand_in/.
INSTRUCTOR_TEST_HELPERS = {"stand_in"}


# `from tests import X`, `from tests.X[.Y] import ...`, `import tests.X[.Y]`, at any indentation (inside a test too).
TESTS_IMPORT = re.compile(r"^\s*(?:from\s+tests\.(\w+)[\w.]*\s+import|from\s+tests\s+import\s+(\w+)|import\s+tests\.(\w+))",
                          re.M)


def imported_test_modules(text: str) -> set[str]:
    """The modules of tests/ that a test file imports."""
    return {name for match in TESTS_IMPORT.finditer(text) for name in match.groups() if name}


def instructor_only(rel: Path, _seen: frozenset[Path] = frozenset()) -> bool:
    """Reference solutions, hidden cases, notes on how the reference was tuned, and tests built on the reference
    (or importing one that is: left in, it would fail to import in the students' copy)."""
    if rel.parts[0] == "tests" and len(rel.parts) > 1 and Path(rel.parts[1]).stem in INSTRUCTOR_TEST_HELPERS:
        return True
    if rel.parts[0] == "tests" and rel.suffix == ".py" and rel.name != "conftest.py":
        text = (REPO / rel).read_text()
        if "needs_solution(" in text or "bad_variant(" in text:
            return True
        names = imported_test_modules(text)
        if names & INSTRUCTOR_TEST_HELPERS:
            return True
        imported = (Path("tests") / f"{name}.py" for name in names)
        return any(instructor_only(other, _seen | {rel}) for other in imported
                   if other not in _seen and other != rel and (REPO / other).is_file())
    return "solution" in rel.parts or rel == Path("grader/hidden.py") or rel.parts[0] == "notes"


def students_readme() -> str:
    """README.md without the blocks marked for instructors."""
    text = INSTRUCTORS.sub("", (REPO / "README.md").read_text())
    if "<!-- instructors" in text or "<!-- /instructors" in text:
        raise SystemExit("README.md: an instructors' marker without its partner (each block is a line "
                         "'<!-- instructors ...' and, later, a line '<!-- /instructors -->')")
    return text


NOT_EXPORTED = {".git", "build", "grader-work", "__pycache__", ".scratch", ".venv", ".pytest_cache"}


def tracked_files() -> list[Path]:
    """git's tracked files; outside a git checkout (an unpacked archive), every file but build output."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        files = [Path(p) for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if files:
        return files
    return sorted(rel for rel in (p.relative_to(REPO) for p in REPO.rglob("*") if p.is_file()) if _source(rel))


def _source(rel: Path) -> bool:
    """Not build output, caches, virtual environments or grading results."""
    return (not NOT_EXPORTED & set(rel.parts) and not any(part.endswith(".egg-info") for part in rel.parts)
            and rel.name != "results.json" and rel.parts[0] != "graded")


def export(dest: Path) -> list[Path]:
    if dest.exists():
        raise SystemExit(f"{dest} already exists; choose a new folder")
    skeletons = generate(REPO)
    written = []
    for rel in tracked_files():
        if instructor_only(rel) or not (REPO / rel).is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel in skeletons:
            target.write_text(skeletons[rel])
        elif rel == Path("Results.md"):
            target.write_text(BLANK_RESULTS)
        elif rel == Path("README.md"):
            target.write_text(students_readme())
        else:
            target.write_bytes((REPO / rel).read_bytes())
        written.append(rel)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.handout", description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="folder to create")
    args = parser.parse_args(argv)
    written = export(args.dest)
    print(f"wrote {len(written)} files to {args.dest} (no solutions, no hidden cases, skeletons in place)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
