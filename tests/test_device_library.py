"""The device library (common/csrc/device) holds what the kernel files share: no helper is copied between them.

A helper written twice drifts: one copy gets a fix and the other does not, and students read two versions of
one idea. Every function and struct defined in the kit's CUDA files is compared, comments and spacing aside; a
skeleton and its reference are one file (the skeleton is generated from it).
"""

import re

from common.nvcc import DEVICE_LIBRARY
from tests.conftest import REPO

HEAD = re.compile(r"^[A-Za-z_][^;{}()]*?\b(\w+)\s*\([^;{}]*\)[^;{}]*\{|^(?:struct|class)\s+(\w+)[^;{}]*\{", re.M)


def definitions(text: str) -> list[tuple[str, str]]:
    """(name, the definition with comments and spacing taken out) of each function or struct that starts at the
    beginning of a line, its template line included."""
    text = re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))
    found = []
    for match in HEAD.finditer(text):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        start = match.start()
        before = text[:start].rstrip("\n").rsplit("\n", 1)[-1]
        if before.startswith("template"):
            start -= len(before) + 1
        found.append((match.group(1) or match.group(2), " ".join(text[start:end + 1].split())))
    return found


def unit(path) -> str:
    """A skeleton (taskN/kernels/X.cu) is its reference's file (taskN/solution/kernels/X.cu)."""
    rel = path.relative_to(REPO).as_posix()
    return rel.replace("/kernels/", "/solution/kernels/") if "/solution/" not in rel else rel


def kit_cuda_files():
    return sorted([*REPO.glob("task*/**/*.cu"), *REPO.glob("common/csrc/*.cu"), *DEVICE_LIBRARY.glob("*")])


def test_the_parser_finds_functions_templates_and_structs():
    text = ("template <int N>\n__device__ __forceinline__ void f(float* v) {\n  if (v) { v[0] = 1; }  // c\n}\n"
            "struct S {\n  int x;\n};\nstatic int g(int a) { return a; }\n")
    assert [name for name, _ in definitions(text)] == ["f", "S", "g"]
    assert definitions(text)[0][1] == "template <int N> __device__ __forceinline__ void f(float* v) { if (v) { v[0] = 1; } }"


def test_no_helper_is_defined_in_two_files():
    # the launchers a binding calls: each set of kernels (the reference's other folders too) defines them
    declared = re.compile(r"^(?:cudaError_t|int) (\w+)\([^;{]*\);", re.M)  # declared there, defined in a .cu file
    interface = {name for binding in REPO.glob("task*/binding.cpp") for name in declared.findall(binding.read_text())}
    where: dict[str, set[str]] = {}
    names = {}
    for path in kit_cuda_files():
        for name, text in definitions(path.read_text()):
            if name in interface:
                continue
            where.setdefault(text, set()).add(unit(path))
            names[text] = name
    copied = {names[text]: sorted(units) for text, units in where.items() if len(units) > 1}
    assert not copied, f"defined the same way in several files (give it once, in {DEVICE_LIBRARY.relative_to(REPO)}): {copied}"


def test_the_library_is_what_the_kernels_include():
    library = {p.name for p in DEVICE_LIBRARY.glob("*")}
    included = set()
    for path in kit_cuda_files():
        included |= set(re.findall(r'#include "device/(\w+\.(?:cuh|h))"', path.read_text()))
    assert included == library, f"included but missing: {included - library}; never included: {library - included}"
