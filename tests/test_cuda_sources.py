"""Every .cu file, skeletons included, compiles with plain nvcc: no GPU and no torch headers needed."""

import re
import subprocess

import pytest

from common.nvcc import DEVICE_LIBRARY, PLAIN_CUDA_ONLY, file_target, include_flags
from tests.conftest import REPO, needs_nvcc

# the tasks' kernels, and the ones given with a binding (common/csrc), held as strictly as the references
CU_FILES = sorted(p.relative_to(REPO) for p in [*REPO.glob("task*/**/*.cu"), *REPO.glob("common/csrc/*.cu")])


@needs_nvcc
@pytest.mark.parametrize("source", CU_FILES, ids=str)
def test_compiles_with_nvcc(source, tmp_path):
    # A skeleton may warn (variables its TODOs will use); the reference must be warning-free.
    given = source.parts[0] == "common"
    strict = ["-Werror=all-warnings"] if "solution" in source.parts or given else []
    target = file_target(REPO / source, "90")  # 90a for a file written for Hopper's own instructions
    proc = subprocess.run(
        ["nvcc", "-c", "-O3", "-gencode", f"arch=compute_{target},code=sm_{target}", "-std=c++17", "-Xptxas=-v,-warn-spills", *include_flags(), *strict,
         str(REPO / source), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"nvcc -c {source} failed:\n{proc.stderr[-4000:]}"
    spills = [ln for ln in proc.stderr.splitlines() if re.search(r"[1-9]\d* bytes spill", ln)]
    if "solution" in source.parts or given:
        assert not spills, f"{source}: the reference spills registers:\n" + "\n".join(spills)


@pytest.mark.parametrize("source", CU_FILES + sorted(p.relative_to(REPO) for p in DEVICE_LIBRARY.glob("*")), ids=str)
def test_kernels_are_plain_cuda(source):
    text = (REPO / source).read_text()
    assert not PLAIN_CUDA_ONLY.search(text), f"{source} includes a torch/cuBLAS/cuDNN header; kernels stay plain CUDA"
