"""The extension loader's failures are one clear paragraph (what CI can test without a GPU)."""

import pytest
import torch

from common import build, nvcc
from common.build import BuildError
from grader import runner
from tests.conftest import REPO, needs_cuda, needs_nvcc, needs_solution


def test_no_gpu_gives_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(BuildError) as err:
        build.load_extension(2, solution=False)  # the student's kernels exist in every checkout
    message = str(err.value)
    assert ("CPU-only build" in message) or ("no CUDA GPU" in message)
    assert "Traceback" not in message


def test_compiler_errors_are_extracted_from_a_ninja_log():
    # the shape torch's loader raises on the GPU machine: the command line is on the first line
    log = ("Error building extension 'task4_student': [1/2] /usr/local/cuda/bin/nvcc -MD -MF attention.cuda.o.d "
           "-DTORCH_EXTENSION_NAME=task4_student -O3 -c /repo/task4/kernels/attention.cu -o attention.cuda.o\n"
           "FAILED: attention.cuda.o\n"
           "/repo/task4/kernels/attention.cu(215): error: expected an expression\n"
           "/repo/task4/binding.cpp:12:3: error: 'foo' was not declared in this scope\n"
           "1 error detected in the compilation of \"/repo/task4/kernels/attention.cu\".\n"
           "ninja: build stopped: subcommand failed.\n")
    shown = nvcc.compiler_errors(log).splitlines()
    assert shown == ["/repo/task4/kernels/attention.cu(215): error: expected an expression",
                     "/repo/task4/binding.cpp:12:3: error: 'foo' was not declared in this scope",
                     '1 error detected in the compilation of "/repo/task4/kernels/attention.cu".']


def test_student_and_reference_build_in_separate_folders():
    assert build.build_dir(4, True) != build.build_dir(4, False)
    assert build.build_dir(4, False).name == "task4-student"


def test_another_kernels_folder_of_the_reference_builds_apart_from_it(tmp_path, monkeypatch):
    assert build.build_dir(4, True, "tensor_cores").name == "task4-solution-tensor_cores"
    assert build.kernel_folder(4, True, "tensor_cores") == build.REPO / "task4/solution/tensor_cores"
    with pytest.raises(ValueError, match="only the reference"):
        build.kernel_folder(4, False, "tensor_cores")
    for rel in ["task4/solution/kernels/attention.cu", "task4/solution/tensor_cores/attention.cu"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"// {rel}\n")
    monkeypatch.setattr(build, "REPO", tmp_path)
    plain, other = build.reference_build(4, "90", ["-O3"]), build.reference_build(4, "90", ["-O3"], "tensor_cores")
    assert other.name.startswith("task4_solution_tensor_cores-") and plain.name.startswith("task4_solution-")
    (tmp_path / "task4/solution/tensor_cores/attention.cu").write_text("// changed\n")
    assert build.reference_build(4, "90", ["-O3"], "tensor_cores") != other  # named by its own sources
    assert build.reference_build(4, "90", ["-O3"]) == plain


def test_kernels_that_include_torch_are_refused(tmp_path, monkeypatch):
    cu = tmp_path / "attention.cu"
    cu.write_text('#include <torch/extension.h>\n__global__ void k() {}\n')
    monkeypatch.setattr(nvcc, "REPO", tmp_path)
    with pytest.raises(BuildError, match="must be plain CUDA"):
        nvcc.check_plain_cuda([cu])
    cu.write_text('#include "../solution/kernels/attention.cu"\n')
    with pytest.raises(BuildError, match="includes the reference solution"):
        nvcc.check_plain_cuda([cu])
    cu.write_text('#include <cuda_runtime.h>\n// a comment about torch/extension.h is fine\n')
    nvcc.check_plain_cuda([cu])


@pytest.mark.parametrize("task", [2, 4, 5])
def test_cuda_task_tests_skip_cleanly_without_a_gpu_and_list_the_steps_left(task, tmp_path, capsys):
    import importlib
    import json

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    test = importlib.import_module(f"task{task}.test")
    assert test.main(["--json", str(tmp_path / "r.json")]) == 0  # the skeleton, in this checkout
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "needs_cuda"
    said = capsys.readouterr().out
    assert f"still marked TODO in your files (README, Task {task}):" in said
    assert f"task{task}/kernels/" in said and ": step 1: " in said and f"python -m task{task}.compile" in said
    steps = [int(line.split(": step ")[1].split(":")[0]) for line in said.splitlines() if ": step " in line]
    assert steps == sorted(steps), said  # by step, though task 5's file holds step 5's lines before step 2's


@pytest.mark.parametrize("task, part, steps", [(4, "--half", {8, 9, 10, 11}), (4, "--backward", {12, 13, 14, 15, 16}),
                                                (2, "--gemm", {3, 4}), (5, "--half", {6})])
def test_a_part_asked_for_alone_lists_its_own_steps_left(task, part, steps, capsys):
    import importlib

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert importlib.import_module(f"task{task}.test").main([part]) == 0
    said = capsys.readouterr().out
    listed = {int(line.split(": step ")[1].split(":")[0]) for line in said.splitlines() if ": step " in line}
    assert listed == steps, said  # the skeleton marks every step TODO: each of the part's, and no other
    first, last = min(steps), max(steps)
    asked = f"steps {first}-{last}" if first < last else f"step {first}"
    assert f"still marked TODO in your files (README, Task {task}, {asked}):" in said


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy on a module imported before
@pytest.mark.parametrize("command", ["task4.compile", "task4.test", "task4.tune", "task4.profile", "task7.inference",
                                     "harness.compare", "grader"])
def test_the_handouts_commands_do_not_offer_solution_and_name_what_to_run(command, monkeypatch, capsys):
    import runpy
    import sys

    from common import impl

    monkeypatch.setattr(impl, "has_solution", lambda task: False)  # the students' handout

    def run(*args):
        monkeypatch.setattr(sys, "argv", [command, *args])
        runpy.run_module(command, run_name="__main__", alter_sys=False)

    with pytest.raises(SystemExit):
        run("--help")
    said = capsys.readouterr().out
    assert "[--solution]" not in said and "  --solution" not in said, said  # neither in the usage nor the options
    with pytest.raises(SystemExit) as stop:
        run("--solution")
    assert stop.value.code == 2
    said = capsys.readouterr().err
    assert "--solution: this checkout has no reference solution" in said and "python -m " in said, said


def test_the_published_reference_build_is_named_by_every_input(tmp_path, monkeypatch):
    for rel in ["common/build.py", "common/nvcc.py", "common/csrc/checks.h", "common/csrc/device/common.cuh",
                "task4/binding.cpp", "task4/solution/kernels/attention.cu"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"// {rel}\n")
    monkeypatch.setattr(build, "REPO", tmp_path)
    name = build.reference_build(4, "90", ["-O3"])
    assert name == build.reference_build(4, "90", ["-O3"]) and name.name.startswith("task4_solution-")
    assert name.parent == build.BUILD_ROOT / "reference"
    others = {build.reference_build(4, "80", ["-O3"]), build.reference_build(4, "90", ["-O2"])}
    for rel in ["common/nvcc.py", "common/csrc/checks.h", "common/csrc/device/common.cuh", "task4/binding.cpp",
                "task4/solution/kernels/attention.cu"]:
        text = (tmp_path / rel).read_text()
        (tmp_path / rel).write_text(text + "// changed\n")
        others.add(build.reference_build(4, "90", ["-O3"]))
        (tmp_path / rel).write_text(text)
    (tmp_path / "task4/solution/kernels/tiles.cuh").write_text("// a header the kernel includes\n")
    others.add(build.reference_build(4, "90", ["-O3"]))
    assert len(others) == 8 and name not in others


def test_a_published_build_is_whole_and_readable_by_the_class(tmp_path):
    built = tmp_path / "task4-solution" / "task4_solution.so"
    built.parent.mkdir()
    built.write_bytes(b"\x7fELF" + bytes(1000))
    built.chmod(0o755)
    published = tmp_path / "reference" / "task4_solution-0123.so"
    build._publish(built, published)
    assert published.read_bytes() == built.read_bytes() and published.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in published.parent.iterdir()] == [published.name]  # no temp file left


@needs_cuda
@needs_solution(4)
def test_the_reference_is_built_once_then_imported(tmp_path):
    """What grader.batch's prebuild relies on: a second process imports the published build, building nothing."""
    import os
    import shutil
    import subprocess
    import sys

    env = dict(os.environ, KIT_BUILD_ROOT=str(tmp_path))
    compile_4 = [sys.executable, "-m", "task4.compile", "--solution"]
    first = subprocess.run(compile_4, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0 and "built in" in first.stdout, first.stdout + first.stderr
    (published,) = (tmp_path / "reference").glob("task4_solution-*.so")
    shutil.rmtree(tmp_path / "task4-solution")  # no objects, no ninja files: only the published build is left
    check = ("import torch, task4.attention as a\n"
             "q = torch.randn(1, 2, 70, 64, device='cuda')\n"
             "ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)\n"
             "print((a.flash_attention(q, q, q, causal=True, solution=True) - ref).abs().max().item())\n")
    second = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert float(second.stdout.split()[-1]) < 1e-4
    assert not (tmp_path / "task4-solution").exists(), "the second process built the reference again"
    assert sorted((tmp_path / "reference").iterdir()) == [published]


class Notes:
    def __init__(self):
        self.notes = []

    def note(self, text):
        self.notes.append(text)


def test_a_missing_kernels_folder_of_the_reference_is_not_timed_and_not_an_error():
    from harness import bench

    report = Notes()
    assert bench.load_reference(report, 4, "no_such_folder") is None and not report.notes


def test_the_tensor_core_timing_says_what_failed_instead_of_failing_the_case():
    from checks.task4.measure import time_tensor_cores

    class Broken:
        def forward(self, *args):
            raise RuntimeError("launch failed")

    metrics = {}
    words = time_tensor_cores(Broken(), metrics, None, 1, 1, 8, 8, False, 1)
    assert words.startswith("not timed (") and "tensor_core_reference_ms" not in metrics


def test_the_skipped_work_bound_lets_float32_on_the_tensor_cores_pass(monkeypatch):
    from types import SimpleNamespace

    from harness import attention_math

    h200 = SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: h200)
    assert round(attention_math.fp32_peak_tflops()) == 68  # an H100 or H200's FFMA: 132 SMs x 128 lanes x 2 flops x 2 GHz
    assert round(attention_math.fp32_tensor_core_bound_tflops()) == 180  # 3xTF32 at 2048 TF32 flops per clock per SM


def test_only_the_perf_case_is_scored_and_the_other_head_sizes_only_time_the_reference():
    from checks.task4.measure import PERF_CASE, benchmark_cases

    scored = [c.name for c in benchmark_cases(True) if c.scored]
    assert scored == ["attention batch {} heads {} seq {} head_dim {}".format(*PERF_CASE),
                      "attention batch {} heads {} seq {} head_dim {} causal".format(*PERF_CASE)]  # calibration's keys
    assert {c.head_dim for c in benchmark_cases(False)} == {128}
    assert {c.head_dim for c in benchmark_cases(True)} == {64, 80, 128}


@needs_nvcc
def test_compile_without_a_gpu_compiles_the_kernels_alone_and_says_what_is_left(tmp_path, monkeypatch, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: compile builds the whole extension")
    monkeypatch.setattr(build, "BUILD_ROOT", tmp_path)
    assert build.compile_main(5, []) == 0  # the skeleton compiles
    said = capsys.readouterr().out
    assert "compiled task5/kernels/decode.cu, task5/kernels/decode_half.cu for sm_" in said, said
    assert "python -m task5.test there" in said
    assert build.compile_main(5, ["--extension"]) == 1  # a class's prebuild needs the extension, or to be told
    said = capsys.readouterr().out
    assert "CPU-only build" in said or "no CUDA GPU" in said
    broken = tmp_path / "kernels" / "decode.cu"
    broken.parent.mkdir()
    broken.write_text("#include <cuda_runtime.h>\n__global__ void k() { int x = ; }\n")
    monkeypatch.setattr(build, "kernel_sources", lambda task, solution, kernels=None: [broken])
    assert build.compile_main(5, []) == 1
    said = capsys.readouterr().out
    assert "compiling" in said and "decode.cu(2): error" in said and "Traceback" not in said


@needs_nvcc
def test_an_optional_file_that_does_not_compile_is_left_out_of_a_students_build_only(tmp_path, monkeypatch, capsys):
    """Task 4's bf16/fp16 file (an optional part): broken, it is left out of the student's build with its compiler
    errors kept for the part to tell, while the float32 file builds; the reference's build never leaves one out."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "attention.cu").write_text((REPO / "task4/kernels/attention.cu").read_text())
    (kernels / "attention_half.cu").write_text("#include <cuda_runtime.h>\n__global__ void k() { int x = ; }\n")
    sources = sorted(kernels.glob("*.cu"))
    monkeypatch.setattr(build, "OPTIONAL_LEFT_OUT", {})
    objects = build.compile_with_optional(4, False, sources, tmp_path, "90", nvcc.CUDA_FLAGS)
    assert [o.name.split("-")[0] for o in objects] == ["attention"]
    why = build.OPTIONAL_LEFT_OUT["task4/kernels/attention_half.cu"]
    assert "attention_half.cu(2): error" in why
    assert "task4/kernels/attention_half.cu (an optional part) is left out of the build" in capsys.readouterr().out
    with pytest.raises(BuildError, match="attention_half.cu"):
        build.compile_with_optional(4, True, sources, tmp_path, "90", nvcc.CUDA_FLAGS)
    (kernels / "attention_half.cu").write_text((REPO / "task4/kernels/attention_half.cu").read_text())
    objects = build.compile_with_optional(4, False, sorted(kernels.glob("*.cu")), tmp_path, "90", nvcc.CUDA_FLAGS)
    assert len(objects) == 2 and build.OPTIONAL_LEFT_OUT == {}  # mended: in the build, and nothing said


@needs_nvcc
def test_a_file_for_hoppers_own_instructions_builds_there_and_is_left_out_elsewhere(tmp_path):
    """`// nvcc target: sm_90a` (common/nvcc.py): wgmma exists for the target sm_90a only, so such a file compiles for
    it on a compute capability 9.0 GPU and is left out, saying why, on another; a plain file beside it builds."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    plain, hopper = kernels / "plain.cu", kernels / "hopper.cu"
    plain.write_text("#include <cuda_runtime.h>\n__global__ void plain() {}\n")
    fenced = '__global__ void fenced() { asm volatile("wgmma.fence.sync.aligned;"); }\n'
    hopper.write_text("#include <cuda_runtime.h>\n" + fenced)
    built = nvcc.compile_each([plain, hopper], tmp_path, "90", nvcc.CUDA_FLAGS)
    assert isinstance(built[hopper], BuildError) and "compiling" in str(built[hopper]), built  # plain sm_90: no wgmma
    hopper.write_text("#include <cuda_runtime.h>\n// nvcc target: sm_90a\n" + fenced)
    built = nvcc.compile_each([plain, hopper], tmp_path, "90", nvcc.CUDA_FLAGS)
    assert all(built[src].is_file() for src in (plain, hopper)), built
    assert nvcc.file_target(hopper, "90a") == "90a" and nvcc.file_target(plain, "90") == "90"
    built = nvcc.compile_each([plain, hopper], tmp_path, "80", nvcc.CUDA_FLAGS)
    assert built[plain].is_file(), built
    assert str(built[hopper]) == ("hopper.cu is written for sm_90a (compute capability 9.0: its `// nvcc target:` "
                                  "line), and this GPU is sm_80: it is left out of the build here")


# Here, not in test_prebuild.py: it asks for the reference, which the students' copy does not have.
@needs_solution(4)
def test_the_references_built_ahead_are_those_the_tests_load():
    assert runner.reference_extensions([1, 3]) == []
    assert runner.reference_extensions([7]) == [(4, None), (5, None)]
    assert runner.reference_extensions([4]) == [(4, None)]  # its tensor-core kernels: timed in its own runs only
    assert runner.reference_extensions([2]) == [(2, None)]


def test_a_build_loaded_from_one_file_is_not_loaded_from_another_in_the_same_process(tmp_path, monkeypatch):
    """Each build registers its operators under its name once a process: a second file of that name would abort
    the process as it loads, so the loader says why instead."""
    first, second = tmp_path / "a" / "task4_solution.so", tmp_path / "b" / "task4_solution.so"
    monkeypatch.setattr(build, "_LOADED_FROM", {"task4_solution": first})
    build._check_not_loaded_elsewhere("task4_solution", first)  # the same file again: Python gives back its module
    build._check_not_loaded_elsewhere("task4_student", second)  # another name
    with pytest.raises(BuildError, match="task4_solution is already loaded in this process from .*a/task4_solution.so"
                                         ".*in a new process"):
        build._check_not_loaded_elsewhere("task4_solution", second)


def test_compile_shows_nvccs_warnings_once_each(tmp_path, monkeypatch, capsys):
    if nvcc.find_nvcc() is None:
        pytest.skip("needs nvcc")
    folder = tmp_path / "kernels"
    folder.mkdir()
    cu = folder / "attention.cu"
    cu.write_text("__global__ void k(float* x) { int unused = 3; x[0] = 1.0f; }\n")
    monkeypatch.setattr(nvcc, "REPO", tmp_path)
    (tmp_path / "build").mkdir()
    objects = nvcc.compile_kernels([cu], tmp_path / "build", "90", nvcc.CUDA_FLAGS)
    said = nvcc.warnings_said(objects)
    assert said[0].startswith("nvcc's warnings, 1 (a variable 'never referenced'"), said
    assert said[1:] == ['  kernels/attention.cu(1): warning #177-D: variable "unused" was declared but never referenced']
    assert nvcc.warnings_said(nvcc.compile_kernels([cu], tmp_path / "build", "90", nvcc.CUDA_FLAGS)) == said  # cached


def test_compile_shows_ptxas_performance_losses(tmp_path):
    """Step 21's hazard: ptxas serializing the wgmma's for want of registers says so only as an 'info' line."""
    obj = tmp_path / "attention_hopper.o"
    loss = ("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
            "insufficient register resources for the function 'k'")
    obj.with_suffix(".ptxas").write_text(f"ptxas info    : Used 168 registers, used 1 barriers\n{loss}\n")
    assert nvcc.compiler_warnings([obj]) == [loss]


def test_compile_names_a_file_built_for_its_own_target(tmp_path):
    own, plain = tmp_path / "attention_hopper.cu", tmp_path / "attention.cu"
    own.write_text("// nvcc target: sm_90a\n__global__ void k() {}\n")
    plain.write_text("__global__ void k() {}\n")
    assert build._own_target(own, "90") == " (sm_90a)" and build._own_target(plain, "90") == ""
    assert build._own_target(own, "80") == ""  # left out of an A100's build: its part says so
