"""Generate the student skeletons from the reference solutions.

A reference file marks each piece students write:

    # BEGIN SOLUTION "step 2: split the heads"
    ...reference code...
    # END SOLUTION

(`// BEGIN SOLUTION ...` in CUDA and C++). In the skeleton the region becomes one
TODO line that names the README step, plus a placeholder:

- Python: `raise NotImplementedError("see README, Task 1, step 2: split the heads")`.
- CUDA: nothing, so the kernel leaves its (NaN-poisoned) output untouched and the
  test reports the step still to do.

When a region needs code to keep the skeleton compiling (a variable used later, a
return value), put it after a `SKELETON` line, commented out; the skeleton keeps it
without the comment marker:

    // BEGIN SOLUTION "step 3: find the row maximum"
    float row_max = block_max(x);
    // SKELETON
    // float row_max = 0.0f;
    // END SOLUTION

A tunable constant may start elsewhere in the skeleton than in the reference, so that tuning
is the student's to do: `[skeleton: N]` at the end of its line sets the skeleton's value.

    constexpr int BLOCK_ROWS = 128;  // Br: query rows per block [skeleton: 64]

becomes `constexpr int BLOCK_ROWS = 64;  // Br: query rows per block`.

A line that ends in `[reference only]` (a header's "add --solution ...") is left out of the skeleton:
the students' copy has no reference to build.

`taskN/solution/<path>` generates `taskN/<path>`. Run `python -m harness.skeleton`
after editing a reference file; `tests/test_skeletons.py` fails when a committed
skeleton differs from what this makes.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

COMMENT = {".py": "#", ".cu": "//", ".cuh": "//", ".cpp": "//", ".h": "//"}
BEGIN = re.compile(r'^(?P<indent>\s*)(?P<c>#|//) BEGIN SOLUTION "(?P<hint>step \d+: [^"]+)"\s*$')
ANY_MARKER = re.compile(r"^\s*(#|//) (BEGIN SOLUTION|SKELETON|END SOLUTION)\b")
UNTUNED = re.compile(r"^(?P<head>\s*constexpr int \w+ = )\d+(?P<rest>;.*?)\s*\[skeleton: (?P<value>\d+)\]\s*$")
EMPTY_COMMENT = re.compile(r"\s*//\s*$")
REFERENCE_ONLY = "[reference only]"


class MarkerError(ValueError):
    """A reference file whose markers do not pair up; never generate from it."""


def solution_files(repo: Path = REPO) -> list[Path]:
    return sorted(
        p
        for p in repo.glob("task*/solution/**/*")
        if p.is_file() and p.suffix in COMMENT and "__pycache__" not in p.parts
    )


def skeleton_path(solution_file: Path) -> Path:
    """taskN/solution/kernels/x.cu -> taskN/kernels/x.cu"""
    parts = list(solution_file.parts)
    parts.remove("solution")
    return Path(*parts)


def task_number(path: Path) -> int:
    for part in path.parts:
        if re.fullmatch(r"task\d+", part):
            return int(part[4:])
    raise MarkerError(f"{path}: not inside a taskN folder")


def make_skeleton(text: str, task: int, comment: str, where: str = "<text>") -> str:
    """Replace every SOLUTION region of `text` by its TODO and placeholder."""
    out: list[str] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        begin = BEGIN.match(line)
        if not begin:
            if ANY_MARKER.match(line):
                raise MarkerError(
                    f"{where}:{i + 1}: {line.strip()!r} outside a region, or a BEGIN SOLUTION "
                    f'without a hint of the form "step K: what to do"'
                )
            if line.rstrip().endswith(REFERENCE_ONLY):
                i += 1
                continue
            untuned = UNTUNED.match(line)
            if not untuned and "[skeleton:" in line:
                raise MarkerError(f"{where}:{i + 1}: [skeleton: N] belongs at the end of a `constexpr int NAME = "
                                  "VALUE;` line")
            if untuned:  # the skeleton's starting value; a comment left empty goes too
                rest = EMPTY_COMMENT.sub("", untuned["rest"])
                line = f"{untuned['head']}{untuned['value']}{rest}\n"
            out.append(line)
            i += 1
            continue
        if begin["c"] != comment:
            raise MarkerError(f"{where}:{i + 1}: use {comment!r} markers in this file")
        indent, hint = begin["indent"], begin["hint"]
        start = i
        i += 1
        placeholder: list[str] | None = None
        while True:
            if i == len(lines):
                raise MarkerError(f"{where}:{start + 1}: BEGIN SOLUTION without END SOLUTION")
            stripped = lines[i].strip()
            if stripped == f"{comment} END SOLUTION":
                break
            if BEGIN.match(lines[i]) or stripped.startswith(f"{comment} BEGIN SOLUTION"):
                raise MarkerError(f"{where}:{i + 1}: nested BEGIN SOLUTION")
            if stripped == f"{comment} SKELETON":
                if placeholder is not None:
                    raise MarkerError(f"{where}:{i + 1}: two SKELETON lines in one region")
                placeholder = []
            elif placeholder is not None:
                placeholder.append(_uncomment(lines[i], comment, f"{where}:{i + 1}"))
            i += 1
        i += 1  # the END line
        step_text = f"README, Task {task}, {hint}"
        out.append(f"{indent}{comment} TODO ({step_text})\n")
        if comment == "#" and placeholder is None:
            out.append(f'{indent}raise NotImplementedError("see {_escape(step_text)}")\n')
        out.extend(placeholder or [])
    return "".join(out)


def _uncomment(line: str, comment: str, where: str) -> str:
    body = line.rstrip("\n")
    stripped = body.lstrip()
    if not stripped.startswith(comment):
        raise MarkerError(f"{where}: placeholder lines after SKELETON must be commented out")
    indent = body[: len(body) - len(stripped)]
    rest = stripped[len(comment) :]
    return indent + (rest[1:] if rest.startswith(" ") else rest) + "\n"


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def generate(repo: Path = REPO) -> dict[Path, str]:
    """Every skeleton path (relative to repo) with the text it should have."""
    result = {}
    for src in solution_files(repo):
        rel = src.relative_to(repo)
        text = src.read_text()
        if "BEGIN SOLUTION" not in text:
            continue  # a solution-only helper with nothing for students to write
        result[skeleton_path(rel)] = make_skeleton(
            text, task_number(rel), COMMENT[src.suffix], where=str(rel)
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report skeletons that differ")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in generate().items():
        target = REPO / rel
        if target.exists() and target.read_text() == text:
            continue
        stale.append(rel)
        if not args.check:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {rel}")
    if args.check and stale:
        print("out of date (run python -m harness.skeleton):", *map(str, stale), sep="\n  ")
        return 1
    if not stale:
        print("all skeletons up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
