"""The class's gradebook (DIR/gradebook.csv) and report (DIR/report.md, DIR/plots/*.png).

Both are made from the students' folders alone (write_books, after every run of grader.batch),
each time anew, so they can be rebuilt at any time and never hold a grade that is not on disk.

Flags name the tasks they concern ("2 4"), or "all" for the whole grading:
- not_built: the student's code did not build or import;
- timed_out: a task, or the whole grading, ran past its time limit (the grader's or Slurm's);
- sanitizer: compute-sanitizer found an out-of-bounds access, a race or an error (the task scores 0);
- own_work: another rule was broken: PyTorch's own attention, the reference, cuBLAS (the task scores 0);
- tampering: links in the archive or in place of the student's files, a path out of the archive,
  a record or reply from the worker the grader refused as malformed.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import Counter
from pathlib import Path

from harness.bench import VS_REFERENCE
from harness.outcome import LOADING_CASES, Cause, Kind, Status, cause_of
from harness.sanitize import PASS_NAME
from grader import class_state
from grader.fingerprints import hidden_fingerprint, kit_fingerprint
from grader.rubric import RUBRIC, parse_tasks

FLAGS = ("not_built", "timed_out", "sanitizer", "own_work", "tampering", "machine")
SPEEDUPS = (4, 5)  # the tasks with performance points: their speed against the reference, per student
COLUMNS = ("student", *(f"task{t}" for t in RUBRIC), "total", *FLAGS, "problem", "superseded",
           *(f"task{t}_speedup" for t in SPEEDUPS), "seconds")


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def task_entries(folder: Path) -> dict[int, dict]:
    """Each graded task's entry (the grader's graded/taskN.json): status, summary and the test's record."""
    found = {}
    for task in RUBRIC:
        saved = _json(folder / "graded" / f"task{task}.json")
        if isinstance(saved, dict) and isinstance(saved.get("entry"), dict):
            found[task] = saved["entry"]
    return found


# the flag a cause of failure raises (harness/outcome.py)
CAUSE_FLAGS = {Cause.TIMED_OUT: "timed_out", Cause.MALFORMED: "tampering", Cause.INFRASTRUCTURE: "machine"}


def task_flags(task: int, entry: dict) -> set[str]:
    record = entry.get("record") or {}
    failed = [c for c in record.get("cases", []) if isinstance(c, dict) and not c.get("passed")]
    flags = set()
    if entry.get("status") in (Status.CRASHED, Status.NOT_GRADED) and cause_of(entry):
        flags.add(CAUSE_FLAGS[cause_of(entry)])
    for case in failed:
        cause = cause_of(case)
        if case.get("name") in LOADING_CASES and cause != Cause.TIMED_OUT:
            flags.add("not_built")  # (code that hangs while it is imported is timed_out, below)
        elif case.get("name") == PASS_NAME:
            flags.add("sanitizer")
        elif case.get("kind") == Kind.RULE:
            flags.add("own_work")
        if cause:
            flags.add(CAUSE_FLAGS[cause])
    return flags


def _speedup(entry: dict | None) -> float | None:
    cases = ((entry or {}).get("record") or {}).get("cases", [])
    ratios = [c["metrics"][VS_REFERENCE] for c in cases if isinstance(c, dict) and c.get("kind") == Kind.BENCHMARK
              and isinstance(c.get("metrics"), dict) and isinstance(c["metrics"].get(VS_REFERENCE), (int, float))]
    return sum(ratios) / len(ratios) if ratios else None


def student_row(out: Path, sid: str) -> dict:
    folder = out / "students" / sid
    row = dict.fromkeys(COLUMNS, "") | {"student": sid}
    flags: dict[str, set] = {f: set() for f in FLAGS}
    results, error, about = _json(folder / "results.json"), _json(folder / "error.json"), _json(folder / "grading.json")
    if isinstance(about, dict):
        if about.get("tampering"):
            flags["tampering"].add("all")
        row["seconds"] = about.get("seconds", "")
    if isinstance(results, dict):
        for test in results.get("tests", []):
            task = int(test["name"].split(":")[0].split()[-1]) if test["name"].startswith("Task ") else None
            if task in RUBRIC:
                row[f"task{task}"] = f"{test['score']:g}"
        row["total"] = f"{results.get('score', 0):g}"
        entries = task_entries(folder)
        for task, entry in entries.items():
            for flag in task_flags(task, entry):
                flags[flag].add(str(task))
            if entry.get("status") == Status.NOT_GRADED:  # no grade either way: not a 0 (grader/machine.py)
                row[f"task{task}"] = "not graded"
        for task in SPEEDUPS:
            ratio = _speedup(entries.get(task))
            row[f"task{task}_speedup"] = f"{ratio:.3f}" if ratio is not None else ""
        failed_regrade = _json(folder / "regrade-failed.json")
        if isinstance(failed_regrade, dict):
            row["problem"] = f"a regrade failed ({failed_regrade.get('error')}); this is the earlier grade"
    elif isinstance(error, dict):
        row["total"], row["problem"] = "0", str(error.get("error", ""))
        if cause_of(error) == Cause.TIMED_OUT:
            flags["timed_out"].add("all")
    mine = class_state.last_round(out, sid)
    stopped = [a for a in mine if str(a.get("outcome", "")).startswith("stopped")]
    if mine and mine[-1].get("never_started"):
        row["problem"] = f"{mine[-1]['outcome']}; not graded (run grader.batch again to grade it)"
        if isinstance(results, dict):
            row["problem"] += "; this is the earlier grade"
    elif mine and mine[-1] in stopped:  # the last grading was stopped from outside (Slurm, a kill)
        last = mine[-1]["outcome"]
        if isinstance(results, dict):
            row["problem"] = f"a regrade was {last}; this is the earlier grade"
        elif len(stopped) >= class_state.TRIES:
            row["total"], row["problem"] = "0", f"{last}, {len(stopped)} times; not graded"
        elif mine[-1].get("job") == "local":
            row["problem"] = f"{last}; not graded yet (run grader.batch again to grade it)"
        else:
            row["problem"] = f"{last}; not graded yet (the gather job sends it once more)"
        if any(a.get("state") == "TIMEOUT" for a in stopped):
            flags["timed_out"].add("all")
    elif not row["total"]:
        row["problem"] = "not graded yet"
    elif flags["machine"]:
        again = isinstance(about, dict) and about.get("machine_tries", 1) < class_state.TRIES
        row["problem"] = (f"task {', '.join(sorted(flags['machine']))} could not be graded on the machine (GPU memory "
                          "held by other processes): " + ("run grader.batch again to grade it" if again else
                                                           f"{class_state.TRIES} gradings in a row; grade it on a "
                                                           "free GPU (grader.batch --only)"))
    if isinstance(about, dict) and about.get("missing") and not row["problem"]:
        row["problem"] = f"missing from the submission: {', '.join(map(str, about['missing']))}"
    for flag, where in flags.items():
        row[flag] = "all" if "all" in where else " ".join(sorted(where, key=int))
    return row


def rows(out: Path, klass: dict) -> list[dict]:
    """A row per student; `superseded` names the earlier uploads of the LMS export that the graded one replaced."""
    return [student_row(out, s["id"]) | {"superseded": "; ".join(s.get("superseded", []))} for s in klass["students"]]


def write(out: Path, klass: dict) -> Path:
    path = out / "gradebook.csv"
    part = path.with_name(path.name + ".part")
    with open(part, "w", newline="", errors="backslashreplace") as f:  # an id may not be UTF-8
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows(out, klass))
    part.replace(path)
    return path


def write_books(out: Path) -> None:
    """DIR/gradebook.csv and DIR/report.md, from the students' folders as they are now."""
    klass = class_state.load_class(out)
    print(f"wrote {write(out, klass)} and {report(out, klass)}")


# -- the report ---------------------------------------------------------------------------------

def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def report(out: Path, klass: dict) -> Path:
    book = rows(out, klass)
    tasks = _graded_tasks(klass)
    possible = sum(RUBRIC[t].points for t in tasks)  # out of what the class was graded on, not the course
    graded = [r for r in book if _number(r["total"]) is not None]
    totals = [float(r["total"]) for r in graded]
    abouts = [_json(out / "students" / r["student"] / "grading.json") for r in book]
    abouts = [a for a in abouts if isinstance(a, dict)]
    lines = ["# Class report", "",
             "Written by `python -m grader.batch`; rebuilt from the students' folders each time.", "",
             f"- Students: {len(book)}; with a total: {len(graded)} (a grading that failed counts 0); "
             f"without one yet: {len(book) - len(graded)}",
             f"- Tasks graded: {klass.get('tasks')}",
             *_task_sets(abouts),
             *_fingerprints(abouts, hidden_fingerprint(), kit_fingerprint()[:16])]
    seconds = [float(a["seconds"]) for a in abouts if isinstance(a.get("seconds"), (int, float))]
    if seconds:
        lines.append(f"- Time per grading: median {statistics.median(seconds) / 60:.1f} min, longest "
                     f"{max(seconds) / 60:.1f} min, {sum(seconds) / 3600:.2f} h in all")
    if totals:
        lines += ["", f"## Totals (out of {possible:g})", "",
                  f"Mean {statistics.mean(totals):.2f}, median {statistics.median(totals):.2f}, "
                  f"lowest {min(totals):g}, highest {max(totals):g}.", "", "| points | students |", "|---|---|"]
        step = 2 if possible > 10 else 1 if possible > 4 else 0.5
        for i in range(math.ceil(possible / step)):
            low, high = i * step, min((i + 1) * step, possible)
            last = high == possible  # the last bin holds full marks too
            n = sum(low <= t < high or (last and t == possible) for t in totals)
            lines.append(f"| [{low:g}, {high:g}{']' if last else ')'} | {'█' * n} {n} |")
        if above := sum(t > possible for t in totals):  # an earlier grade, kept, from other tasks
            lines.append(f"| more: graded on other tasks | {'█' * above} {above} |")
    lines += ["", "## Points per task", "", "| task | points | mean | full marks | zero |", "|---|---|---|---|---|"]
    for task in tasks:
        rubric = RUBRIC[task]
        scored = [p for r in graded if (p := task_points(r, task)) is not None]
        if scored:
            lines.append(f"| {task}. {rubric.title} | {rubric.points:g} | {statistics.mean(scored):.2f} | "
                         f"{sum(s == rubric.points for s in scored)} | {sum(s == 0 for s in scored)} |")
    lines += ["", "## Flags", "", "| flag | students |", "|---|---|"]
    for flag in FLAGS:
        who = [f"{r['student']} ({r[flag]})" for r in book if r[flag]]
        lines.append(f"| {flag} | {', '.join(who) or 'none'} |")
    problems = [r for r in book if r["problem"]]
    if problems:
        lines += ["", "## Problems", "", *[f"- {r['student']}: {r['problem']}" for r in problems]]
    for task in SPEEDUPS:
        ratios = [float(r[f"task{task}_speedup"]) for r in book if r[f"task{task}_speedup"]]
        if ratios:
            lines += ["", f"Task {task}, speed against the reference timed in the same run: median "
                      f"{statistics.median(ratios):.2f}x, {min(ratios):.2f}x to {max(ratios):.2f}x "
                      f"({len(ratios)} students)."]
    pictures = plots(out / "plots", book, tasks)
    lines += ["", "## Plots", ""]
    lines += ([f"![{p.stem}](plots/{p.name})" for p in pictures] if pictures is not None else
              ["No plots: matplotlib is not installed (`pip install matplotlib`, then `python -m grader.batch gather "
               f"{out}`)."])
    path = out / "report.md"
    part = path.with_name(path.name + ".part")
    part.write_text("\n".join(lines) + "\n", errors="backslashreplace")
    part.replace(path)
    return path


def task_points(row: dict, task: int) -> float | None:
    """A task's points in a gradebook row: 0 where the whole grading failed (a refused archive), None where
    the task was not graded."""
    if row[f"task{task}"] != "":
        return float(row[f"task{task}"])
    return 0.0 if row["total"] == "0" and row["problem"] else None


def _task_sets(abouts: list[dict]) -> list[str]:
    """A line when the students were not all graded on the same tasks (a grade kept from another --tasks)."""
    sets = Counter(str(a["tasks"]) for a in abouts if a.get("tasks"))
    if len(sets) < 2:
        return []
    return ["- **Graded on mixed task sets**: " + ", ".join(f"tasks {t} ({n} students)" for t, n in sets.most_common())
            + ": the totals do not compare; grade the class again on one set (`--regrade`)"]


def _fingerprints(abouts: list[dict], hidden_now: str, kit_now: str) -> list[str]:
    """Which hidden cases and kit the gradings used: one value each shows the whole class was graded alike."""
    lines = []
    for key, now, what in (("hidden", hidden_now, "Hidden cases (grader/hidden.py, sha256)"),
                           ("kit", kit_now, "Kit code (tests, checks, grader, reference; sha256)")):
        used = sorted({str(a.get(key)) for a in abouts})
        if len(used) <= 1:
            lines.append(f"- {what}: {used[0] if used else now}"
                         + ("" if not used or used[0] == now else f" (this checkout now: {now})"))
        else:
            counts = {u: sum(str(a.get(key)) == u for a in abouts) for u in used}
            lines.append(f"- {what}: MIXED, " + ", ".join(f"{u} ({n} gradings)" for u, n in counts.items())
                         + f"; this checkout: {now}. Regrade with --regrade to grade everyone alike.")
    return lines


def _graded_tasks(klass: dict) -> list[int]:
    try:
        return parse_tasks(str(klass.get("tasks")))
    except ValueError:  # an older or edited class.json: the whole course
        return list(RUBRIC)


def plots(folder: Path, book: list[dict], tasks: list[int]) -> list[Path] | None:
    """PNG plots of the class, when matplotlib is installed; None otherwise."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    made = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        made.append(folder / name)

    possible = sum(RUBRIC[t].points for t in tasks)
    totals = [float(r["total"]) for r in book if _number(r["total"]) is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(totals, bins=[*range(0, math.ceil(possible)), possible])  # the last bin holds full marks
    ax.set(xlabel=f"total points (of {possible:g})", ylabel="students", title="Totals", xlim=(0, possible))
    save(fig, "totals.png")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    means = [statistics.mean([p for r in book if (p := task_points(r, t)) is not None] or [0]) for t in tasks]
    ax.bar([str(t) for t in tasks], [RUBRIC[t].points for t in tasks], color="0.85", label="points")
    ax.bar([str(t) for t in tasks], means, label="class mean")
    ax.set(xlabel="task", ylabel="points", title="Points per task")
    ax.legend()
    save(fig, "tasks.png")
    for task in SPEEDUPS:
        ratios = [float(r[f"task{task}_speedup"]) for r in book if r[f"task{task}_speedup"]]
        if ratios:
            fig, ax = plt.subplots(figsize=(6, 3.5))
            ax.hist(ratios, bins=20)
            ax.axvline(1.0, color="k", lw=1)
            ax.set(xlabel="speed / the reference's (same run)", ylabel="students", title=f"Task {task} speed")
            save(fig, f"task{task}_speedup.png")
    return made
