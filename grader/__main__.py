"""python -m grader [--solution] [--submission DIR] [--tasks 1,3]

Grades every task in its own process and writes Results.md (for people) and
results.json (Gradescope's autograder format).

- no option: the student code in this checkout;
- --solution: the reference solution;
- --submission DIR: a student's checkout, graded with this checkout's tests and
  hidden cases; only the files students write are taken from DIR.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from common.impl import REPO, label
from common.records import environment
from grader.rubric import RUBRIC, TOTAL_POINTS, score
from grader.runner import run_task

_BUILD_OUTPUT = shutil.ignore_patterns(".git", "build", "grader-work", "__pycache__", ".scratch", "*.egg-info",
                                       ".venv", "Results.md", "results.json")


def not_copied(folder: str, names: list[str]) -> set[str]:
    """Build output, and the Python reference solutions: a submission must not be able to import them.

    The reference kernels stay: tasks 4 and 5 time them beside the student's (and the
    build refuses a student .cu file that includes them).
    """
    skipped = set(_BUILD_OUTPUT(folder, names))
    if Path(folder).name == "solution":
        skipped |= {n for n in names if n != "kernels"}
    return skipped
STATUS_TEXT = {
    "passed": "passed",
    "failed": "failed",
    "not_implemented": "not implemented yet",
    "needs_cuda": "needs a CUDA GPU",
    "unavailable": "not yet available",
    "crashed": "crashed",
}


def student_paths() -> list[Path]:
    """The files students write: every skeleton generated from a solution/ file."""
    from common.skeleton import generate

    return sorted(generate(REPO))


def prepare_submission(submission: Path) -> tuple[Path, list[str]]:
    """A scratch copy of this checkout with the student's files laid over it."""
    if not submission.is_dir():
        raise SystemExit(f"--submission: {submission} is not a directory")
    work = Path(tempfile.mkdtemp(prefix="grade-")) / "checkout"
    shutil.copytree(REPO, work, ignore=not_copied)
    missing = []
    for rel in student_paths():
        src = submission / rel
        if src.is_file():
            shutil.copyfile(src, work / rel)
        else:
            missing.append(str(rel))
    return work, missing


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def grade_task(task: int, workdir: Path, solution: bool, hidden: bool, timeout: int | None, has_cuda: bool) -> dict:
    rubric = RUBRIC[task]
    entry = {"task": task, "title": rubric.title, "max_points": rubric.points, "points": 0.0, "record": None}
    if not (workdir / f"task{task}" / "test.py").exists():
        return entry | {"status": "unavailable", "summary": "this task is not in the kit yet"}
    if rubric.needs_cuda and not has_cuda:
        return entry | {"status": "needs_cuda",
                        "summary": "not graded here: this task needs a CUDA GPU (run the grader on a GPU machine)"}
    print(f"\n== Task {task}: {rubric.title}")
    run = run_task(task, workdir, solution=solution, hidden=hidden, timeout_s=timeout or rubric.timeout_s)
    if run.record is None:
        return entry | {"status": "crashed", "summary": run.reason, "seconds": run.seconds}
    points, why = score(task, run.record)
    return entry | {"status": run.record["status"], "points": points, "summary": why,
                    "record": run.record, "seconds": run.seconds}


# -- writing the results -------------------------------------------------------------

def _points(entry: dict) -> str:
    if entry["status"] in ("unavailable", "needs_cuda"):
        return f"– / {entry['max_points']:g}"
    return f"{entry['points']:g} / {entry['max_points']:g}"


def _details(entry: dict, limit: int = 10) -> list[str]:
    record = entry.get("record") or {}
    lines = []
    cases = record.get("cases", [])
    failed = [c for c in cases if not c["passed"]]
    for c in failed[:limit]:
        lines.append(f"- FAIL {c['name']}: {c['message'].splitlines()[0] if c['message'] else ''}")
    if len(failed) > limit:
        lines.append(f"- ... and {len(failed) - limit} more failures")
    for c in cases:
        if c["kind"] == "benchmark" and c["passed"]:
            lines.append(f"- {c['name']}: {c['message']}")
    lines += [f"- note: {n}" for n in record.get("notes", [])]
    return lines


def write_results(entries: list[dict], out_dir: Path, graded: str, env: dict) -> tuple[Path, Path]:
    earned = sum(e["points"] for e in entries)
    graded_here = sum(e["max_points"] for e in entries if e["status"] not in ("unavailable", "needs_cuda"))
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    md = [
        "# Results",
        "",
        "Written by `python -m grader`; do not edit by hand.",
        "",
        f"- Graded: {graded}",
        f"- Score: **{earned:g} / {TOTAL_POINTS:g}** ({graded_here:g} of the {TOTAL_POINTS:g} points could be graded here)",
        f"- When: {when}; device: {env['device']}; Python {env['python']}, PyTorch {env['torch']}, "
        f"CUDA {env['cuda'] or 'none'}; commit {env['commit'] or 'unknown'}",
        "",
        "| Task | Status | Points | Summary |",
        "|---|---|---|---|",
    ]
    for e in entries:
        md.append(f"| {e['task']}. {e['title']} | {STATUS_TEXT[e['status']]} | {_points(e)} | "
                  f"{e['summary'].replace('|', '/')} |")
    for e in entries:
        details = _details(e)
        if details:
            md += ["", f"## Task {e['task']}: {e['title']}", "", *details]
    md_path = out_dir / "Results.md"
    md_path.write_text("\n".join(md) + "\n")

    tests = [{
        "name": f"Task {e['task']}: {e['title']}",
        "score": e["points"],
        "max_score": e["max_points"],
        "visibility": "visible",
        "output": "\n".join([f"{STATUS_TEXT[e['status']]}: {e['summary']}", *_details(e, limit=50)]),
    } for e in entries]
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps({"score": earned, "output": f"Graded: {graded}", "tests": tests}, indent=2))
    return md_path, json_path


def write_grader_failure(out_dir: Path, error: str) -> None:
    """A grader crash must show up as a visible failure, never as a silent zero."""
    failure = {"score": 0, "output": "The grader itself failed; tell your instructor.",
               "tests": [{"name": "grader failed", "score": 0, "max_score": TOTAL_POINTS,
                          "visibility": "visible", "output": error}]}
    (out_dir / "results.json").write_text(json.dumps(failure, indent=2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.splitlines()[0])
    parser.add_argument("--solution", action="store_true", help="grade the reference solution")
    parser.add_argument("--submission", type=Path, metavar="DIR", help="grade a student's checkout")
    parser.add_argument("--tasks", default=",".join(map(str, RUBRIC)), help="tasks to grade, e.g. 1,3")
    parser.add_argument("--timeout", type=int, help="seconds per task (default: the rubric's)")
    parser.add_argument("--out", type=Path, help="where to write Results.md and results.json "
                        "(default: the graded checkout)")
    args = parser.parse_args(argv)
    try:
        tasks = sorted({int(t) for t in args.tasks.split(",") if t.strip()})
    except ValueError:
        parser.error(f"--tasks takes numbers separated by commas, got {args.tasks!r}")
    if unknown := [t for t in tasks if t not in RUBRIC]:
        parser.error(f"--tasks: no task {unknown[0]}; tasks are {', '.join(map(str, RUBRIC))}")
    if args.solution and args.submission:
        parser.error("--solution and --submission exclude each other")

    out_dir = args.out or args.submission or REPO
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        workdir, graded = REPO, f"{label(args.solution)} in {REPO}"
        if args.submission:
            workdir, missing = prepare_submission(args.submission.resolve())
            graded = f"submission {args.submission.resolve()}"
            if missing:
                print("missing from the submission (the skeleton is graded instead):", *missing, sep="\n  ")
        hidden = (REPO / "grader" / "hidden.py").exists()
        has_cuda = cuda_available()
        entries = [grade_task(t, workdir, args.solution, hidden, args.timeout, has_cuda) for t in tasks]
        env = environment()
        md_path, json_path = write_results(entries, out_dir, graded, env)
        if args.submission:
            shutil.rmtree(workdir.parent, ignore_errors=True)
    except SystemExit:
        raise
    except Exception:
        write_grader_failure(out_dir, traceback.format_exc())
        raise

    print("\nTask  Status               Points   Summary")
    for e in entries:
        print(f"{e['task']:>4}  {STATUS_TEXT[e['status']]:<20} {_points(e):>8}   {e['summary']}")
    print(f"\nScore {sum(e['points'] for e in entries):g} / {TOTAL_POINTS:g}; wrote {md_path} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
