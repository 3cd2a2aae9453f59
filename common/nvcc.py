"""nvcc: the CUDA toolkit found, the rules a kernel file's text must follow, each kernel file compiled on its own
into an object (cached by its folder's contents, several at once), and what ptxas says of its kernels.
common/build.py links those objects with the task's binding and loads the extension.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import torch

from common import kernel_rules, resources
from common.impl import REPO

CUDA_FLAGS = ["-O3", "-lineinfo", "-Xptxas=-v,-warn-spills"]  # -v: the resources of each kernel (common/resources.py)
# The device library the kernel files share (README, "The device library"): its headers are included as
# "device/NAME.cuh", so nvcc searches common/csrc; the kernel rules allow that one folder of it.
DEVICE_LIBRARY = REPO / "common" / "csrc" / "device"
MAX_ERROR_LINES = 12
# A kernel file written for one GPU generation's own instructions (Hopper's wgmma, TMA and setmaxnreg exist only for
# the target sm_90a, not sm_90) says so on a line of its own near its top, `// nvcc target: sm_90a`. It is compiled
# for that target on a GPU of that generation, and left out of the build on any other (its part says why).
TARGET_LINE = re.compile(r"^// nvcc target: sm_(\d+)a[ \t]*$", re.M)
# nvcc's warnings, ptxas's, and ptxas's notes of a performance loss (C7512: wgmma's serialized for want of registers,
# what the Hopper kernel's step 21 can run into)
WARNING = re.compile(r"^(.+?\(\d+\): warning #\d+-D: .*|ptxas warning\s*: .*"
                     r"|ptxas info\s*: \(C\d+\) Potential Performance Loss: .*)$")


class BuildError(RuntimeError):
    """The extension could not be built or loaded; the message is the whole story."""


class KernelRuleError(BuildError):
    """A kernel file breaks common/kernel_rules.py: a rule of the task, not a build problem."""


def cpp_extension():
    """torch.utils.cpp_extension, imported without the warning a CUDA build of PyTorch logs on a machine without a
    GPU ("No CUDA runtime is found"): the kit says what is missing in its own words, where it matters."""
    import logging

    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension as module
    finally:
        log.setLevel(level)
    return module


def find_cuda_tool(name: str) -> str | None:
    """A CUDA toolkit program (nvcc, compute-sanitizer, ncu): CUDA_HOME/bin first, else PATH."""
    CUDA_HOME = cpp_extension().CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / name).exists():
        return str(Path(CUDA_HOME) / "bin" / name)
    return shutil.which(name)


def find_nvcc() -> str | None:
    return find_cuda_tool("nvcc")


def check_toolchain() -> None:
    """Raise BuildError naming the first missing piece: GPU, CUDA build of torch, nvcc, ninja."""
    is_ninja_available = cpp_extension().is_ninja_available

    if torch.version.cuda is None:
        raise BuildError(
            f"this PyTorch ({torch.__version__}) is a CPU-only build, so CUDA extensions cannot be built. "
            "Install a CUDA build of PyTorch (see README, Set-up) on a machine with an NVIDIA GPU."
        )
    if not torch.cuda.is_available():
        raise BuildError("no CUDA GPU is visible (torch.cuda.is_available() is False); run on a GPU node.")
    if find_nvcc() is None:
        raise BuildError(
            "nvcc was not found: load your CUDA toolkit (for example `module load cuda`) or set CUDA_HOME."
        )
    if not is_ninja_available():
        raise BuildError("ninja was not found: `pip install ninja` (it is in the project's dependencies).")


PLAIN_CUDA_ONLY = re.compile(r'^\s*#\s*include\s*[<"](torch|ATen|c10|cublas|cudnn|cutlass)', re.IGNORECASE | re.MULTILINE)


INCLUDES_SOLUTION = re.compile(r'^\s*#\s*include\s*[<"][^>"]*solution', re.MULTILINE)


def check_plain_cuda(sources: list[Path]) -> None:
    """Kernels must do the work themselves: no PyTorch, cuBLAS or cuDNN from a .cu file."""
    for src in sources:
        if "solution" not in src.parts and INCLUDES_SOLUTION.search(src.read_text()):
            raise BuildError(f"{src.relative_to(REPO)} includes the reference solution: write the kernels yourself")
        match = PLAIN_CUDA_ONLY.search(src.read_text())
        if match:
            raise BuildError(
                f"{src.relative_to(REPO)} includes {match.group(0).strip()!r}: kernel files must be plain CUDA "
                "(the binding owns everything PyTorch; libraries such as cuBLAS would do the task for you)"
            )


COMPILER_ERROR = re.compile(
    r"\(\d+\): (error|catastrophic error)"  # nvcc: file.cu(42): error: ...
    r"|:\d+(:\d+)?: (fatal )?error"          # gcc: file.cpp:42:7: error: ...
    r"|undefined symbol|error detected in the compilation"
)


def compiler_errors(log: str) -> str:
    """The lines a student needs from a ninja/nvcc log: the errors, with file and line, not the commands."""
    wanted = [ln.strip() for ln in log.splitlines() if COMPILER_ERROR.search(ln)]
    if not wanted:
        wanted = log.strip().splitlines()[-MAX_ERROR_LINES:]
    more = len(wanted) - MAX_ERROR_LINES
    return "\n".join(wanted[:MAX_ERROR_LINES]) + (f"\n... and {more} more" if more > 0 else "")


def cuda_arch(without_gpu: str | None = None) -> str:
    """The `-gencode` target: TORCH_CUDA_ARCH_LIST's first entry, else the GPU present (9.0 -> 90), else
    `without_gpu` (for builds that only compile)."""
    if "TORCH_CUDA_ARCH_LIST" not in os.environ:
        if without_gpu and not torch.cuda.is_available():
            return without_gpu
        major, minor = torch.cuda.get_device_capability()
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    first = re.split(r"[;\s]+", os.environ["TORCH_CUDA_ARCH_LIST"].strip())[0]
    return first.replace("+PTX", "").replace(".", "")


def compile_kernels(sources: list[Path], folder: Path, arch: str, flags: list[str]) -> list[Path]:
    """`nvcc -c` each kernel file into `folder`, checked against common/kernel_rules.py; returns the objects.

    An object is named by a hash of everything in its kernels folder, the flags and the
    arch, so an unchanged file is not rebuilt and a changed one gets a new name (which makes
    the loader relink). What ptxas says of each kernel's resources is kept beside its object
    (`.ptxas`), for `kernel_resources`. The files compile at once (each nvcc is one thread); the
    first that fails, in the order given, raises.
    """
    built = compile_each(sources, folder, arch, flags)
    for result in built.values():
        if isinstance(result, BuildError):
            raise result
    return [built[src] for src in sources]


def file_target(src: Path, arch: str) -> str:
    """The `-gencode` target of one kernel file on a GPU of `arch` ("90"): `arch` itself, or the file's own
    (`// nvcc target: sm_90a` -> "90a"). Raises a BuildError, naming both, when the file cannot run on this GPU."""
    found = TARGET_LINE.search(src.read_text(errors="replace")[:4000])
    if found is None:
        return arch
    if found[1] != arch.removesuffix("a"):  # TORCH_CUDA_ARCH_LIST may say 9.0a already
        shown = str(src.relative_to(REPO)) if src.is_relative_to(REPO) else src.name
        raise BuildError(f"{shown} is written for sm_{found[1]}a (compute capability {found[1][:-1]}.{found[1][-1]}: "
                         f"its `// nvcc target:` line), and this GPU is sm_{arch}: it is left out of the build here")
    return f"{found[1]}a"


def device_library_files() -> list[Path]:
    return sorted(p for p in DEVICE_LIBRARY.glob("*") if p.is_file())


def include_flags() -> list[str]:
    """nvcc's search path for the device library: `#include "device/NAME.cuh"`."""
    return [f"-I{DEVICE_LIBRARY.parent}"]


def _folder_key(own: Path, nvcc: str, arch: str, flags: list[str]) -> str:
    """Every file of the kernels folder and of the device library: a header changed in either rebuilds."""
    digest = hashlib.sha256(f"{nvcc}|{arch}|{flags}".encode())
    for path in [*sorted(own.iterdir()), *device_library_files()]:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def compile_each(sources: list[Path], folder: Path, arch: str, flags: list[str]) -> dict:
    """compile_kernels's work for each file on its own, all at once: {source: its object, or the BuildError
    that says why it has none} (a KernelRuleError when it compiled but breaks a kernel rule)."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc was not found: load your CUDA toolkit (for example `module load cuda`) or set CUDA_HOME.")
    keys = {own: _folder_key(own, nvcc, arch, flags) for own in {src.parent for src in sources}}
    at_once = max(1, int(os.environ.get("MAX_JOBS") or 4))  # each nvcc takes a core and up to a few GB
    running, started, refused = {}, [], {}
    try:
        for src in sources:
            try:
                target = file_target(src, arch)
            except BuildError as err:
                refused[src] = err
                continue
            key = keys[src.parent]
            obj, deps = folder / f"{src.stem}-{key}.o", folder / f"{src.stem}-{key}.d"
            if obj.exists() and deps.exists():
                running[src] = (obj, deps, None, None)
                continue
            cmd = [nvcc, "-c", str(src), "-o", str(obj) + ".part", "-MD", "-MF", str(deps), "-std=c++17", "-Xcompiler",
                   "-fPIC", "-gencode", f"arch=compute_{target},code=sm_{target}", *include_flags(), *flags]
            while sum(proc.poll() is None for proc in started) >= at_once:
                time.sleep(0.05)
            with open(obj.with_suffix(".out"), "w") as said:  # a file, not a pipe: nothing waits on a full pipe
                started.append(subprocess.Popen(cmd, stdout=said, stderr=subprocess.STDOUT, cwd=folder))
            running[src] = (obj, deps, cmd, started[-1])
        built = _compiled(running, folder, nvcc)
        return {src: refused[src] if src in refused else built[src] for src in sources}
    finally:  # an error (or Ctrl-C) here leaves no compiler running
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _compiled(running: dict, folder: Path, nvcc: str) -> dict:
    """compile_each's results, once each compiler it started has ended."""
    results = {}
    for src, (obj, deps, cmd, proc) in running.items():
        shown = str(src.relative_to(REPO)) if src.is_relative_to(REPO) else src.name
        if proc is not None:
            proc.wait()
            said = obj.with_suffix(".out").read_text(errors="replace")
            obj.with_suffix(".out").unlink()
            if proc.returncode != 0:
                log = folder / f"build-{src.stem}.log"
                log.write_text(" ".join(cmd) + "\n" + said)
                errors = compiler_errors(said).replace(f"{REPO}/", "")  # paths as in the checkout
                results[src] = BuildError(f"compiling {shown} failed:\n{errors}\n"
                                          f"(full log: {checkout_path(log)})")
                continue
            obj.with_suffix(".ptxas").write_text(said)
            os.replace(str(obj) + ".part", obj)
        try:
            kernel_rules.check_object(obj, deps, shown, nvcc, DEVICE_LIBRARY)
        except kernel_rules.RuleBroken as broken:
            results[src] = KernelRuleError(str(broken))
            continue
        results[src] = obj
    return results


def compiler_warnings(objects: list[Path]) -> list[str]:
    """nvcc's and ptxas's warnings on these objects' files (kept in each `.ptxas`, so a file not rebuilt still
    shows them), each once (nvcc says a front-end warning for the host and the device pass), paths as in the
    checkout."""
    found: dict[str, None] = {}
    for obj in objects:
        report = obj.with_suffix(".ptxas")
        for line in (report.read_text(errors="replace") if report.exists() else "").splitlines():
            if WARNING.match(line.strip()):
                found[line.strip().replace(f"{REPO}/", "")] = None
    return list(found)


def warnings_said(objects: list[Path]) -> list[str]:
    """`taskN.compile`'s lines for compiler_warnings: none when there are none."""
    found = compiler_warnings(objects)
    if not found:
        return []
    unused = " (a variable 'never referenced' while a step is still TODO is one that step uses)" \
        if any("never referenced" in w for w in found) else ""
    return [f"nvcc's warnings, {len(found)}{unused}:", *(f"  {w}" for w in found)]


def kernel_resources(objects: list[Path]) -> list[resources.KernelResources]:
    """The registers, spills and shared memory of every kernel in these objects, as ptxas reported them."""
    found = []
    for obj in objects:
        text = obj.with_suffix(".ptxas").read_text() if obj.with_suffix(".ptxas").exists() else ""
        found += resources.parse_ptxas(text)
    return resources.demangle(found)


def resource_report(objects: list[Path], arch: str) -> list[str]:
    """`taskN.compile --verbose`: a line per kernel, and the ones that spill named again at the end."""
    found = kernel_resources(objects)
    lines = [f"resources per kernel (ptxas, sm_{arch}; an SM has 65536 registers, and on sm_90 up to 227 KB of shared "
             "memory per block; dynamic shared memory, extern __shared__, is set at launch and not counted here):"]
    lines += [f"  {k.line()}" for k in found]
    spilling = [k.name for k in found if k.spills]
    if spilling:
        lines.append(f"  {len(spilling)} kernel{'s' if len(spilling) > 1 else ''} spill registers: {', '.join(spilling)}")
    return lines


@functools.cache  # one `nvcc --version` per process, however many extensions it loads
def nvcc_version() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        return "no nvcc"
    try:
        said = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        said = ""
    return f"{os.path.realpath(nvcc)} {said}"


def checkout_path(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
