"""Build and load a task's CUDA extension (JIT, cached, student and reference side by side).

`load_extension(task, solution)` builds the student's `taskN/kernels/*.cu` (or the
reference's `taskN/solution/kernels/*.cu`) in two stages, in `build/taskN-student` or
`build/taskN-solution`, so one process can load both:
1. each `.cu` file is compiled on its own with `nvcc -c` into an object named by a hash
   of the kernels folder, and held to common/kernel_rules.py (its headers, the symbols it
   imports) before anything from it runs (common/nvcc.py);
2. `taskN/binding.cpp` is compiled by PyTorch's loader and linked with those objects only.
   The loader compiles it from a copy inside the build folder (`src/`): ninja rebuilds
   whatever command changed, and the command names the source's path, so compiling it from
   each worker's own view (one per task and purpose) compiled the same binding again for
   every worker, about 20 s each on an H200.
Whatever goes wrong — no GPU, no nvcc, no ninja, a compiler error, a broken rule —
comes back as one `BuildError` whose message says what to do, with the full log kept
in the build folder.

Known traps handled here:
- a build killed half-way leaves `build/.../lock`, and torch's loader would wait
  for it forever: we hold our own `flock` while building (the kernel releases it
  when a process dies), so a torch lock found under it is stale and removed;
- ninja's default parallelism can exhaust memory on small machines: MAX_JOBS;
- building for every architecture is slow: TORCH_CUDA_ARCH_LIST is set to the
  GPU that is present.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from common.impl import REPO, add_solution_flag, label
from common.nvcc import (CUDA_FLAGS, BuildError, check_plain_cuda, check_toolchain, compile_each, file_target,
                         compile_kernels, compiler_errors, cpp_extension, cuda_arch, find_nvcc,
                         nvcc_version, checkout_path, resource_report, warnings_said)

# In the worker, KIT_BUILD_ROOT is a folder kept between runs, so an unchanged kernel is not rebuilt.
BUILD_ROOT = Path(os.environ.get("KIT_BUILD_ROOT") or REPO / "build")


def build_dir(task: int, solution: bool, kernels: str | None = None) -> Path:
    return BUILD_ROOT / f"task{task}-{'solution' if solution else 'student'}{f'-{kernels}' if kernels else ''}"


def kernel_folder(task: int, solution: bool, kernels: str | None = None) -> Path:
    """taskN/kernels, taskN/solution/kernels, or another kernels folder of the reference: taskN/solution/<kernels>."""
    if kernels and not solution:
        raise ValueError("only the reference has other kernels folders")
    return REPO / f"task{task}" / ("kernels" if not solution else f"solution/{kernels or 'kernels'}")


def kernel_sources(task: int, solution: bool, kernels: str | None = None) -> list[Path]:
    return sorted(kernel_folder(task, solution, kernels).glob("*.cu"))


# Optional kernel files (common/tasks.py's optional_files) left out of a student's build in this process: their
# path in the checkout -> why (the compiler's errors, or the kernel rule they break).
OPTIONAL_LEFT_OUT: dict[str, str] = {}


def compile_with_optional(task: int, solution: bool, sources: list[Path], folder: Path, arch: str,
                          flags: list[str], quiet: bool = False) -> list[Path]:
    """compile_kernels, except that a student's optional file (an optional part's) that fails to compile or breaks
    a kernel rule is left out of the build and recorded in OPTIONAL_LEFT_OUT: the task's own files still build,
    and the binding's weak symbol says the optional kernel is absent. The reference builds every file. The task's
    given kernels (GIVEN_KERNELS) compile at the same time (the linker takes the objects in any order)."""
    from common.tasks import TASKS

    optional = set() if solution or task not in TASKS else {Path(rel).name for rel in TASKS[task].optional_files}
    given = [REPO / rel for rel in GIVEN_KERNELS.get(task, [])]
    built = compile_each([*sources, *given], folder, arch, flags)
    objects = []
    for src in [*[s for s in sources if s.name not in optional], *given]:
        if isinstance(built[src], BuildError):
            raise built[src]
        objects.append(built[src])
    for src in [s for s in sources if s.name in optional]:
        rel = f"task{task}/kernels/{src.name}"
        if isinstance(built[src], BuildError):
            OPTIONAL_LEFT_OUT[rel] = str(built[src])
            if not quiet:
                print(f"task {task}: {rel} (an optional part) is left out of the build: "
                      f"{str(built[src]).splitlines()[0]}")
        else:
            objects.append(built[src])
            OPTIONAL_LEFT_OUT.pop(rel, None)
    return objects


def reference_build(task: int, arch: str, flags: list[str], kernels: str | None = None) -> Path:
    """Where the reference's extension is published once built: a name that changes with every input.

    A class's gradings (grader.batch) each import this file, read-only, instead of taking the build
    folder's lock and running ninja: it is built once, before them, by `python -m taskN.compile
    --solution`. The name is a hash of the sources (binding, common/csrc and its device library, the
    reference's kernels), the flags, the arch, nvcc's version, the host compiler, PyTorch and Python, so a
    changed input is never served a stale build.
    """
    host = shutil.which(os.environ.get("CXX", "c++"))
    digest = hashlib.sha256(f"{nvcc_version()}|{host and os.path.realpath(host)}|{arch}|{flags}|"
                            f"{torch.__version__}|{torch.version.cuda}|{sys.version}".encode())
    inputs = [REPO / "common" / "build.py", REPO / "common" / "nvcc.py", *(REPO / rel for rel in binding_files(task)),
              *sorted(kernel_folder(task, True, kernels).glob("*"))]
    for path in inputs:
        if path.is_file():
            digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    name = f"task{task}_solution{f'_{kernels}' if kernels else ''}"
    return BUILD_ROOT / "reference" / f"{name}-{digest.hexdigest()[:20]}.so"


# Where this process imported each extension from. Each build registers its operators under its name
# (common/csrc/operators.h), once a process: a second file of the same name would abort the process as it loads.
_LOADED_FROM: dict[str, Path] = {}


def _check_not_loaded_elsewhere(name: str, path: Path) -> None:
    earlier = _LOADED_FROM.get(name)
    if earlier is not None and earlier.resolve() != path.resolve():
        raise BuildError(f"{name} is already loaded in this process from {checkout_path(earlier)}; a process can "
                         "hold one build of it (its operators are registered under that name): load "
                         f"{checkout_path(path)} in a new process")


def _import_built(name: str, path: Path):
    import importlib.util

    _check_not_loaded_elsewhere(name, path)

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _LOADED_FROM[name] = path
    return module


def _publish(built: Path, published: Path) -> None:
    """Copy the new build to its published name (whole or not at all: other processes may read it now)."""
    published.parent.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(dir=published.parent, prefix=f".{published.name}.")  # unique on any node
    os.close(fd)
    try:
        shutil.copyfile(built, part)
        shutil.copymode(built, part)  # mkstemp's file is private; the gradings may run as other users
        os.replace(part, published)
    finally:
        if os.path.exists(part):
            os.unlink(part)


def load_extension(task: int, solution: bool, *, quiet: bool = False, extra_cuda_flags: list[str] | None = None,
                   verbose: bool = False, kernels: str | None = None):
    """Build (if needed) and import the task's extension; raises BuildError with a clear message.
    verbose: also print each kernel's registers, spills and shared memory. kernels: a folder of the
    reference's other kernel files with the same launcher (taskN/solution/<kernels>), built with the same binding."""
    load = cpp_extension().load

    sources = [REPO / f"task{task}" / "binding.cpp", *kernel_sources(task, solution, kernels)]
    missing = [str(s.relative_to(REPO)) for s in sources if not s.exists()]
    if missing or len(sources) < 2:
        folder = checkout_path(kernel_folder(task, solution, kernels))
        raise BuildError(f"task {task}: source files missing: {', '.join(missing) or f'no {folder}/*.cu'}")
    check_plain_cuda(sources[1:])
    check_toolchain()
    arch = cuda_arch()
    name = f"task{task}_{'solution' if solution else 'student'}{f'_{kernels}' if kernels else ''}"
    what = label(solution) + (f", {kernels.replace('_', ' ')}" if kernels else "")
    started = time.perf_counter()
    flags = CUDA_FLAGS + (extra_cuda_flags or [])
    published = reference_build(task, arch, flags, kernels) if solution else None
    if published and published.exists() and not verbose:  # verbose: the objects' ptxas reports
        try:
            module = _import_built(name, published)
        except ImportError:  # a copy from another machine or a torch since changed: build as usual
            pass
        else:
            if not quiet:
                print(f"task {task} ({what}): the prebuilt {checkout_path(published)}")
            return module
    folder = build_dir(task, solution, kernels)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", str(max(1, min(4, (os.cpu_count() or 2) // 2))))
    with open(folder / "build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # another process building the same extension: wait for it
        stale = folder / "lock"
        if stale.exists():
            stale.unlink()  # no live build holds it, or we would not hold the flock
        objects = compile_with_optional(task, solution, sources[1:], folder, arch, flags, quiet)
        _check_not_loaded_elsewhere(name, folder / f"{name}.so")
        try:
            module = load(
                name=name,
                sources=[str(binding_copy(task, folder))],
                extra_cflags=["-O3"],
                extra_ldflags=[str(o) for o in objects],
                with_cuda=True,
                build_directory=str(folder),
                verbose=False,
            )
        except (RuntimeError, OSError, ImportError) as err:
            log = folder / "build.log"
            log.write_text(str(err))
            raise BuildError(
                f"building task {task} ({what}) failed:\n{compiler_errors(str(err))}\n"
                f"(full log: {checkout_path(log)})"
            ) from None
        _LOADED_FROM.setdefault(module.__name__, Path(module.__file__))
        if published:  # still under the lock: no other process's build (another arch) relinks it meanwhile
            try:
                _publish(folder / f"{name}.so", published)
            except OSError as err:  # the next process builds it again: slower, never wrong
                print(f"task {task} ({what}): could not publish the build as {checkout_path(published)}: {err}")
    if not quiet:
        print(f"task {task} ({what}): built in {checkout_path(folder)} "
              f"({time.perf_counter() - started:.1f} s, arch {os.environ['TORCH_CUDA_ARCH_LIST']})")
        for line in warnings_said(objects):
            print(line)
    if verbose:
        print("\n".join(resource_report(objects, arch)))
    return module


# Kernels given with a task's binding, compiled into its extension beside the student's files: task 5's
# product of the few rows of a decode step with a weight matrix, which task 6's model calls.
GIVEN_KERNELS = {5: [Path("common/csrc/linear_rows.cu")]}


def binding_files(task: int) -> list[Path]:
    """taskN/binding.cpp and the headers it may include (common/csrc and its device library, which the kernel files
    include too), relative to the checkout."""
    headers = [p.relative_to(REPO) for folder in ("common/csrc", "common/csrc/device")
               for p in sorted((REPO / folder).glob("*")) if p.is_file()]
    return [Path(f"task{task}/binding.cpp"), *headers]


def binding_copy(task: int, folder: Path) -> Path:
    """taskN/binding.cpp and the headers it includes (common/csrc), copied to folder/src where they differ.

    An unchanged file is not written again, so ninja sees the same command and the same inputs
    in every worker that shares this build folder; a changed one is written now, newer than
    anything built from the old one.
    """
    copies = folder / "src"
    for rel in binding_files(task):
        source, copy = REPO / rel, copies / rel
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy)
    return copies / f"task{task}/binding.cpp"


class TaskExtension:
    """A CUDA task's `extension(solution=False, kernels=None)`: its compiled kernel module, built on first use.

    Every CUDA task's attention.py makes its `extension` from this one class, so the trusted side
    loads any task's reference the same way (harness/bench.py's load_reference): yours, the
    reference with solution=True, or another folder of the reference's kernels with
    kernels=NAME (taskN/solution/NAME; a task without one simply has none, and says so).
    """

    def __init__(self, task: int):
        self.task = task
        self.built: dict[tuple[bool, str | None], object] = {}

    def __call__(self, solution: bool = False, kernels: str | None = None):
        if (solution, kernels) not in self.built:
            module = load_extension(self.task, solution, quiet=True, kernels=kernels)
            from common import operators

            if operators.registered(module):  # the fakes torch.compile traces with: registered here, never while tracing
                operators.operators(module)
            self.built[(solution, kernels)] = module
        return self.built[(solution, kernels)]


def compile_main(task: int, argv: list[str] | None = None) -> int:
    """`python -m taskN.compile [--solution]`."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m task{task}.compile",
                                     description=f"Build task {task}'s CUDA extension.")
    add_solution_flag(parser, task, "build the reference solution", f"python -m task{task}.compile builds yours")
    parser.add_argument("--verbose", action="store_true",
                        help="print each kernel's registers, spills and shared memory, as the compiler reports them")
    parser.add_argument("--kernels", metavar="NAME", help=argparse.SUPPRESS)  # the reference's taskN/solution/NAME
    # the whole extension or an error, never the kernels alone (a class's prebuild imports what it builds)
    parser.add_argument("--extension", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kernels and not (args.solution and kernel_sources(task, True, args.kernels)):
        parser.error(f"--kernels: the reference has no folder task{task}/solution/{args.kernels} of kernel files")
    try:
        if not args.extension and (torch.version.cuda is None or not torch.cuda.is_available()) and find_nvcc():
            compile_only(task, args.solution, args.verbose, args.kernels)
        else:
            load_extension(task, args.solution, verbose=args.verbose, kernels=args.kernels)
    except BuildError as err:
        print(f"task {task}: {err}")
        return 1
    return 0


def _own_target(src: Path, arch: str) -> str:
    """' (sm_90a)' after a file built for its own target (`// nvcc target:`), else nothing."""
    try:
        target = file_target(src, arch)
    except BuildError:
        return ""
    return f" (sm_{target})" if target != arch else ""


def compile_only(task: int, solution: bool, verbose: bool = False, kernels: str | None = None) -> None:
    """Without a GPU (or a CUDA build of PyTorch) but with nvcc: compile the kernel files alone, so their
    compiler errors, the kernel rules and (verbose) their registers show on a laptop. The binding needs
    a CUDA PyTorch, and running needs the GPU: both wait for the GPU machine."""
    sources = kernel_sources(task, solution, kernels)
    if not sources:
        where = checkout_path(kernel_folder(task, solution, kernels))
        raise BuildError(f"task {task}: source files missing: no {where}/*.cu")
    check_plain_cuda(sources)
    arch = cuda_arch(without_gpu="90")  # no GPU to ask: sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise
    folder = build_dir(task, solution, kernels) / "compile-only"
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    objects = compile_kernels(sources, folder, arch, CUDA_FLAGS)
    why = ("this PyTorch is a CPU-only build" if torch.version.cuda is None else "no CUDA GPU is visible")
    compiled = ", ".join(checkout_path(s) + _own_target(s, arch) for s in sources)
    print(f"task {task} ({label(solution)}): compiled {compiled} for sm_{arch} with nvcc "
          f"({time.perf_counter() - started:.1f} s). Only the kernels: {why}, so the binding is built and the "
          f"kernels run on a GPU machine (python -m task{task}.test there).")
    for line in warnings_said(objects):
        print(line)
    if verbose:
        print("\n".join(resource_report(objects, arch)))
