"""What a kernel file may use: the GPU and the CUDA runtime, not someone else's kernels.

A task's `.cu` files are compiled to objects on their own (common/nvcc.py), and every
object is held to these rules before anything from it runs:
- it includes only headers from its own kernels folder, the kit's device library
  (common/csrc/device, given to every student) and the toolchain's folders (the CUDA toolkit,
  the C/C++ system headers): not a reference solution, wherever it lies;
- it imports (links against) only the symbols below: the CUDA runtime's launch, memory,
  stream, event, device-query and error calls, printf-style output, and the C/C++ support
  the compiler emits by itself. cuBLAS, PyTorch's kernels, dlopen/dlsym, files, processes
  and threads are not there, so a kernel file cannot reach them by name;
- its host code has no `syscall` instruction (a way round the imports).
One list for every CUDA task; tests/test_kernel_rules.py holds it to the reference objects.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ALLOWED_IMPORTS = frozenset({
    # what nvcc's generated code calls to register and launch the file's own kernels
    "__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd", "__cudaUnregisterFatBinary", "__cudaRegisterFunction",
    "__cudaRegisterVar", "__cudaRegisterManagedVar", "__cudaPushCallConfiguration", "__cudaPopCallConfiguration",
    "__cudaGetKernel", "__cudaLaunchKernel", "__cudaInitModule",
    # the CUDA runtime: launches, kernel attributes, occupancy, errors
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaFuncSetAttribute",
    "cudaFuncGetAttributes", "cudaFuncSetCacheConfig", "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "cudaOccupancyMaxPotentialBlockSize",
    "cudaGetLastError", "cudaPeekAtLastError", "cudaGetErrorString", "cudaGetErrorName",
    # devices, memory, streams and events
    "cudaGetDevice", "cudaGetDeviceCount", "cudaGetDeviceProperties", "cudaGetDeviceProperties_v2",
    "cudaDeviceGetAttribute", "cudaDeviceSynchronize", "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
    "cudaMemcpy", "cudaMemcpyAsync", "cudaMemset", "cudaMemsetAsync", "cudaMemcpyToSymbol",
    "cudaMemcpyToSymbolAsync", "cudaMemcpyFromSymbol", "cudaMemcpyFromSymbolAsync", "cudaStreamSynchronize",
    "cudaStreamWaitEvent", "cudaEventCreate", "cudaEventCreateWithFlags", "cudaEventDestroy", "cudaEventRecord",
    "cudaEventSynchronize", "cudaEventElapsedTime",
    # output for debugging
    "printf", "puts", "putchar", "fprintf", "fputs", "fputc", "fflush", "stderr", "stdout", "vprintf",
    "__printf_chk", "__fprintf_chk", "__vprintf_chk", "__vfprintf_chk",  # the same, with _FORTIFY_SOURCE
    "__memcpy_chk", "__memmove_chk", "__memset_chk",
    # what the C++ compiler emits on its own: exceptions, static locals, new/delete, memcpy, assert
    "_Unwind_Resume", "__gxx_personality_v0", "__cxa_guard_acquire", "__cxa_guard_release", "__cxa_guard_abort",
    "__cxa_atexit", "atexit", "__dso_handle", "__cxa_begin_catch", "__cxa_end_catch", "__cxa_rethrow",
    "__cxa_allocate_exception", "__cxa_free_exception", "__cxa_throw", "__cxa_pure_virtual", "_ZSt9terminatev",
    "__stack_chk_fail", "__assert_fail", "abort", "memcpy", "memmove", "memset", "memcmp", "strlen",
    "_Znwm", "_Znam", "_ZdlPv", "_ZdlPvm", "_ZdaPv", "_ZdaPvm",
})
ALLOWED_PATTERNS = (
    re.compile(r"_ZSt\d+__throw_\w+"),  # std::vector and friends report errors through these
    re.compile(r"(sqrt|cbrt|exp|exp2|expm1|log|log2|log10|log1p|pow|ceil|floor|round|trunc|fmax|fmin|fabs|fmod"
               r"|sin|cos|tan|tanh|erf|ldexp|frexp)[fl]?"),  # host math
)

RULES_NOTE = ("kernel files may call only the CUDA runtime (launches, memory, streams, events, device queries, "
              "errors), printf and the C/C++ support the compiler adds: the task is to write the kernels yourself "
              "(README, 'What your code may use')")


class RuleBroken(Exception):
    """A kernel object breaks a rule; the message names the file and the symbol or header."""


def allowed(symbol: str) -> bool:
    name = symbol.split("@")[0]  # versioned names: memcpy@GLIBC_2.14
    return name in ALLOWED_IMPORTS or any(p.fullmatch(name) for p in ALLOWED_PATTERNS)


def imported_symbols(obj: Path) -> list[str]:
    """The undefined symbols of an object file (what it needs from elsewhere)."""
    nm = shutil.which("nm")
    if nm is None:
        raise RuleBroken("nm (binutils) was not found: it is needed to check kernel objects (apt install binutils)")
    proc = subprocess.run([nm, "-u", "--format=posix", str(obj)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuleBroken(f"nm could not read {obj.name}: {proc.stderr.strip()[:300]}")
    return sorted({line.split()[0] for line in proc.stdout.splitlines() if line.strip()})


def check_imports(obj: Path, source: str) -> None:
    bad = [s for s in imported_symbols(obj) if not allowed(s)]
    if bad:
        names = ", ".join(_demangle(bad[:6])) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
        raise RuleBroken(f"{source} uses {names}: {RULES_NOTE}")


def check_no_syscalls(obj: Path, source: str) -> None:
    objdump = shutil.which("objdump")
    if objdump is None:
        raise RuleBroken("objdump (binutils) was not found: it is needed to check kernel objects")
    proc = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True)
    if re.search(r"\s(syscall|sysenter|int\s+\$0x80)\b", proc.stdout):
        raise RuleBroken(f"{source} makes a system call directly: {RULES_NOTE}")


def included_files(depfile: Path) -> list[Path]:
    """The files a compile read, from the `-MD` dependency file nvcc wrote."""
    text = depfile.read_text().replace("\\\n", " ")
    _, _, deps = text.partition(":")
    names = re.findall(r"(?:\\ |[^\s])+", deps)
    return [Path(n.replace("\\ ", " ")) for n in names]


def check_includes(depfile: Path, source: str, toolchain: list[Path], library: Path | None = None) -> None:
    """Every header comes from the kernels folder, the device library or the toolchain: no reference solution.

    The kernels folder is the compiled file's own (the first file listed), wherever it was
    when compiled: an object is reused from any folder with the same files. So is the device
    library: a header of it is one of its files' names in a folder .../common/csrc/device (the
    object's name hashes the library's files, so the same names held the same text).
    """
    files = included_files(depfile)
    if not files:
        raise RuleBroken(f"{source}: the compiler's list of included files is empty: rebuild (delete build/)")
    own_folder = files[0].parent
    roots = [own_folder.resolve(), *(p.resolve() for p in toolchain)]
    library_names = {p.name for p in library.glob("*") if p.is_file()} if library else set()
    for path in files:
        real = path.resolve()
        if real.name in library_names and real.parent.parts[-3:] == library.parts[-3:]:
            continue
        if not any(real == r or r in real.parents for r in roots):
            raise RuleBroken(f"{source} includes {path}: keep the headers you write in {own_folder.name}/ beside "
                             "it (only those, the kit's common/csrc/device/ and the CUDA toolkit's and the "
                             "system's headers are allowed)")


def toolchain_folders(nvcc: str) -> list[Path]:
    """Where the headers of the compilers live: the CUDA toolkit and the system's C/C++ folders."""
    cuda = Path(nvcc).resolve().parent.parent
    if cuda == Path("/usr"):  # a distribution's package: the toolkit's headers are among the system's
        cuda = Path("/usr/lib/nvidia-cuda-toolkit")
    return [cuda, Path("/usr/include"), Path("/usr/lib/gcc"), Path("/usr/local/include"), Path("/usr/lib/llvm")]


def check_object(obj: Path, depfile: Path, source: str, nvcc: str, library: Path | None = None) -> None:
    """All the rules above, for one compiled kernel file (library: the device library's folder); raises
    RuleBroken."""
    check_includes(depfile, source, toolchain_folders(nvcc), library)
    check_imports(obj, source)
    check_no_syscalls(obj, source)


def _demangle(names: list[str]) -> list[str]:
    filt = shutil.which("c++filt")
    if filt is None:
        return names
    proc = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True)
    shown = proc.stdout.split("\n")[:len(names)]
    return shown if proc.returncode == 0 and len(shown) == len(names) else names
