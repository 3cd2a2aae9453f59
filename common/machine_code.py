"""What a built kernel is made of: the GPU instructions (SASS) of each kernel in an object or extension, read by the
CUDA toolkit's `cuobjdump -sass` (which calls `nvdisasm`).

Only read, never run. The Hopper part (checks/task4/hopper.py) asks it whether a kernel computes with wgmma (`HGMMA`
in SASS) and loads with TMA (`UTMALDG`): a file that calls steps 8-11's `mma.sync` kernel gets the same numbers.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

from common.nvcc import find_cuda_tool

TOOLS = ("cuobjdump", "nvdisasm")
# Where to get them without a whole toolkit (CUDA's own wheels put them in site-packages/nvidia/cuNN/bin)
TOOLS_HINT = ("cuobjdump and nvdisasm come with the CUDA toolkit (or `pip install nvidia-cuda-cuobjdump "
              "nvidia-cuda-nvdisasm`)")
DISASSEMBLE_TIMEOUT_S = 180
FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
# `/*0120*/  @!P0 HGMMA.64x192x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;`: the mnemonic is the word after the
# address and the predicate, up to its first dot
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s*(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


class MachineCodeError(RuntimeError):
    """The machine code could not be read; the message says why."""


def _from_wheel(name: str) -> str | None:
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for found in sorted(Path(root).glob(f"cu*/bin/{name}")):
            if os.access(found, os.X_OK):
                return str(found)
    return None


def find_tool(name: str) -> str | None:
    """A program of TOOLS: the CUDA toolkit's (CUDA_HOME, PATH), else a CUDA wheel's."""
    return find_cuda_tool(name) or _from_wheel(name)


def tools_missing() -> str | None:
    """None when both programs are here, else what is missing and where to get it."""
    missing = [name for name in TOOLS if find_tool(name) is None]
    return f"{' and '.join(missing)} not found: {TOOLS_HINT}" if missing else None


def parse_sass(text: str) -> dict[str, set[str]]:
    """cuobjdump's `-sass` listing -> {kernel's (mangled) name: the mnemonics it uses}."""
    kernels: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in text.splitlines():
        if found := FUNCTION.match(line):
            current = kernels.setdefault(found[1], set())
        elif current is not None and (found := INSTRUCTION.match(line)):
            current.add(found[1])
    return kernels


def kernel_instructions(path: Path) -> dict[str, set[str]]:
    """{kernel: mnemonics} of every kernel in an object file or shared library; raises MachineCodeError."""
    if (missing := tools_missing()) is not None:
        raise MachineCodeError(missing)
    env = dict(os.environ, NVDISASM_PATH=str(Path(find_tool("nvdisasm")).parent))
    try:
        proc = subprocess.run([find_tool("cuobjdump"), "-sass", str(path)], capture_output=True, text=True,
                              errors="replace", env=env, timeout=DISASSEMBLE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise MachineCodeError(f"cuobjdump took over {DISASSEMBLE_TIMEOUT_S} s on {path.name}") from None
    except OSError as err:
        raise MachineCodeError(f"cuobjdump could not start: {err}") from None
    if proc.returncode != 0:
        raise MachineCodeError(f"cuobjdump could not read {path.name}: {proc.stderr.strip()[:300]}")
    return parse_sass(proc.stdout)
