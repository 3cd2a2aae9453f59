"""python -m grader [--submission DIR] [--tasks 1,3] [--out DIR] [--solution, in the instructors' copy]

Grades every task in its own process and writes Results.md (for people) and
results.json (Gradescope's autograder format).

- no option: the student code in this checkout;
- --solution: the reference solution (only where the checkout has it: not in the students' handout);
- --submission DIR: a student's checkout, graded with this checkout's tests and
  hidden cases. Only the files students write (common/tasks.py) are taken from DIR, as
  regular files (no links); the results go to --out, by default grading/<name of DIR>
  beside DIR, never into DIR itself.
- --keep: Results.md also lists the tasks an earlier run graded into the same --out, when
  that run graded the same files with the same kit on the same device (graded/taskN.json),
  so the tasks can be graded in several shorter runs.

Each task's test runs here (trusted code); the student's code runs in a worker process
that the test starts (harness/sandbox.py), inside bubblewrap when it is installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path

from common.impl import REPO, add_solution_flag, label
from harness.outcome import Kind, Status, cause_of
from harness.records import SHOW_NAMES, environment, failure_groups, lead_of
from harness.view import building_lock, copy_regular_file, remove_tree, sandbox_status
from common.tasks import TASKS
from grader.fingerprints import checkout_fingerprint
from grader.rubric import RUBRIC, TOTAL_POINTS, estimated, parse_tasks, score
from grader import machine
from grader.runner import STOPPING, build_kernels_ahead, run_task, valid_record, worker_builds
from grader.schedule import cpu_priority, cpu_threads, grade_at_once, share_file

SANDBOX_TEXT = {
    "bubblewrap": "a sandboxed worker (bubblewrap: its own view of the files, its own processes, no network)",
    "plain process": "a plain worker process (bubblewrap is not installed: the files of this machine were "
                     "not hidden from it)",
}
STATUS_TEXT = {
    Status.PASSED: "passed",
    Status.FAILED: "failed",
    Status.NOT_IMPLEMENTED: "not implemented yet",
    Status.NEEDS_CUDA: "needs a CUDA GPU",
    Status.UNAVAILABLE: "not yet available",
    Status.CRASHED: "crashed",
    Status.NOT_GRADED: "could not grade",
}


def skeleton_text(rel: str) -> bytes:
    """The skeleton a missing student file is graded as."""
    from harness.skeleton import generate

    generated = {str(path): text for path, text in generate(REPO).items()}
    return generated[rel].encode() if rel in generated else (REPO / rel).read_bytes()


def prepare_submission(submission: Path, into: Path, graded: list[int] | None = None) -> list[str]:
    """Copy the files students write from `submission` into `into`: regular files only, size-capped.

    Returns notes on the files not taken (missing, a link, too large); those are graded as the skeleton. Only the
    files of the `graded` tasks (and of the tasks they run: task 6 runs task 4's kernels) are noted: another
    task's file that is missing changes nothing here.
    """
    if not submission.is_dir():
        raise SystemExit(f"--submission: {submission} is not a directory")
    noted = set(TASKS) if graded is None else {u for t in graded for u in (t, *TASKS[t].uses)}
    notes = []
    for number, task in TASKS.items():
        for rel in task.student_files:
            parts = Path(rel).parts
            linked = any(submission.joinpath(*parts[:n]).is_symlink() for n in range(1, len(parts)))
            why = "in a folder that is a link" if linked else copy_regular_file(submission / rel, into / rel)
            if why:
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                (into / rel).write_bytes(skeleton_text(rel))
                if number not in noted:
                    continue
                if why == "missing" and rel in task.optional_files:  # an optional part left out: nothing lost
                    notes.append(f"{rel}: not in the submission (an optional part, not scored), so its skeleton "
                                 "was used")
                else:
                    notes.append(f"{rel}: {why}, so the skeleton was graded instead")
    return notes


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def grade_task(task: int, student_dir: Path, scratch: Path, solution: bool, hidden: bool, timeout: int | None,
               has_cuda: bool, say=print, gpu_share: Path | None = None,
               nice: int = 0, threads: int | None = None) -> dict:
    rubric = RUBRIC[task]
    entry = {"task": task, "title": rubric.title, "max_points": rubric.points, "points": 0.0, "record": None}
    if not (REPO / f"task{task}" / "test.py").exists():
        return entry | {"status": Status.UNAVAILABLE, "summary": "this task is not in the kit yet"}
    if rubric.needs_cuda and not has_cuda:
        here = "" if TASKS[task].cuda else f" (your code's logic is checked here too: python -m task{task}.test)"
        return entry | {"status": Status.NEEDS_CUDA,
                        "summary": f"not graded here: run the grader on a machine with a CUDA GPU{here}"}
    say(f"\n== Task {task}: {rubric.title}\n")
    run = run_task(task, student_dir, scratch, solution=solution, hidden=hidden,
                   timeout_s=timeout or rubric.timeout_s,
                   echo=lambda line: say(f"  | {line}"), gpu_share=gpu_share, nice=nice, threads=threads)
    alone = f", {run.alone_s:.0f} s timing alone" if run.alone_s else ""  # the grading's other tests waiting
    say(f"  ({run.seconds:.0f} s, of which {run.waited_s:.0f} s waiting for other tasks{alone})\n")
    if run.record is None:
        return entry | {"status": Status.CRASHED, "summary": run.reason, "cause": run.cause, "seconds": run.seconds}
    points, why = score(task, run.record)
    # a worker that died of it says so only in the output ("the worker stopped answering" in its case)
    out_of_memory = run.record["status"] != Status.PASSED and machine.says_out_of_memory(run.log)
    return entry | {"status": run.record["status"], "points": points, "summary": why,
                    "estimated": estimated(task, run.record), "record": run.record, "seconds": run.seconds,
                    "waited_s": run.waited_s, "alone_s": run.alone_s, "started_at": run.started_at,
                    "timed_parts": [list(part) for part in run.timed_parts], "out_of_memory": out_of_memory}


# -- results kept between runs ------------------------------------------------------

def save_entry(out_dir: Path, entry: dict, key: dict) -> None:
    """One task's result as soon as it is graded, for a later --keep (and for a run cut short)."""
    folder = out_dir / "graded"
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.unlink()
    folder.mkdir(exist_ok=True)
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    write_new_file(folder / f"task{entry['task']}.json", json.dumps({"key": key, "when": when, "entry": entry}))


def kept_entries(out_dir: Path, key: dict, graded_now: list[int]) -> list[dict]:
    """The other tasks' results saved in out_dir by runs with the same key, their points scored again here."""
    kept = []
    for task in RUBRIC:
        path = out_dir / "graded" / f"task{task}.json"
        if task in graded_now or path.is_symlink() or not path.is_file():
            continue
        try:
            saved = json.loads(path.read_text())
            if (saved["key"] != key or saved["entry"]["task"] != task or saved["entry"]["status"] not in STATUS_TEXT
                    or saved["entry"]["status"] == Status.NOT_GRADED):  # the machine's: graded again, not kept
                continue
            entry = saved["entry"]
            if entry.get("record") is not None:  # status, points and summary all follow from the record
                record = valid_record(entry["record"], task)
                points, summary = score(task, record)
                entry = {"record": record, "status": record["status"], "points": points, "summary": summary,
                         "estimated": estimated(task, record)}
            elif (entry["status"] in (Status.CRASHED, Status.UNAVAILABLE, Status.NEEDS_CUDA)
                  and isinstance(entry["summary"], str)):
                entry = {"record": None, "status": entry["status"], "points": 0.0, "summary": entry["summary"],
                         "cause": cause_of(entry)}
            else:
                continue
            kept.append(entry | {"task": task, "title": RUBRIC[task].title, "max_points": RUBRIC[task].points,
                                 "kept_from": str(saved["when"])})
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
            continue  # not a result this grader wrote: grade that task again instead
    return kept


# -- writing the results -------------------------------------------------------------

def _points(entry: dict) -> str:
    if entry["status"] in (Status.UNAVAILABLE, Status.NEEDS_CUDA):
        return f"– / {entry['max_points']:g}"
    return f"{entry['points']:g} / {entry['max_points']:g}"


MESSAGE_LINES = 6


def _details(entry: dict, limit: int = 10) -> list[str]:
    record = entry.get("record") or {}
    lines = []
    cases = record.get("cases", [])
    failed = [c for c in cases if not c["passed"]]
    # failures of one kind (the same diagnosis, or the same words with other numbers) once, with their count, as
    # the test's console says them; a scored check and an optional one are never one kind
    groups = [[failed[i] for i in group]
              for group in failure_groups([c["message"] for c in failed], [c["kind"] for c in failed])]
    for same in groups[:limit]:
        c = same[0]
        # a build error or a sanitizer report says what matters on the lines after its first
        first, *rest = c["message"].splitlines() or [""]
        optional = " (optional)" if c["kind"] == "optional" else ""
        lead = lead_of(c["message"])
        if len(same) == 1:
            lines.append(f"- FAIL{optional} {c['name']}: {first}")
        elif lead:
            lines.append(f"- FAIL{optional} {len(same)} checks: {lead}")
            lines.append(f"  the first, {c['name']}: {first[len(lead):].strip()}")
        else:
            lines.append(f"- FAIL{optional} {len(same)} checks fail the same way; the first, {c['name']}: {first}")
        lines += [f"  {ln}" for ln in rest[:MESSAGE_LINES]]
        if len(rest) > MESSAGE_LINES:
            lines.append(f"  ... and {len(rest) - MESSAGE_LINES} more lines "
                         f"(python -m task{entry['task']}.test shows all)")
        if len(same) > 1:
            names = [s["name"] for s in same[1:1 + SHOW_NAMES]]
            more = len(same) - 1 - len(names)
            lines.append(f"  also: {'; '.join(names)}{f'; and {more} more' if more else ''}")
    if len(groups) > limit:
        lines.append(f"- ... and {sum(map(len, groups[limit:]))} more failures")
    for c in cases:
        if c["kind"] == Kind.BENCHMARK and c["passed"]:
            lines.append(f"- {c['name']}: {c['message']}")
    lines += [f"- note: {n}" for n in record.get("notes", [])]
    return lines


def write_new_file(path: Path, text: str) -> None:
    """Write without following a link that someone left at `path` (it is replaced, its target untouched)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def score_text(entries: list[dict], bold: str = "") -> str:
    """"5 / 20 (5 of the 20 points graded: tasks 2, 4, 5, 6, 7 need a GPU)": what this run could not grade, and why.
    A grading of some tasks (--tasks 1,3) counts out of those: "5 / 5 of the tasks graded (5 of the 20 ...)"."""
    earned = sum(e["points"] for e in entries)
    graded = sum(e["max_points"] for e in entries
                 if e["status"] not in (Status.UNAVAILABLE, Status.NEEDS_CUDA, Status.NOT_GRADED))
    why = [f"task {tasks[0]} {one}" if len(tasks) == 1 else f"tasks {', '.join(map(str, tasks))} {many}"
           for tasks, one, many in (
               ([e["task"] for e in entries if e["status"] == Status.NOT_GRADED],  # the machine's: first
                "could not be graded on this machine (regrade)", "could not be graded on this machine (regrade)"),
               ([e["task"] for e in entries if e["status"] == Status.NEEDS_CUDA], "needs a GPU", "need a GPU"),
               ([t for t in RUBRIC if t not in {e["task"] for e in entries}], "not asked for", "not asked for"),
               ([e["task"] for e in entries if e["status"] == Status.UNAVAILABLE], "is not in the kit yet",
                "are not in the kit yet"),
               ([e["task"] for e in entries if e.get("estimated")],
                "has its performance points estimated (grader/calibration.json)",
                "have their performance points estimated (grader/calibration.json)"))
           if tasks]
    partial = any(t not in {e["task"] for e in entries} for t in RUBRIC)
    out_of = f"{graded:g}{bold} of the tasks graded" if partial else f"{TOTAL_POINTS:g}{bold}"
    return (f"{bold}{earned:g} / {out_of} "
            f"({graded:g} of the {TOTAL_POINTS:g} points graded" + (f": {'; '.join(why)})" if why else ")"))


def write_results(entries: list[dict], out_dir: Path, graded: str, env: dict,
                  notes: list[str] = ()) -> tuple[Path, Path]:
    earned = sum(e["points"] for e in entries)
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    md = [
        "# Results",
        "",
        "Written by `python -m grader`; do not edit by hand.",
        "",
        f"- Graded: {graded}",
        f"- Score: {score_text(entries, bold='**')}",
        f"- When: {when}; device: {env['device']}; Python {env['python']}, PyTorch {env['torch']}, "
        f"CUDA {env['cuda'] or 'none'}; commit {env['commit'] or 'none (not a git checkout)'}",
        f"- Student code ran in: {SANDBOX_TEXT[sandbox_status()]}",
        *[f"- Note: {n}" for n in notes],
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
    write_new_file(md_path, "\n".join(md) + "\n")

    tests = [{
        "name": f"Task {e['task']}: {e['title']}",
        "score": e["points"],
        "max_score": e["max_points"],
        "visibility": "visible",
        "output": "\n".join([f"{STATUS_TEXT[e['status']]}: {e['summary']}", *_details(e, limit=50)]),
    } for e in entries]
    json_path = out_dir / "results.json"
    output = "\n".join([f"Graded: {graded}", f"Student code ran in: {SANDBOX_TEXT[sandbox_status()]}", *notes])
    write_new_file(json_path, json.dumps({"score": earned, "output": output, "tests": tests}, indent=2))
    return md_path, json_path


def write_grader_failure(out_dir: Path, error: str) -> None:
    """A grader crash must show up as a visible failure, never as a silent zero."""
    failure = {"score": 0, "output": "The grader itself failed; tell your instructor.",
               "tests": [{"name": "grader failed", "score": 0, "max_score": TOTAL_POINTS,
                          "visibility": "visible", "output": error}]}
    write_new_file(out_dir / "results.json", json.dumps(failure, indent=2))


def default_out(args) -> Path:
    """Never the submission itself: a student controls what is there (a results.json link, say)."""
    if args.out:
        return args.out
    if args.submission:
        return args.submission.resolve().parent / "grading" / args.submission.resolve().name
    return REPO


def _stopped(signum, _frame):
    """SIGTERM: leave through the cleanup. Once only: Slurm signals every process of a job and grader.batch
    sends its own, and a second exit raised inside the cleanup would cut it short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(128 + signum)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.splitlines()[0])
    add_solution_flag(parser, 1, "grade the reference solution", "python -m grader grades your own files")
    parser.add_argument("--submission", type=Path, metavar="DIR", help="grade a student's checkout")
    parser.add_argument("--name", help="the submission's name in Results.md (default: DIR's folder name); "
                                       "grader.batch gives the student's id")
    parser.add_argument("--tasks", default=",".join(map(str, RUBRIC)), help="tasks to grade, e.g. 1,3")
    parser.add_argument("--timeout", type=int, help="seconds per task (default: the rubric's)")
    parser.add_argument("--out", type=Path, help="where to write Results.md and results.json (default: this "
                        "checkout; with --submission DIR, grading/<name> beside DIR)")
    parser.add_argument("--keep", action="store_true",
                        help="also list the tasks graded earlier into --out with the same files, kit and device "
                             "(grade the tasks in several runs, then one Results.md)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run the student's code in plain processes, without bubblewrap even where it is "
                             "installed (needed to grade a submission where it is not: its code can then read this "
                             "machine's files, the hidden cases included)")
    args = parser.parse_args(argv)
    try:
        tasks = parse_tasks(args.tasks)
    except ValueError as err:
        parser.error(str(err))
    if args.solution and args.submission:
        parser.error("--solution and --submission exclude each other")
    if args.submission and sandbox_status() != "bubblewrap" and not args.no_sandbox:
        parser.error("bubblewrap (bwrap) is not installed, so a submission's code could read this checkout, the "
                     "hidden cases included: install it (Debian/Ubuntu: apt install bubblewrap), or pass "
                     "--no-sandbox to grade anyway")

    if args.no_sandbox:  # every test and worker this grading starts reads it (harness/view.py's sandbox_status)
        os.environ["KIT_NO_SANDBOX"] = "1"
    out_dir = default_out(args)
    if out_dir.is_symlink():
        parser.error(f"--out: {out_dir} is a link; give a real folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    # stopped (Slurm's time limit, scancel, grader.batch's timeout): clean up as on any other exit
    signal.signal(signal.SIGTERM, _stopped)
    scratch = Path(tempfile.mkdtemp(prefix="grade-"))
    try:
        student_dir, graded, notes = REPO, f"{label(args.solution)} in this checkout", []
        if args.submission:
            student_dir = scratch / "submission"
            notes = prepare_submission(args.submission, student_dir, tasks)
            graded = f"submission {args.name or args.submission.resolve().name}"
            for note in notes:
                print(f"note: {note}")
        hidden = (REPO / "grader" / "hidden.py").exists()
        has_cuda = cuda_available()
        env = environment()
        key = {"graded": graded, "solution": args.solution, "hidden": hidden, "files": checkout_fingerprint(student_dir),
               "device": env["device"], "torch": env["torch"]}
        share = share_file(scratch)

        def grade(task, say):
            entry = grade_task(task, student_dir, scratch, args.solution, hidden, args.timeout, has_cuda, say=say,
                               gpu_share=share, nice=cpu_priority(task, tasks, has_cuda),
                               threads=cpu_threads([t for t in tasks if has_cuda or not RUBRIC[t].needs_cuda]))
            if not STOPPING.is_set():  # a test killed as the grader stops is no result to keep
                save_entry(out_dir, entry, key)
            return entry

        build = (lambda: build_kernels_ahead(tasks, student_dir, scratch, solution=args.solution)) if has_cuda else None
        graded_now = grade_at_once(tasks, grade, build=build, share=share,
                                   building=building_lock(worker_builds(scratch)))
        for task in [t for t in tasks if not STOPPING.is_set() and machine.to_look_at(graded_now[t], has_cuda)]:
            # every other task has ended: nothing of this grading holds GPU memory beside this one now
            print(f"\ntask {task} ran out of memory or could not start CUDA: graded again, alone on the GPU "
                  "(grader/machine.py)")
            held = machine.gpu_memory_in_use()
            again = grade(task, lambda text: print(text, end="", flush=True))
            graded_now[task], said = machine.verdict(graded_now[task], again, held, has_cuda)
            save_entry(out_dir, graded_now[task], key)
            notes = notes + [said]
            print(f"note: {said}")
        entries = [graded_now[t] for t in tasks]
        if args.keep:
            kept = kept_entries(out_dir, key, tasks)
            entries = sorted(entries + kept, key=lambda e: e["task"])
            notes = notes + [f"task {e['task']} kept from the run of {e['kept_from']} (--keep: the same files, kit "
                             "and device)" for e in kept]
        md_path, json_path = write_results(entries, out_dir, graded, env, notes)
    except SystemExit:
        raise
    except Exception:
        write_grader_failure(out_dir, traceback.format_exc())
        raise
    finally:
        remove_tree(scratch)

    print("\nTask  Status               Points   Summary")
    for e in entries:
        print(f"{e['task']:>4}  {STATUS_TEXT[e['status']]:<20} {_points(e):>8}   {e['summary']}")
    print(f"\nScore {score_text(entries)}; wrote {md_path} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
