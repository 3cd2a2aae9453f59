"""Tuning a kernel file's constants: one copy of the file per configuration, each built on its own.

`python -m task4.tune` and `python -m task5.tune` (see `main`): every configuration is built side
by side, each in a worker of its own (harness/sandbox.py: a configuration that crashes or hangs is
its row's reason, not the end of the run), then checked on a few of `taskN.test`'s edge cases and
timed at the course's standard size, one at a time, with the test's clock and timed-output checks. One row
per configuration: registers, spills, shared memory, threads and blocks per SM, time, throughput
and its share of the GPU's limit; the fastest correct one is marked and its lines printed to
paste into the kernel file; the rows go to a CSV (and a plot when matplotlib is installed).
A kernel file's tunables and its configurations, compiled without a GPU: harness/kernel_configs.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from common import build, nvcc, resources
from common.resources import KernelResources
from harness.kernel_configs import (build_configs, config_text, configure, first_error, parse_config, paste_lines,
                                    tunables)


# -- timing each configuration on the GPU (python -m taskN.tune) ----------------------------------

@dataclass
class Measured:
    """What a task's `measure(worker)` found for one configuration."""

    error: str | None = None  # wrong on a check, or could not be timed: the row's reason
    ms: float | None = None
    throughput: float | None = None  # TFLOP/s (task 4) or GB/s (task 5)
    share: float | None = None  # percent of the physical limit (FFMA peak, copy bandwidth)


@dataclass
class Row:
    number: int
    config: dict[str, int]
    error: str | None = None
    kernel: KernelResources | None = None  # the timed kernel's resources (ptxas)
    occupancy: dict[str, int] = field(default_factory=dict)  # common/occupancy.py's figures for it
    measured: Measured | None = None
    also: list[str] = field(default_factory=list)  # Plan.also's lines (row #1 only)

    @property
    def ok(self) -> bool:
        return self.error is None and self.measured is not None and self.measured.error is None


@dataclass
class Plan:
    """A task's tuning: where its kernel lives, which kernel is timed, and how (see checks/task4/tune.py)."""

    task: int
    kernel_file: str  # the student's file, e.g. task4/kernels/attention.cu
    timed_kernel: object  # demangled name of the kernel the timed case runs, e.g. flash_attention_kernel<128>, or
    # callable(every constant's value) -> that name, where the constants pick the template instance
    what: str  # the timed case in words
    unit: str  # "TFLOP/s" or "GB/s"
    limit: str  # what `share` is a percentage of
    configs: list[dict[str, int]]  # the default list
    measure: object  # callable(worker) -> Measured, run in this (trusted) process against the worker
    also: object = None  # callable(worker) -> lines, run on the file as it is (#1) after its measure: more timings
    part: str = ""  # an optional part's plan: what --<its flag> tunes, in words ("the optional bf16/fp16 kernel")

    def kernel_name(self, values: dict[str, int]) -> str:
        return self.timed_kernel(values) if callable(self.timed_kernel) else self.timed_kernel


def _config_dir(root: Path, task: int, kernel_file: str, text: str, student_dir: Path, solution: bool) -> Path:
    """A checkout-shaped folder with the student files the task's worker loads, the kernel file configured."""
    from common.impl import source_of
    from common.tasks import TASKS

    folder = root / "student"
    for used in (task, *TASKS[task].uses):
        for rel in TASKS[used].student_files:
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            source = source_of(rel, student_dir, solution)
            if rel == kernel_file:
                target.write_text(text)
            elif source.is_file():
                target.write_bytes(source.read_bytes())
    return folder


def _start(row: Row, worker, scratch: Path, timed_kernel: str):
    """Build one configuration in its spawned worker (in a thread: the builds run side by side)."""
    from harness.sandbox import WorkerDied, WorkerError

    try:
        worker.handshake()
    except (WorkerError, WorkerDied) as err:
        message = err.message if isinstance(err, WorkerError) else str(err)
        row.error = first_error(message)
        worker.__exit__(None, None, None)
        return None
    row.kernel = built_kernel(scratch, timed_kernel)
    return worker


def built_kernel(scratch: Path, name: str) -> KernelResources | None:
    """What ptxas said of kernel `name` in the newest build under scratch/worker-builds that has it (each object's
    .ptxas: a task's two kernel files build one after the other, so the newest report may be the other file's).

    One folder per configuration's text, so the newest is this one's. The worker could write anything
    there: the figures are only shown, never scored, and a file that is not a small regular one is skipped.
    """
    for ptxas in sorted((scratch / "worker-builds").rglob("*.ptxas"), key=lambda p: p.lstat().st_mtime, reverse=True):
        if ptxas.is_file() and not ptxas.is_symlink() and ptxas.stat().st_size < 1 << 20:
            kernels = resources.demangle(resources.parse_ptxas(ptxas.read_text(errors="replace")))
            found = next((k for k in kernels if k.name == name), None)
            if found is not None:
                return found
    return None


def _occupancy(worker, kernel: KernelResources | None) -> dict[str, int]:
    if kernel is None or not kernel.symbol:
        return {}
    try:
        found = worker.call("occupancy", [kernel.symbol])
    except Exception:  # noqa: BLE001  a figure we could not get is left out, not guessed
        return {}
    row = found.get(kernel.symbol) if isinstance(found, dict) else None
    if not isinstance(row, dict):
        return {}
    return {k: int(v) for k, v in row.items() if isinstance(k, str) and isinstance(v, int) and 0 <= v < 1 << 40}


def run(plan: Plan, configs: list[dict[str, int]], *, student_dir: Path, solution: bool, source: Path, root: Path,
        jobs: int, say=print) -> list[Row]:
    """Every configuration built (side by side, `jobs` at a time), then checked and timed one at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from harness.sandbox import Worker

    text = source.read_text()
    rows = [Row(n + 1, config) for n, config in enumerate(configs)]
    spawned, started = {}, {}
    try:
        for row in rows:  # spawned here, in the thread that outlives them (see Worker.spawn)
            try:
                configured = configure(text, row.config)
            except ValueError as err:
                row.error = str(err)
                continue
            # a folder per configuration's text: its cached build is found again, and holds nothing else
            scratch = root / hashlib.sha256(configured.encode()).hexdigest()[:16]
            folder = _config_dir(scratch, plan.task, plan.kernel_file, configured, student_dir, solution)
            spawned[row.number] = (Worker(plan.task, folder, scratch=scratch, purpose="tune"), scratch)
            spawned[row.number][0].spawn()
    except BaseException:
        for worker, _ in spawned.values():
            worker.__exit__(None, None, None)
        raise

    def prepare(row: Row):
        worker, scratch = spawned[row.number]
        if _start(row, worker, scratch, plan.kernel_name(tunables(text) | row.config)) is not None:
            started[row.number] = worker

    jobs = max(1, jobs)
    say(f"building {len(spawned)} configurations, {jobs} at a time ...")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(prepare, [row for row in rows if row.number in spawned]))
    for row in rows:
        worker = started.get(row.number)
        if worker is None:
            say(f"  #{row.number} {config_text(row.config)}: {row.error}")
            continue
        try:
            row.measured = plan.measure(worker)
            row.occupancy = _occupancy(worker, row.kernel)
            if plan.also and row.number == 1 and row.ok:
                # the extra timings fail alone, however they fail: the row keeps its own
                what = ((plan.also.__doc__ or "").strip().splitlines() or ["the timings beside"])[0]
                say(f"  #1 (the file as it is): {what} ...")
                try:
                    row.also = plan.also(worker)
                except Exception as err:  # noqa: BLE001
                    row.also = [f"{what}: not measured ({type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else ''})"]
        except Exception as err:  # noqa: BLE001  a crash or hang of one configuration is its row's reason
            row.measured = Measured(error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        finally:
            worker.__exit__(None, None, None)
        m = row.measured
        say(f"  #{row.number} {config_text(row.config)}: " + (m.error or f"{m.ms:.3f} ms, {m.throughput:.1f} {plan.unit}"))
    return rows


def best(rows: list[Row]) -> Row | None:
    timed = [r for r in rows if r.ok]
    return min(timed, key=lambda r: r.measured.ms) if timed else None


def table(plan: Plan, rows: list[Row], names: list[str]) -> list[str]:
    """The rows as text, one per configuration, the fastest correct one marked."""
    top = best(rows)
    kernel = plan.kernel_name(rows[0].config) if rows else ""
    which = f"{kernel}" if not callable(plan.timed_kernel) else f"the kernel each row runs (#1: {kernel})"
    lines = [f"configuration = {', '.join(names)}; figures for {which}; timed: {plan.what}",
             f"  {'#':>2}  {'configuration':<22} {'regs':>4} {'spills (B)':>10} {'smem/block':>10} {'threads':>7} "
             f"{'blocks/SM':>9}  {'time':>10} {plan.unit:>8} {'% ' + plan.limit:>14}"]
    for r in rows:
        values = ",".join(str(r.config.get(n, "?")) for n in names)
        mark = "*" if r is top else " "
        k, occ = r.kernel, r.occupancy
        regs = str(k.registers) if k else "-"
        spills = (f"{k.spill_stores}/{k.spill_loads}" if k.spills else "0") if k else "-"
        smem = occ.get("static_shared", 0) + occ.get("dynamic_shared", 0) if occ else None
        smem_text = f"{smem / 1024:.1f} KB" if smem is not None else "-"
        threads = str(occ["threads"]) if "threads" in occ else "-"
        blocks = str(occ["blocks_per_sm"]) if "blocks_per_sm" in occ else "-"
        m = r.measured
        if r.error or m is None or m.error:
            tail = f"  {r.error or (m.error if m else 'not run')}"
        else:
            tail = f"  {m.ms:>7.3f} ms {m.throughput:>8.1f} {m.share:>13.0f}%"
        lines.append(f"{mark} {r.number:>2}  {values:<22} {regs:>4} {spills:>10} {smem_text:>10} {threads:>7} "
                     f"{blocks:>9}{tail}")
    lines.append("  (spills: bytes stored/loaded per thread; smem: static shared memory + the dynamic shared memory "
                 "the launcher allowed before launching; blocks/SM: what the GPU can hold at once, from the CUDA "
                 "occupancy API; -: not known)")
    return lines


def write_csv(path: Path, plan: Plan, rows: list[Row], names: list[str]) -> None:
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["number", *names, "registers", "spill_stores", "spill_loads", "shared_bytes", "threads",
                         "blocks_per_sm", "correct", "ms", plan.unit, f"percent_{plan.limit.replace(' ', '_')}",
                         "reason"])
        for r in rows:
            k, occ, m = r.kernel, r.occupancy, r.measured
            smem = occ.get("static_shared", 0) + occ.get("dynamic_shared", 0) if occ else None
            writer.writerow([r.number, *(r.config.get(n) for n in names), k.registers if k else None,
                             k.spill_stores if k else None, k.spill_loads if k else None, smem, occ.get("threads"),
                             occ.get("blocks_per_sm"), r.ok, m.ms if m else None, m.throughput if m else None,
                             m.share if m else None, r.error or (m.error if m else None)])


def plot(path: Path, plan: Plan, rows: list[Row], names: list[str], title: str) -> Path | None:
    """A bar per configuration (its throughput), when matplotlib is installed; None otherwise."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    top = best(rows)
    labels = [f"#{r.number}\n" + ",".join(str(r.config.get(n, "?")) for n in names) for r in rows]
    values = [r.measured.throughput if r.ok else 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    bars = ax.bar(range(len(rows)), values, color=["C2" if r is top else "C0" for r in rows])
    for bar, r in zip(bars, rows):
        if not r.ok:
            ax.text(bar.get_x() + bar.get_width() / 2, 0, "failed", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel(plan.unit)
    ax.set_title(f"{title}\n({', '.join(names)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(plan: Plan, argv=None, **optional: Plan) -> int:
    """`python -m taskN.tune`; `optional`: the plans of the task's optional parts by flag (half=... is taken with
    --half), each tuning its own kernel file and writing taskN-<flag>-tune.csv."""
    import argparse
    import os

    import torch

    from common.impl import REPO, add_solution_flag, label, source_of

    parser = argparse.ArgumentParser(prog=f"python -m task{plan.task}.tune",
                                     description=f"Build, check and time task {plan.task}'s kernel at several "
                                                 "configurations of its constants.")
    parser.add_argument("--configs", nargs="+", metavar="NAME=N,...",
                        help="your own configurations, each NAME=NUMBER pairs separated by commas (names not given "
                             "keep the file's value); default: a list that covers the usual choices")
    add_solution_flag(parser, plan.task, "tune the reference solution instead of your code",
                      f"python -m task{plan.task}.tune tunes your own kernel")
    for flag, other in optional.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag, action="store_true",
                            help=f"tune {other.part} ({other.kernel_file})")
    parser.add_argument("--student-dir", type=Path, default=REPO, metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--build-only", action="store_true",
                        help="only compile each configuration: registers, spills, or why it does not build (no GPU)")
    parser.add_argument("--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                        help="configurations built at once (default: half the CPU cores, at most 8)")
    parser.add_argument("--csv", type=Path, help=f"where the rows go (default: task{plan.task}-tune.csv"
                        + "".join(f", task{plan.task}-{flag.replace('_', '-')}-tune.csv with --{flag.replace('_', '-')}"
                                  for flag in optional) + ")")
    args = parser.parse_args(argv)
    chosen = [flag for flag in optional if getattr(args, flag)]
    if len(chosen) > 1:
        print(f"task {plan.task}: {' and '.join('--' + f for f in chosen)}: one optional part at a time")
        return 2
    plan = optional[chosen[0]] if chosen else plan
    args.csv = args.csv or Path(f"task{plan.task}-{chosen[0].replace('_', '-') + '-' if chosen else ''}tune.csv")

    source = source_of(plan.kernel_file, args.student_dir, args.solution)
    text = source.read_text()
    names = list(tunables(text))
    try:
        configs = [parse_config(spec) for spec in args.configs] if args.configs else plan.configs
        for config in configs:
            configure(text, config)  # unknown names: say so before anything is built
    except ValueError as err:
        print(f"task {plan.task}: {err}")
        return 2
    configs = _distinct([{}] + configs, tunables(text))
    names = [n for n in names if any(n in c for c in configs)]  # the knobs turned (not, say, MAX_HEAD_DIM)
    print(f"task {plan.task} ({label(args.solution)}): tuning {plan.kernel_file}, {len(configs)} configurations "
          f"(#1 is the file as it is)")
    root = build.BUILD_ROOT / "tune" / f"task{plan.task}-{'solution' if args.solution else 'student'}"

    if args.build_only or not torch.cuda.is_available():
        if not args.build_only:
            print("no CUDA GPU is visible: only building each configuration (timing needs a GPU)")
        if nvcc.find_nvcc() is None:
            print(f"task {plan.task}: nvcc was not found: load your CUDA toolkit (for example `module load cuda`)")
            return 1
        arch = nvcc.cuda_arch(without_gpu="90")  # no GPU to ask: sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise
        for n, b in enumerate(build_configs(source, configs, root / "build-only", arch, jobs=args.jobs), 1):
            timed = plan.kernel_name(tunables(text) | b.config)
            kernel = next((k for k in b.kernels if k.name == timed), b.kernels[0] if b.kernels else None)
            said = b.error or (kernel.line() if kernel else "no kernels")
            print(f"  #{n} {config_text({k: v for k, v in (tunables(text) | b.config).items() if k in names})}: {said}")
        return 0

    rows = run(plan, configs, student_dir=args.student_dir, solution=args.solution, source=source, root=root,
               jobs=args.jobs)
    print(f"\n{torch.cuda.get_device_name()}:")
    rows = [_full(r, text) for r in rows]  # every constant's value, for the table, the CSV and the plot
    print("\n".join(table(plan, rows, names)))
    top = best(rows)
    if top is None:
        print(f"\nno configuration is correct: run `python -m task{plan.task}.test` and fix the checks first")
    else:
        m = top.measured
        print(f"\nfastest correct: #{top.number}, {m.ms:.3f} ms ({m.throughput:.1f} {plan.unit}, {m.share:.0f}% of "
              f"the {plan.limit}). To use it, set these lines in {plan.kernel_file}:")
        print("\n".join("  " + line for line in paste_lines(text, {n: v for n, v in (tunables(text) | top.config).items()
                                                                 if n in names})))
    if rows and rows[0].also:
        print("\n" + "\n".join(rows[0].also))
    write_csv(args.csv, plan, rows, names)
    print(f"wrote {args.csv}")
    title = f"task {plan.task} ({label(args.solution)}), {plan.what}, {torch.cuda.get_device_name()}"
    png = plot(args.csv.with_suffix(".png"), plan, rows, names, title)
    print(f"wrote {png}" if png else "matplotlib is not installed: no plot, only the CSV (pip install matplotlib for one)")
    return 0


def _distinct(configs: list[dict[str, int]], base: dict[str, int]) -> list[dict[str, int]]:
    """Each configuration once, by the values it gives every constant."""
    seen, kept = set(), []
    for config in configs:
        key = tuple(sorted((base | config).items()))
        if key not in seen:
            seen.add(key)
            kept.append(config)
    return kept


def _full(row: Row, text: str) -> Row:
    """The row with every constant's value (those it does not set are the file's)."""
    return Row(row.number, tunables(text) | row.config, row.error, row.kernel, row.occupancy, row.measured, row.also)

