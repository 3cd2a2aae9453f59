"""common.occupancy: a kernel's host-side stub found in a library's full symbol table (nvcc and g++, no GPU)."""

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from common.occupancy import _load_base, _symbol_table
from tests.conftest import needs_nvcc

KERNELS = """
template <int N> __global__ void scale(float* x) { x[threadIdx.x] *= N; }
template __global__ void scale<2>(float*);
__global__ void plain(float* x) { x[0] = 1.0f; }
void launch(float* x) { scale<2><<<1, 32>>>(x); plain<<<1, 1>>>(x); }
"""


@needs_nvcc
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to link a shared library")
def test_the_stubs_of_template_and_plain_kernels_are_in_the_symbol_table(tmp_path):
    (tmp_path / "k.cu").write_text(KERNELS)
    subprocess.run(["nvcc", "-c", "-Xcompiler", "-fPIC", "-arch=sm_90", "k.cu", "-o", "k.o"], cwd=tmp_path, check=True)
    subprocess.run(["g++", "-shared", "k.o", "-o", "k.so"], cwd=tmp_path, check=True)
    found = _symbol_table(str(tmp_path / "k.so"))
    assert "_Z5scaleILi2EEvPf" in found and "_Z5plainPf" in found  # the names ptxas reports
    assert "_Z6launchPf" in found and all(v > 0 for v in found.values())
    assert _symbol_table(str(tmp_path / "k.cu")) == {}  # not an ELF file


def _cudart_dir():
    nvcc = shutil.which("nvcc")
    homes = [Path(nvcc).resolve().parent.parent] if nvcc else []
    homes += [Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []
    homes += [Path("/usr/local/cuda")]
    return next((h / "lib64" for h in homes if (h / "lib64" / "libcudart.so").exists()), None)


@needs_nvcc
@pytest.mark.skipif(shutil.which("g++") is None or _cudart_dir() is None, reason="needs g++ and the CUDA runtime library")
def test_a_stub_is_found_where_the_library_was_loaded(tmp_path):
    (tmp_path / "k.cu").write_text(KERNELS + 'extern "C" int PyInit_k() { return 0; }\n')
    subprocess.run(["nvcc", "-c", "-Xcompiler", "-fPIC", "-arch=sm_90", "k.cu", "-o", "k.o"], cwd=tmp_path, check=True)
    subprocess.run(["g++", "-shared", "k.o", "-o", "k.so", f"-L{_cudart_dir()}", "-lcudart"], cwd=tmp_path, check=True)
    lib = ctypes.CDLL(str(tmp_path / "k.so"))
    table = _symbol_table(str(tmp_path / "k.so"))
    base = _load_base(lib, table, "PyInit_k")
    assert base + table["_Z6launchPf"] == ctypes.cast(lib._Z6launchPf, ctypes.c_void_p).value  # an exported one
    assert _load_base(lib, table, "PyInit_other") is None
