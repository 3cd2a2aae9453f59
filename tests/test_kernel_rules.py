"""Kernel objects are held to common/kernel_rules.py: built here with `nvcc -c`, no GPU needed."""

import pytest

from common import build, kernel_rules, nvcc
from common.build import BuildError
from tests.conftest import REPO, needs_nvcc, needs_solution

ARCH = "80"  # any architecture the toolkit knows: nothing runs here
KERNEL = "__global__ void twice(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2.0f; }\n"
LAUNCHER = """
cudaError_t launch(float* x, int n, cudaStream_t stream) {
  %s
  twice<<<1, 128, 0, stream>>>(x, n);
  return cudaGetLastError();
}
"""


def compile_file(tmp_path, text, name="attention.cu", flags=()):
    folder = tmp_path / "kernels"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    out = tmp_path / "build"
    out.mkdir(exist_ok=True)
    return nvcc.compile_kernels([folder / name], out, ARCH, nvcc.CUDA_FLAGS + list(flags))


def kernel_file(host_code="", top=""):
    return "#include <cuda_runtime.h>\n" + top + KERNEL + LAUNCHER % host_code


@needs_nvcc
@needs_solution(4)
@needs_solution(5)
@pytest.mark.parametrize("task", [2, 4, 5])
def test_the_reference_and_given_kernels_keep_the_rules(task, tmp_path):
    """The given kernels too (task 5's linear): they are compiled as a student's file is, under the same rules (for
    Hopper, "90": task 4's Hopper kernel is built there alone)."""
    sources = sorted((REPO / f"task{task}/solution/kernels").glob("*.cu"))
    sources += [REPO / rel for rel in build.GIVEN_KERNELS.get(task, [])]
    objects = nvcc.compile_kernels(sources, tmp_path, "90", nvcc.CUDA_FLAGS)
    assert len(objects) == len(sources) >= 1  # tasks 4 and 5: the float32 and the bf16/fp16 kernels (and the given)
    for obj in objects:
        assert "cudaGetLastError" in kernel_rules.imported_symbols(obj)


@needs_nvcc
def test_printf_on_the_host_and_the_device_is_allowed(tmp_path):
    text = kernel_file('printf("n = %d\\n", n);', top="#include <cstdio>\n")
    text = text.replace("x[i] *= 2.0f;", 'x[i] *= 2.0f; if (i == 0) printf("x[0] = %f\\n", x[0]);')
    compile_file(tmp_path, text)
    compile_file(tmp_path, text, flags=["-Xcompiler", "-D_FORTIFY_SOURCE=2"])  # Ubuntu's default: __printf_chk


@needs_nvcc
@pytest.mark.parametrize("top, host_code, named", [
    ("#include <dlfcn.h>\n", 'void* lib = dlopen("libcublas.so", RTLD_NOW); (void)dlsym(lib, "cublasSgemm_v2");',
     "dlopen"),
    ('extern "C" int cublasCreate_v2(void** handle);\n', "void* h; cublasCreate_v2(&h);", "cublasCreate_v2"),
    ("#include <cstdio>\n", 'FILE* f = fopen("/etc/passwd", "r"); (void)f;', "fopen"),
    ("#include <thread>\n", "std::thread t([] {}); t.join();", "std::thread"),
    ("#include <unistd.h>\n", 'write(2, "x", 1);', "write"),
])
def test_libraries_files_and_threads_are_refused(tmp_path, top, host_code, named):
    with pytest.raises(BuildError) as err:
        compile_file(tmp_path, kernel_file(host_code, top))
    assert named in str(err.value) and "write the kernels yourself" in str(err.value)


@needs_nvcc
def test_a_system_call_in_inline_assembly_is_refused(tmp_path):
    host = 'long r; asm volatile("syscall" : "=a"(r) : "a"(39L) : "rcx", "r11", "memory"); (void)r;'
    with pytest.raises(BuildError, match="system call"):
        compile_file(tmp_path, kernel_file(host))


@needs_nvcc
@needs_solution(4)
def test_the_reference_included_through_a_macro_is_refused(tmp_path):
    target = REPO / "task4/solution/kernels/attention.cu"
    with pytest.raises(BuildError, match="includes .*solution"):
        compile_file(tmp_path, f'#define REFERENCE "{target}"\n#include REFERENCE\n')


@needs_nvcc
def test_a_header_beside_the_kernel_file_is_fine(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "tiles.cuh").write_text("constexpr int TILE = 32;\n")
    first = compile_file(tmp_path, '#include "tiles.cuh"\n' + kernel_file())
    assert compile_file(tmp_path, '#include "tiles.cuh"\n' + kernel_file()) == first  # cached, same object
    (tmp_path / "kernels" / "tiles.cuh").write_text("constexpr int TILE = 64;\n")
    assert compile_file(tmp_path, '#include "tiles.cuh"\n' + kernel_file()) != first  # a header change rebuilds


def test_the_allowlist():
    for name in ("cudaLaunchKernel", "__cudaRegisterFunction", "memcpy@GLIBC_2.14", "expf", "_ZSt20__throw_length_errorPKc"):
        assert kernel_rules.allowed(name), name
    for name in ("dlsym", "dlopen", "fopen", "open", "syscall", "pthread_create", "cublasSgemm_v2", "system",
                 "cudaGetDriverEntryPoint", "cudaGetFuncBySymbol", "_ZN2at4_ops4sdpa4callEv", "ptrace", "kill"):
        assert not kernel_rules.allowed(name), name


def test_dependency_files_are_read_with_continuations_and_spaces(tmp_path):
    deps = tmp_path / "a.d"
    deps.write_text("a.o : /k/attention.cu \\\n    /usr/include/stdio.h \\\n    /k/my\\ header.cuh\n")
    assert kernel_rules.included_files(deps) == [REPO.__class__(p) for p in
                                                 ("/k/attention.cu", "/usr/include/stdio.h", "/k/my header.cuh")]


@needs_nvcc
def test_an_object_is_reused_from_another_folder_with_the_same_files(tmp_path):
    # the checks' worker and the sanitizer's worker build from two views of the same files
    out = tmp_path / "build"
    out.mkdir()
    objects = []
    for view in ("checks", "sanitizer"):
        folder = tmp_path / view / "kernels"
        folder.mkdir(parents=True)
        (folder / "attention.cu").write_text(kernel_file())
        objects += nvcc.compile_kernels([folder / "attention.cu"], out, ARCH, nvcc.CUDA_FLAGS)
    assert objects[0] == objects[1]


@needs_nvcc
def test_the_device_library_is_allowed_and_a_change_to_it_rebuilds(tmp_path, monkeypatch):
    library = tmp_path / "kit" / "common" / "csrc" / "device"
    library.mkdir(parents=True)
    for header in nvcc.device_library_files():
        (library / header.name).write_text(header.read_text())
    monkeypatch.setattr(nvcc, "DEVICE_LIBRARY", library)
    text = '#include "device/common.cuh"\n' + kernel_file().replace("twice<<<1,", "twice<<<ceil_div(n, 128),")
    first = compile_file(tmp_path, text)
    assert compile_file(tmp_path, text) == first  # cached, same object
    (library / "common.cuh").write_text((library / "common.cuh").read_text() + "// changed\n")
    assert compile_file(tmp_path, text) != first  # a library change rebuilds the files that may include it


def test_a_reused_objects_library_headers_are_recognised_by_name_and_folder(tmp_path):
    """An object compiled in one worker's view is reused in another's: the library was at another path then."""
    library = tmp_path / "now" / "common" / "csrc" / "device"
    library.mkdir(parents=True)
    (library / "common.cuh").write_text("// the library\n")
    deps = tmp_path / "a.d"

    def check(*headers):
        deps.write_text("a.o : /then/task4/kernels/attention.cu " + " ".join(headers) + "\n")
        kernel_rules.check_includes(deps, "attention.cu", [], library)

    check("/then/task4/kernels/tiles.cuh", "/then/common/csrc/device/common.cuh")
    for header in ("/then/common/csrc/device/other.cuh",      # not one of the library's files
                   "/then/common/csrc/common.cuh",            # not in a device library's folder
                   "/then/task4/solution/kernels/attention.cu"):
        with pytest.raises(kernel_rules.RuleBroken, match="includes"):
            check(header)
