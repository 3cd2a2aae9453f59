"""What each kernel costs the GPU, as the compiler says it: registers, spills, shared and constant memory.

`nvcc -Xptxas=-v` prints, for every kernel it compiles, how many registers a thread uses,
how many bytes it spills to local memory (slow: it lives in global memory), its static
shared memory and its barriers. common/nvcc.py keeps that text beside each compiled
object, and `python -m taskN.compile --verbose` prints one line per kernel from it. These
numbers decide how many blocks fit on an SM: registers x threads per block, and shared
memory per block, against the SM's 64K registers and (on sm_90) 227 KB of shared memory.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

_PROPERTIES = re.compile(r"Function properties for (?P<name>\S+)")
_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\w+)'")
_FRAME = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads")
_USED = re.compile(r"Used (?P<registers>\d+) registers")
_SMEM = re.compile(r"(?P<bytes>\d+) bytes smem")
_CMEM = re.compile(r"(?P<bytes>\d+) bytes cmem\[\d+\]")
_BARRIERS = re.compile(r"used (?P<count>\d+) barriers")


@dataclass
class KernelResources:
    name: str  # demangled where c++filt is available: flash_attention_kernel<128>
    arch: str
    registers: int = 0
    spill_stores: int = 0  # bytes per thread written to local memory
    spill_loads: int = 0
    stack: int = 0
    shared: int = 0  # static shared memory, bytes per block (dynamic shared memory is set at launch)
    constant: int = 0
    barriers: int | None = None  # older ptxas versions do not say
    symbol: str = ""  # the mangled name, as the object file and the CUDA runtime know the kernel

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0

    def line(self) -> str:
        words = [f"{self.registers} registers per thread"]
        if self.spills:
            words.append(f"SPILLS {self.spill_stores} B stored and {self.spill_loads} B loaded per thread to local "
                         "memory (slow: fewer values live at once, a smaller tile per thread, or a looser "
                         "__launch_bounds__)")
        else:
            words.append("no spills")
        words.append(f"{self.shared} B of static shared memory")
        if self.barriers is not None:
            words.append(f"{self.barriers} barrier{'s' if self.barriers != 1 else ''}")
        return f"{self.name}: " + ", ".join(words)


def parse_ptxas(text: str) -> list[KernelResources]:
    """Every kernel in `nvcc -Xptxas=-v` output, in the order compiled (names as ptxas gives them)."""
    kernels: list[KernelResources] = []
    properties_of = None  # the function the next stack-frame line describes (a device function's may follow)
    for line in text.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            kernels.append(KernelResources(entry["name"], entry["arch"], symbol=entry["name"]))
            continue
        properties = _PROPERTIES.search(line)
        if properties:
            properties_of = properties["name"]
            continue
        if not kernels:
            continue
        k = kernels[-1]
        frame = _FRAME.search(line)
        if frame and properties_of == k.name:
            k.stack, k.spill_stores, k.spill_loads = int(frame["stack"]), int(frame["stores"]), int(frame["loads"])
        used = _USED.search(line)
        if used:
            k.registers = int(used["registers"])
            k.shared = sum(int(m["bytes"]) for m in _SMEM.finditer(line))
            k.constant = sum(int(m["bytes"]) for m in _CMEM.finditer(line))
            barriers = _BARRIERS.search(line)
            k.barriers = int(barriers["count"]) if barriers else None
    return kernels


def demangle(kernels: list[KernelResources]) -> list[KernelResources]:
    """Readable names (flash_attention_kernel<128>, without the parameter list) when c++filt is installed."""
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not kernels:
        return kernels
    proc = subprocess.run([tool], input="\n".join(k.name for k in kernels), capture_output=True, text=True)
    names = proc.stdout.splitlines()
    if proc.returncode != 0 or len(names) != len(kernels):
        return kernels
    for k, name in zip(kernels, names):  # a kernel in an anonymous namespace: its name without the namespace
        k.name = re.sub(r"^void ", "", name.replace("(anonymous namespace)::", "").split("(")[0])
    return kernels
