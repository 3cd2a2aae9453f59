"""Grading a class on a Slurm cluster (`python -m grader.batch SUBMISSIONS --out DIR --slurm`).

Slurm does the scheduling, the waiting and the requeueing; nothing here polls:
- `sbatch DIR/slurm/prebuild.sh` when a CUDA task is graded: the reference extensions, built once
  on a GPU node (`python -m grader.batch prebuild DIR`); the array waits for it (afterany: were it
  to fail, each element builds them itself).
- `sbatch --array=I,J,...%MAX DIR/slurm/grade.sh`: one element per submission to grade, one GPU
  each, running `python -m grader.batch element DIR` (grader/grading.py; SLURM_ARRAY_TASK_ID picks
  the student from DIR/class.json). `--requeue` lets Slurm requeue an element itself after a node
  failure or a preemption.
- `sbatch --dependency=afterany:ARRAY DIR/slurm/gather.sh --requeue`: once every element has
  ended, however it ended, the gather job (grader/gather.py) sends the gradings that were stopped from outside (the
  time limit, a node failure, a preemption, scancel; each element logs its attempts in
  DIR/attempts) once more, as a new array with a gather job of its own, and writes the gradebook.
  The second gather records what was stopped twice, with Slurm's word for why (TIMEOUT,
  NODE_FAIL, PREEMPTED, CANCELLED, from `scontrol show job`).
- An element counts its own tries, so a student is graded at most class_state.TRIES times in a round,
  however often Slurm requeues it.

Why not submitit: it runs pickled Python functions and learns how a job ended from `sacct`, which
needs Slurm's accounting database (many department clusters, and the one-node cluster of our
tests, have none); without it a cancelled job never ends for submitit. Here every element writes its
own record, and the end of the array is a job dependency, so three `sbatch` calls are all we need.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import shutil
import os
import subprocess
import sys
import time
from pathlib import Path

from common.impl import REPO
from grader import class_state, gradebook, grading
from grader.rubric import RUBRIC

TEMPLATE = Path(__file__).with_name("slurm_job.sh")
PLACES = ("@SBATCH@", "@REPO@", "@COMMAND@")
CPUS = 8  # the default cores per element: a grading's tasks, their builds and checks run side by side (grader/schedule.py)


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Slurm (--slurm: one array job, an element per submission, then a gather job)")
    group.add_argument("--slurm", action="store_true", help="submit the class to Slurm instead of grading it here")
    group.add_argument("--partition", help="#SBATCH --partition")
    group.add_argument("--account", help="#SBATCH --account")
    group.add_argument("--time", type=int, metavar="MIN",
                       help="minutes per element (default: --timeout rounded up, and 5)")
    group.add_argument("--gres", help="#SBATCH --gres (default gpu:1 when a graded task needs a GPU)")
    group.add_argument("--cpus", type=int, help="#SBATCH --cpus-per-task (default 8, or the most a node of the "
                                                "partition has, if fewer: a grading's tasks run side by side)")
    group.add_argument("--mem", help="#SBATCH --mem, e.g. 64G (default: the partition's)")
    group.add_argument("--max-running", type=int, metavar="K", help="at most K elements at once (--array=...%%K)")
    group.add_argument("--sbatch", action="append", default=[], metavar="LINE",
                       help="another #SBATCH option, written with = (it starts with --): --sbatch=--qos=short; "
                            "repeat as needed")
    group.add_argument("--template", type=Path, default=TEMPLATE,
                       help=f"the job script's template (default {TEMPLATE.name})")
    group.add_argument("--dry-run", action="store_true", help="write the job scripts and show the sbatch commands only")


def check_options(parser: argparse.ArgumentParser, args) -> None:
    if not args.dry_run and shutil.which("sbatch") is None:
        parser.error("--slurm: sbatch was not found; run this on a Slurm login node (or add --dry-run)")
    if not args.template.is_file():
        parser.error(f"--template: {args.template} is not a file")
    missing = [p for p in PLACES if p not in args.template.read_text()]
    if missing:
        parser.error(f"--template: {args.template} lacks {', '.join(missing)} (see {TEMPLATE})")
    for line in args.sbatch:
        if not line.startswith("--") or "\n" in line:
            parser.error(f"--sbatch takes one sbatch option such as --qos=short, got {line!r}")
    if args.time is not None and args.time < 1:
        parser.error("--time: minutes, at least 1 (Slurm's time limits are whole minutes)")
    if args.cpus is not None and args.cpus < 1:
        parser.error("--cpus: at least 1")
    nodes = None if args.dry_run else node_sizes(partition_of(args))
    if args.cpus is None:
        args.cpus = min(CPUS, max((n[0] for n in nodes), default=CPUS)) if nodes else CPUS
    for problem in partition_problems(args, nodes):
        parser.error(problem)


UNKNOWN = "?"  # a partition chosen where this cannot read it (the template, or several): nothing is checked


def partition_of(args) -> str | None:
    """The partition the jobs go to: --partition, --sbatch=--partition=P, $SBATCH_PARTITION, or None (the
    cluster's default); UNKNOWN when the template chooses one, or several are named."""
    chosen = args.partition
    for line in args.sbatch:
        if line.startswith(("--partition=", "-p=")):
            chosen = line.split("=", 1)[1]
    chosen = chosen or os.environ.get("SBATCH_PARTITION")
    if re.search(r"^#SBATCH\s+(--partition|-p)\b", args.template.read_text(), re.M) or (chosen and "," in chosen):
        return UNKNOWN
    return chosen


def node_sizes(partition: str | None) -> list[tuple[int, int, str, int | None]] | None:
    """(CPUs, memory in MB, GRES, time limit in minutes or None) of each kind of node in the partition (the
    default one when None), as sinfo says; None when it cannot say (no cluster reachable, UNKNOWN)."""
    if partition == UNKNOWN:
        return None
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%P|%c|%m|%G|%l"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    sizes = []
    for line in proc.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5:
            continue
        name, cpus, mem, gres, limit = fields
        chosen = name.rstrip("*") == partition if partition else name.endswith("*")
        cpus, mem = re.match(r"\d+", cpus), re.match(r"\d+", mem)
        if chosen and cpus and mem:
            sizes.append((int(cpus[0]), int(mem[0]), gres, minutes_of(limit)))
    return sizes or None


def minutes_of(limit: str) -> int | None:
    """sinfo's time limit ("2:00:00", "1-00:00:00", "30:00" as minutes:seconds) in whole minutes; None when
    there is none ("infinite") or it cannot be read."""
    days, _, text = limit.strip().rpartition("-")
    parts = text.split(":")
    if not (days == "" or days.isdigit()) or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    numbers = [int(p) for p in parts]
    if days:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    else:  # [hours:]minutes:seconds, or minutes
        hours, minutes, seconds = ([0, 0] + numbers)[-3:] if len(numbers) > 1 else (0, numbers[0], 0)
    return int(days or 0) * 1440 + hours * 60 + minutes + (seconds > 0)


def megabytes(text: str) -> int | None:
    """--mem's value in MB (Slurm's units: K, M, G, T; M when none), or None when it is not one."""
    found = re.fullmatch(r"(\d+)([KMGT]?)B?", text.strip().upper())
    if not found:
        return None
    return int(found[1]) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 ** 2}[found[2]]


def partition_problems(args, nodes: list[tuple[int, int, str]] | None) -> list[str]:
    """What no node of the partition can give, so the jobs would pend forever (Slurm's reason: PartitionConfig)."""
    if not nodes:
        return []
    where = f"partition {partition_of(args)}" if partition_of(args) else "the default partition"
    most_cpus, most_mem = max(n[0] for n in nodes), max(n[1] for n in nodes)
    problems = []
    if args.cpus > most_cpus:
        problems.append(f"--cpus {args.cpus}: the nodes of {where} have at most {most_cpus} CPUs (sinfo), so the "
                        f"jobs would never start; ask for {most_cpus} or fewer")
    wanted = megabytes(args.mem) if args.mem else None
    if wanted is not None and wanted > most_mem:
        problems.append(f"--mem {args.mem}: the nodes of {where} have at most {most_mem} MB (sinfo), so the jobs "
                        "would never start")
    if args.gres and "gpu" in args.gres and not any("gpu" in n[2] for n in nodes):
        problems.append(f"--gres {args.gres}: no node of {where} has a GPU (sinfo)")
    limits = [n[3] for n in nodes if n[3] is not None]
    minutes = element_minutes(args)
    if limits and len(limits) == len(nodes) and minutes > max(limits):
        problems.append(f"--time {minutes} (minutes per element, by default the graded tasks' limits and 5): "
                        f"{where} allows at most {max(limits)} minutes a job (sinfo), so the jobs would never start; "
                        f"pass --time {max(limits)} (a grading still running then is stopped and recorded)")
    return problems


def sbatch_lines(args, out: Path, kind: str) -> list[str]:
    """The #SBATCH options of one of the scripts: "grade" (the array), "prebuild" or "gather"."""
    tasks = {int(t) for t in class_state.load_class(out)["tasks"].split(",")}
    gres = gres_of(args, out)
    per_grading = element_minutes(args)
    builds = len(grading.reference_builds(",".join(map(str, tasks))))
    # the prebuild asks for no more time than a grading, which the partition admits (a grading builds them too)
    minutes = {"grade": per_grading, "gather": 10,
               "prebuild": min(per_grading, math.ceil(grading.PREBUILD_TIMEOUT_S * builds / 60) + 5)}[kind]
    options = [f"--job-name={kind}-{out.resolve().name}",
               f"--output={out.resolve()}/slurm/logs/{'%x-%A_%a' if kind == 'grade' else '%x-%j'}.log",
               "--open-mode=append",  # a requeued element adds to its log instead of overwriting it
               f"--time={minutes}", f"--cpus-per-task={1 if kind == 'gather' else args.cpus}"]
    options += ["--requeue"] if kind == "grade" else []
    if kind != "gather":  # the gradings, and the build of the reference for the same GPUs
        options += ([f"--gres={gres}"] if gres else []) + ([f"--mem={args.mem}"] if args.mem else [])
    options += [f"--partition={args.partition}"] if args.partition else []
    options += [f"--account={args.account}"] if args.account else []
    options += args.sbatch  # a --qos or --reservation the cluster requires holds for every job
    return [f"#SBATCH {o}" for o in options]


def element_minutes(args) -> int:
    """An element's time limit: --time, or --timeout in minutes and 5."""
    return args.time or math.ceil(args.timeout / 60) + 5


def gres_of(args, out: Path) -> str:
    """--gres, or gpu:1 when a graded task needs a GPU."""
    tasks = {int(t) for t in class_state.load_class(out)["tasks"].split(",")}
    return args.gres if args.gres is not None else ("gpu:1" if any(RUBRIC[t].needs_cuda for t in tasks) else "")


SCRIPTS = {"grade": "element", "prebuild": "prebuild", "gather": "gather"}  # script -> grader.batch's command


def write_scripts(args, out: Path) -> dict[str, Path]:
    """DIR/slurm/grade.sh, gather.sh, and prebuild.sh when the class needs reference extensions."""
    folder = out / "slurm"
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    template = args.template.read_text()
    kinds = [k for k in SCRIPTS if k != "prebuild" or grading.reference_builds(class_state.load_class(out)["tasks"])]
    scripts = {}
    for kind in kinds:
        command = [sys.executable, "-m", "grader.batch", SCRIPTS[kind], str(out.resolve())]
        text = (template.replace("@SBATCH@", "\n".join(sbatch_lines(args, out, kind)))
                .replace("@REPO@", shlex.quote(str(REPO)))
                .replace("@COMMAND@", shlex.join(command) + (' "$@"' if kind == "gather" else "")))
        scripts[kind] = folder / f"{kind}.sh"
        scripts[kind].write_text(text)
        scripts[kind].chmod(0o755)
    if "prebuild" not in scripts:
        (folder / "prebuild.sh").unlink(missing_ok=True)  # from an earlier run of other tasks
    return scripts


def array_spec(indices: list[int], max_running: int | None) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (and "%K" to run at most K at once)."""
    parts, start = [], None
    for n, index in enumerate(indices):
        if start is None:
            start = index
        if n + 1 == len(indices) or indices[n + 1] != index + 1:
            parts.append(f"{start}" if start == index else f"{start}-{index}")
            start = None
    return ",".join(parts) + (f"%{max_running}" if max_running else "")


def sbatch(*args: str) -> str:
    """Submit; the job's id. SystemExit with sbatch's own words if it refuses."""
    proc = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"sbatch {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip().split(";")[0]


def submit_array(out: Path, todo: list[int], max_running: int | None, requeue: bool,
                 after: str | None = None) -> tuple[str, str]:
    """The array job for these students (after job `after`, if given), and a gather job after it; their ids."""
    grade, gather = out / "slurm" / "grade.sh", out / "slurm" / "gather.sh"
    wait = [f"--dependency=afterany:{after}"] if after else []
    array = sbatch(f"--array={array_spec(todo, max_running)}", *wait, str(grade))
    klass = class_state.load_class(out)  # which array each student's element is in: the gather asks Slurm about it
    klass.setdefault("array_of", {}).update({str(index): array for index in todo})
    class_state.write_json(out / "class.json", klass)
    try:
        gathered = sbatch(f"--dependency=afterany:{array}", str(gather), *(["--requeue"] if requeue else []))
    except SystemExit as err:
        raise SystemExit(f"{err}\nThe array job {array} was submitted; once it has ended, run "
                         f"python -m grader.batch gather {out}") from None
    return array, gathered


def submit(args, out: Path, todo: list[int]) -> int:
    klass = class_state.load_class(out)
    klass["todo"] = todo
    class_state.write_json(out / "class.json", klass)
    scripts = write_scripts(args, out)
    class_state.write_json(out / "slurm" / "options.json", {"max_running": args.max_running})
    if not todo:
        gradebook.write_books(out)
        return 0
    prebuild = scripts.get("prebuild")
    if args.dry_run:
        first = f"  sbatch {prebuild}\n" if prebuild else ""
        after = " --dependency=afterany:<the prebuild's job id>" if prebuild else ""
        print(f"wrote {', '.join(str(p) for p in scripts.values())}; to submit them:\n{first}"
              f"  sbatch --array={array_spec(todo, args.max_running)}{after} {scripts['grade']}\n"
              f"  sbatch --dependency=afterany:<the array's job id> {scripts['gather']} --requeue")
        return 0
    nodes = node_sizes(partition_of(args))
    if nodes and "gpu" in gres_of(args, out) and not any("gpu" in n[2] for n in nodes):
        where = partition_of(args) or "the default partition"
        raise SystemExit(f"--gres {gres_of(args, out)}: no node of {where} has a GPU (sinfo), and the graded tasks "
                         "need one: name a GPU partition with --partition")
    built = None
    if prebuild:
        try:
            built = sbatch(str(prebuild))
        except SystemExit as err:  # only a shortcut: the gradings build the reference themselves
            print(f"{err}\nThe gradings are submitted without it: each builds the reference kernels itself.")
    array, after = submit_array(out, todo, args.max_running, requeue=True, after=built)
    first = f"prebuild job {built} (the reference kernels), " if built else ""
    print(f"submitted {first}array job {array} ({len(todo)} elements) and gather job {after}, which runs when they "
          f"have all ended and writes {out / 'gradebook.csv'}.\n"
          f"Watch: squeue -j {','.join(filter(None, [built, array, after]))}; logs in {out / 'slurm' / 'logs'}; "
          f"the gradebook so far, at any time: python -m grader.batch gather {out}")
    time.sleep(PENDING_CHECK_S)  # Slurm gives a pending job its reason at its next scheduling pass
    for job, what in ((built, "prebuild job"), (array, "array job")):  # the array waits on the prebuild (Dependency)
        for reason in sorted(pending_reasons(job) & NEVER_CLEARS.keys()) if job else []:
            print(f"warning: {what} {job} is pending for {reason}: {NEVER_CLEARS[reason]}, which does not clear by "
                  f"itself. scancel {' '.join(filter(None, [built, array, after]))}, and submit again with other "
                  "options")
    return 0


PENDING_CHECK_S = 3
# squeue's reasons for a pending job that waiting never clears (squeue(1), JOB REASON CODES)
NEVER_CLEARS = {"PartitionConfig": "it asks for more than the partition's nodes have (CPUs, memory, GPUs, time)",
                "BadConstraints": "its constraints match no node", "PartitionNodeLimit": "it asks for more nodes than "
                "the partition allows", "PartitionTimeLimit": "its time limit is above the partition's",
                "InvalidAccount": "its account is not valid", "InvalidQOS": "its QOS is not valid",
                "QOSMaxCpuPerJobLimit": "it asks for more CPUs than its QOS allows a job",
                "AssocMaxCpuPerJobLimit": "it asks for more CPUs than its account allows a job"}


def pending_reasons(job: str) -> set[str]:
    """squeue's reasons for the job's pending elements; empty when Slurm cannot be asked."""
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job, "-t", "PD", "-o", "%r"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line.strip() for line in proc.stdout.splitlines() if line.strip()} if proc.returncode == 0 else set()
