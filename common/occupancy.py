"""How many blocks of a kernel an SM can hold, from the CUDA runtime's occupancy API (worker side).

ptxas says what one thread costs (common/resources.py); the runtime knows the rest: the
threads per block the kernel was compiled for (its `__launch_bounds__`) and the dynamic shared
memory its launcher asked for (`cudaFuncAttributeMaxDynamicSharedMemorySize`, set before the
first launch). `blocks_per_sm` asks `cudaOccupancyMaxActiveBlocksPerMultiprocessor` with
those, for kernels named by their mangled symbols, so call it after the kernel has run once.
A kernel whose launcher never raised that attribute (task 5's, which use static shared memory
only) still has the default cap there, 48 KB less its static shared memory: that is counted
as no dynamic shared memory.

It runs in the worker, which has the student's extension loaded; the checks validate what
comes back (plain integers) like any other reply.
"""

from __future__ import annotations

import ctypes
import re
import struct
from pathlib import Path

# cudaFuncAttributes (cuda_runtime_api.h): the leading fields, unchanged since CUDA 9.
_ATTRIBUTES_BYTES = 256  # more than the struct's size in any CUDA version: the runtime writes only its own
_DEFAULT_LIMIT = 48 * 1024  # static + dynamic shared memory a kernel may use without opting in to more
_OFFSETS = {"static_shared": (0, ctypes.c_size_t), "local": (16, ctypes.c_size_t),
            "threads": (24, ctypes.c_int), "registers": (28, ctypes.c_int), "dynamic_shared": (44, ctypes.c_int)}


def host_stub_name(symbol: str, table: dict[str, int]) -> str | None:
    """The host stub's symbol for the kernel ptxas names `symbol`. The same name, except for a kernel in an
    anonymous namespace: the host compiler marks its name internal (`L` before it), ptxas does not."""
    if symbol in table:
        return symbol
    m = re.match(r"_ZN(\d+)_GLOBAL__N_", symbol)  # _ZN, the namespace's name as <length><name>, then the kernel's
    if m:
        end = m.end(1) + int(m.group(1))
        internal = symbol[:end] + "L" + symbol[end:]
        return internal if internal in table else None
    return None


def blocks_per_sm(library: str, symbols: list[str]) -> dict[str, dict[str, int]]:
    """{symbol: {threads, registers, static_shared, dynamic_shared, local, blocks_per_sm}} for each kernel found.

    `library` is the extension's file: its kernels' host-side stubs carry the mangled names
    ptxas reports, and the CUDA runtime it links against answers for them.
    """
    lib = ctypes.CDLL(library)
    get_attributes, occupancy = lib.cudaFuncGetAttributes, lib.cudaOccupancyMaxActiveBlocksPerMultiprocessor
    table = _symbol_table(library)
    base = _load_base(lib, table, "PyInit_" + Path(library).name.split(".")[0])
    found = {}
    for symbol in symbols:
        stub_name = host_stub_name(symbol, table)
        if base is None or stub_name is None:
            continue  # a stripped library: no figure rather than a wrong one
        stub = ctypes.c_void_p(base + table[stub_name])
        raw = ctypes.create_string_buffer(_ATTRIBUTES_BYTES)
        if get_attributes(raw, stub) != 0:
            continue
        row = {name: kind.from_buffer(raw, offset).value for name, (offset, kind) in _OFFSETS.items()}
        if row["dynamic_shared"] + row["static_shared"] == _DEFAULT_LIMIT:
            row["dynamic_shared"] = 0  # the launcher never raised the limit: the attribute is the cap, not its use
        blocks = ctypes.c_int(0)
        if occupancy(ctypes.byref(blocks), stub, row["threads"], ctypes.c_size_t(row["dynamic_shared"])) != 0:
            continue
        found[symbol] = row | {"blocks_per_sm": blocks.value}
    return found


def _symbol_table(path: str) -> dict[str, int]:
    """Name -> address (relative to where the library is loaded) of every defined function in an ELF64 file.

    A kernel's host-side stub is a local symbol, absent from the dynamic table that dlsym reads,
    so the file's full symbol table (.symtab, kept unless the library was stripped) is read here.
    """
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return {}  # not a little-endian ELF64 file
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    found = {}
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind not in (2, 11) or not entsize:  # SHT_SYMTAB, SHT_DYNSYM
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name_at, info, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", data, at)
            if info & 0xF == 2 and shndx != 0 and value:  # STT_FUNC, defined here
                end = data.index(b"\0", strings + name_at)
                found[data[strings + name_at:end].decode(errors="replace")] = value
    return found


def _load_base(lib: ctypes.CDLL, table: dict[str, int], own: str) -> int | None:
    """Where the library sits in memory: the address of `own`, a function only it exports (a Python
    extension's PyInit_<name>), less its address in the file."""
    if own not in table:
        return None
    try:
        return ctypes.cast(getattr(lib, own), ctypes.c_void_p).value - table[own]
    except AttributeError:
        return None
