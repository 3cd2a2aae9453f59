"""common.resources: each kernel's registers, spills and shared memory, from what ptxas says (no GPU needed)."""

from common import nvcc, resources
from tests.conftest import REPO, needs_nvcc, needs_solution

# Recorded from `nvcc -c -arch=sm_90 -Xptxas=-v` (CUDA 13.0): task 2's GEMM (static shared memory;
# the cmem entry added to show it is summed too), then task 4's reference with MIN_BLOCKS_PER_SM = 2,
# which caps it at 128 registers, so it spills.
RECORDED = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z14gemm_nn_kernelPKfS0_Pfiii' for 'sm_90'
ptxas info    : Function properties for _Z14gemm_nn_kernelPKfS0_Pfiii
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 8192 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 31.818 ms
ptxas info    : Compiling entry function '_Z22flash_attention_kernelILi128EEvPKfS1_S1_Pfiiifb' for 'sm_90'
ptxas info    : Function properties for _Z22flash_attention_kernelILi128EEvPKfS1_S1_Pfiiifb
    328 bytes stack frame, 1196 bytes spill stores, 1180 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 328 bytes cumulative stack size
ptxas info    : Compile time = 322.351 ms
"""
KERNEL = """#include <cuda_runtime.h>
__global__ void scale(float* x, int n) { __shared__ float t[256]; int i = threadIdx.x;
  t[i] = i < n ? x[i] : 0.0f; __syncthreads(); if (i < n) x[i] = 2.0f * t[255 - i]; }
cudaError_t launch(float* x, int n, cudaStream_t s) { scale<<<1, 256, 0, s>>>(x, n); return cudaGetLastError(); }
"""


def test_recorded_ptxas_output_is_read_kernel_by_kernel():
    gemm, flash = resources.demangle(resources.parse_ptxas(RECORDED))
    assert (gemm.registers, gemm.shared, gemm.constant, gemm.barriers, gemm.spills) == (64, 8192, 400, 1, False)
    assert (flash.registers, flash.spill_stores, flash.spill_loads, flash.stack) == (128, 1196, 1180, 328)
    assert "SPILLS 1196 B stored and 1180 B loaded per thread" in flash.line()
    assert gemm.line().endswith("64 registers per thread, no spills, 8192 B of static shared memory, 1 barrier")


def test_a_device_functions_properties_are_not_its_kernels():
    text = ("ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'\n"
            "ptxas info    : Function properties for _Z1kv\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            "ptxas info    : Function properties for _Z6helperv\n"
            "    8 bytes stack frame, 40 bytes spill stores, 40 bytes spill loads\n"
            "ptxas info    : Used 32 registers\n")
    (kernel,) = resources.parse_ptxas(text)
    assert kernel.registers == 32 and not kernel.spills and kernel.barriers is None
    assert kernel.line().endswith("0 B of static shared memory")  # no barrier count where ptxas gave none


def test_no_kernels_in_unrelated_text():
    assert resources.parse_ptxas("") == [] and resources.parse_ptxas("nvcc warning : something\n") == []


@needs_nvcc
def test_a_build_keeps_what_ptxas_said_beside_its_object(tmp_path):
    (tmp_path / "kernels").mkdir()
    source = tmp_path / "kernels" / "attention.cu"
    source.write_text(KERNEL)
    objects = nvcc.compile_kernels([source], tmp_path, "90", nvcc.CUDA_FLAGS)
    (found,) = nvcc.kernel_resources(objects)
    assert found.name.startswith("scale") and found.arch == "sm_90"
    assert found.shared == 1024 and found.registers > 0 and not found.spills and found.barriers == 1
    again = nvcc.compile_kernels([source], tmp_path, "90", nvcc.CUDA_FLAGS)  # cached: no new compile
    assert again == objects and nvcc.kernel_resources(again)[0].registers == found.registers


@needs_nvcc
@needs_solution(4)
def test_compile_verbose_names_the_kernels_that_spill(tmp_path):
    # Task 4's reference promised two blocks per SM: 128 registers per thread, so it spills.
    (tmp_path / "kernels").mkdir()
    source = tmp_path / "kernels" / "attention.cu"
    reference = (REPO / "task4/solution/kernels/attention.cu").read_text()
    source.write_text(reference.replace("constexpr int MIN_BLOCKS_PER_SM = 1;", "constexpr int MIN_BLOCKS_PER_SM = 2;"))
    lines = nvcc.resource_report(nvcc.compile_kernels([source], tmp_path, "90", nvcc.CUDA_FLAGS), "90")
    assert lines[0].startswith("resources per kernel (ptxas, sm_90")
    assert "flash_attention_kernel<128, false, false>: 128 registers per thread, SPILLS" in "\n".join(lines)
    assert lines[-1].startswith("  15 kernels spill registers: flash_attention_kernel<128, false, false>")
