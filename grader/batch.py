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
is graded 0 with the reason in the gradebook, never left out; two entries with one id (alice.zip
and alice/) are one student whose row names both until one is removed. Each submission is graded exactly as
`python -m grader --submission` grades it (its own process, the trusted harness, the hidden cases).

Nothing is lost or mixed up:
- the student's checkout is found where students put it: the folder holding the files students
  write at their places (task1/attention.py, ...), at any depth, in the submission or in the one
  archive it holds (an LMS keeps the uploaded zip in the student's folder); two such folders, or
  none (saying so when the files lie only in SKIPPED folders), is a problem the gradebook states;
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
  the --regrade it belongs to, whether it ran in the sandbox): a rerun grades the students without a
  grade for the class's tasks, those whose files changed since (it says who), those graded with
  --no-sandbox once the class is graded in the sandbox, and, after an interrupted --regrade, those
  that regrade had not reached yet; a rerun with other --tasks than the class's is refused without
  --regrade, so a forgotten --tasks never starts the whole class again;
- the gradebook and report are rebuilt from the students' folders each time (grader/gradebook.py).

This file is the command line; each part has one job, and none imports the command line:
grader/submissions.py (the entries, unpacked, and the checkout in them), grader/class_state.py
(class.json, the attempts, whether a grade is done), grader/grading.py (grading one submission and
committing it; the local loop, a Slurm element, the prebuild), grader/slurm.py (the jobs),
grader/gather.py (the gather job), grader/gradebook.py (the gradebook and the report).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

from grader import class_state, gather, gradebook, grading, slurm, submissions
from grader.rubric import RUBRIC, parse_tasks

SLACK_S = 600  # a grading's time beyond its tasks' own limits: starting up, building, writing results


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gather"]:
        return gather.main(argv[1:])
    if argv[:1] == ["prebuild"]:
        parser = argparse.ArgumentParser(prog="python -m grader.batch prebuild")
        parser.add_argument("out", type=Path)
        return grading.prebuild(parser.parse_args(argv[1:]).out)
    if argv[:1] == ["element"]:
        parser = argparse.ArgumentParser(prog="python -m grader.batch element")
        parser.add_argument("out", type=Path)
        parser.add_argument("--index", type=int, help="the student's place in class.json (SLURM_ARRAY_TASK_ID)")
        args = parser.parse_args(argv[1:])
        return grading.element(args.out, args.index)

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
    before = class_state.json_or_none(args.out / "class.json")
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
    students = submissions.discover(args.submissions)
    ids = {sid for sid, _ in students}
    only = {part.strip() for value in args.only or [] for part in ([value] if value in ids else value.split(","))
            if part.strip()}
    if unknown := sorted(only - ids):
        parser.error(f"--only: no submission for {', '.join(unknown)} in {args.submissions}")
    args.out.mkdir(parents=True, exist_ok=True)
    regrade = uuid.uuid4().hex[:12] if args.regrade and not only else before.get("regrade")
    klass = class_state.write_class(args.out, students, tasks_text, args.timeout, args.no_sandbox, regrade,
                                    submissions.superseded(args.submissions))
    states = {sid: class_state.grade_state(args.out, sid, source, klass) for sid, source in students}
    todo = [n for n, (sid, _) in enumerate(students) if sid in only or not only and states[sid] != "graded"]
    print(f"{len(students)} submissions, {len(todo)} to grade"
          + ("" if only else f" ({len(students) - len(todo)} graded already, for tasks {klass['tasks']})"))
    for state, words in (("changed", "files changed since their grade"), ("tasks", "graded on other tasks before"),
                         ("sandbox", "graded without the sandbox (--no-sandbox) before"),
                         ("regrade", "not yet graded again by the --regrade"),
                         ("machine", "a task the machine could not grade (GPU memory held by other processes)")):
        who = [sid for sid, _ in students if states[sid] == state and (not only or sid in only)]
        if who:
            print(f"  {words}: {', '.join(who[:20])}{' ...' if len(who) > 20 else ''}")
    if args.slurm:
        return slurm.submit(args, args.out, todo)
    try:
        if todo:
            grading.prebuild(args.out)
        grading.grade_locally(args.out, klass, todo)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback; what was graded is kept
        gradebook.write_books(args.out)
        print(f"\nstopped (Ctrl-C). The students graded so far are kept in {args.out}/gradebook.csv; run the same "
              "command again to grade the rest.", file=sys.stderr)
        return 130
    gradebook.write_books(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
