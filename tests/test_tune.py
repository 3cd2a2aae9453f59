"""harness.tune: a kernel file's constants set per configuration, each built on its own (nvcc only, no GPU)."""

import pytest

from harness import kernel_configs, tune
from common.resources import KernelResources
from tests.conftest import REPO, needs_nvcc
from tests.stand_in import stand_in  # noqa: F401  (the fixture)

KERNEL = REPO / "task4/kernels/attention.cu"  # the student's file: the skeleton in a fresh handout


def test_the_tunables_are_the_top_level_integer_constants():
    found = kernel_configs.tunables(KERNEL.read_text())
    assert {"BLOCK_ROWS", "BLOCK_COLS", "THREAD_ROWS", "THREAD_COLS", "MIN_BLOCKS_PER_SM"} <= set(found)
    assert "ROW_THREADS" not in found  # derived from the others, not set by hand


def test_a_configuration_changes_only_its_constants():
    text = KERNEL.read_text()
    changed = kernel_configs.configure(text, kernel_configs.parse_config("BLOCK_ROWS=64, THREAD_COLS=4"))
    assert kernel_configs.tunables(changed) == kernel_configs.tunables(text) | {"BLOCK_ROWS": 64, "THREAD_COLS": 4}
    assert len(changed.splitlines()) == len(text.splitlines())
    assert kernel_configs.configure(text, {}) == text


@pytest.mark.parametrize("spec, words", [("BLOCK_ROWS", "NAME=NUMBER"), ("BLOCK_ROWS=x", "NAME=NUMBER"),
                                         ("TILE=64", "TILE: not a top-level `constexpr int`")])
def test_a_bad_configuration_is_named(spec, words):
    with pytest.raises(ValueError, match=words):
        kernel_configs.configure(KERNEL.read_text(), kernel_configs.parse_config(spec))


@needs_nvcc
def test_each_configuration_builds_on_its_own_or_says_why_not(tmp_path):
    configs = [{}, {"MIN_BLOCKS_PER_SM": 2}, {"BLOCK_ROWS": 100, "THREAD_ROWS": 8}]  # as written; two blocks per SM; not whole tiles
    default, capped, ragged = kernel_configs.build_configs(KERNEL, configs, tmp_path, "90")
    assert default.error is None and default.kernels and not default.spills
    assert capped.error is None and max(k.registers for k in capped.kernels) <= 128  # 65536 / (256 threads x 2)
    assert ragged.error == "static_assert: the threads' micro-tiles cover the block's tile exactly" and not ragged.kernels
    assert KERNEL.read_text() == (REPO / "task4/kernels/attention.cu").read_text()  # the student's file untouched


PLAN = tune.Plan(task=4, kernel_file="task4/kernels/attention.cu", timed_kernel="k<128>", what="a case",
                 unit="TFLOP/s", limit="FFMA peak", configs=[], measure=None)


def _rows():
    fast = tune.Row(1, {"A": 1, "B": 2}, kernel=KernelResources("k<128>", "sm_90", registers=200),
                    occupancy={"threads": 256, "static_shared": 0, "dynamic_shared": 100 * 1024, "blocks_per_sm": 2},
                    measured=tune.Measured(ms=10.0, throughput=40.0, share=60.0))
    wrong = tune.Row(2, {"A": 2, "B": 2}, kernel=KernelResources("k<128>", "sm_90", registers=90, spill_stores=8,
                                                                 spill_loads=4),
                     measured=tune.Measured(error="wrong at batch 1: output differs"))
    unbuilt = tune.Row(3, {"A": 3, "B": 2}, error="static_assert: whole warps")
    slow = tune.Row(4, {"A": 4, "B": 2}, measured=tune.Measured(ms=20.0, throughput=20.0, share=30.0))
    return [fast, wrong, unbuilt, slow]


def test_the_table_has_a_row_per_configuration_and_marks_the_fastest_correct_one():
    rows = _rows()
    assert tune.best(rows) is rows[0]
    lines = tune.table(PLAN, rows, ["A", "B"])
    by_number = {line.split()[1] if line.startswith("*") else line.split()[0]: line for line in lines[2:-1]}
    assert by_number["1"].startswith("*") and "100.0 KB" in by_number["1"] and "10.000 ms" in by_number["1"]
    assert "8/4" in by_number["2"] and by_number["2"].endswith("wrong at batch 1: output differs")
    assert by_number["3"].endswith("static_assert: whole warps") and not by_number["4"].startswith("*")


def test_the_csv_has_the_reason_of_each_row_that_did_not_run(tmp_path):
    import csv

    tune.write_csv(tmp_path / "t.csv", PLAN, _rows(), ["A", "B"])
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert [r["correct"] for r in rows] == ["True", "False", "False", "True"]
    assert rows[0]["TFLOP/s"] == "40.0" and rows[0]["blocks_per_sm"] == "2" and rows[2]["reason"].startswith("static_assert")


def test_a_configuration_given_twice_runs_once():
    base = {"A": 1, "B": 2}
    assert tune._distinct([{}, {"A": 1}, {"B": 3}, {"A": 1, "B": 3}], base) == [{}, {"B": 3}]


def test_the_timed_kernels_figures_come_from_the_newest_build(tmp_path):
    import os

    from tests.test_resources import RECORDED

    folder = tmp_path / "worker-builds" / "task4-student"
    folder.mkdir(parents=True)
    (folder / "old.ptxas").write_text(RECORDED.replace("Used 128 registers", "Used 96 registers"))
    (folder / "new.ptxas").write_text(RECORDED)
    os.utime(folder / "old.ptxas", (1, 1))
    kernel = tune.built_kernel(tmp_path, "flash_attention_kernel<128>")
    assert kernel is not None and kernel.registers == 128 and kernel.spill_stores == 1196
    assert tune.built_kernel(tmp_path, "no_such_kernel") is None
    # a task's second kernel file builds after the first: the newest report lacks the timed kernel, an older one has it
    (folder / "other_file.ptxas").write_text("ptxas info    : Compiling entry function '_Z5otherv' for 'sm_90'\n")
    kernel = tune.built_kernel(tmp_path, "flash_attention_kernel<128>")
    assert kernel is not None and kernel.registers == 128


def test_the_host_stub_of_a_kernel_in_an_anonymous_namespace_is_found():
    from common.occupancy import host_stub_name

    # ptxas names it without the `L` (internal linkage) that the host compiler puts before the kernel's name
    ptxas = "_ZN37_GLOBAL__N__afb3315d_5_v2_cu_33f48c1627flash_attention_half_kernelI6__halfLi64ELi64ELi4ELb1EEEvv"
    stub = "_ZN37_GLOBAL__N__afb3315d_5_v2_cu_33f48c16L27flash_attention_half_kernelI6__halfLi64ELi64ELi4ELb1EEEvv"
    assert host_stub_name(ptxas, {stub: 0}) == stub
    assert host_stub_name("_Z6kernelPf", {"_Z6kernelPf": 0}) == "_Z6kernelPf"
    assert host_stub_name("_Z6kernelPf", {}) is None


def test_the_half_kernels_knobs_are_constants_of_its_file_and_skeleton():
    from checks.task4.tune import HALF_PLAN

    for path in (REPO / "task4/kernels/attention_half.cu", REPO / "task4/solution/kernels/attention_half.cu"):
        text = path.read_text()
        for config in HALF_PLAN.configs:
            kernel_configs.configure(text, config)  # an unknown name would raise
        assert HALF_PLAN.configs[0].items() <= kernel_configs.tunables(text).items(), "the first row is the file as it is"


@needs_nvcc
def test_the_half_kernel_timed_is_one_the_build_reports(tmp_path):
    """Its name comes from the constants (the launcher picks the instance): the figures shown must be its own."""
    from checks.task4.tune import HALF_PLAN

    source = REPO / "task4/solution/kernels/attention_half.cu"
    configs = [{}, {"BLOCK_COLS": 32, "BLOCK_WARPS_LARGE_D": 4}]
    for config, built in zip(configs, kernel_configs.build_configs(source, configs, tmp_path, "90", jobs=2)):
        name = HALF_PLAN.kernel_name(kernel_configs.tunables(source.read_text()) | config)
        assert built.error is None and name in [k.name for k in built.kernels], (name, [k.name for k in built.kernels])
        assert not next(k for k in built.kernels if k.name == name).spills


def test_the_hopper_kernels_knobs_are_constants_of_its_file_and_skeleton():
    from checks.task4.tune import HOPPER_PLAN

    for path in (REPO / "task4/kernels/attention_hopper.cu", REPO / "task4/solution/kernels/attention_hopper.cu"):
        text = path.read_text()
        for config in HOPPER_PLAN.configs:
            kernel_configs.configure(text, config)  # an unknown name would raise
    skeleton = kernel_configs.tunables((REPO / "task4/kernels/attention_hopper.cu").read_text())
    assert HOPPER_PLAN.configs[0].items() <= skeleton.items(), "the first row is the skeleton's start"


@needs_nvcc
def test_the_hopper_kernel_timed_is_one_the_build_reports_at_every_setting(tmp_path):
    """Built for sm_90a (its `// nvcc target:` line) at each setting: the timed instance is there, and spills nothing."""
    from checks.task4.tune import HOPPER_PLAN

    source = REPO / "task4/solution/kernels/attention_hopper.cu"
    for built in kernel_configs.build_configs(source, HOPPER_PLAN.configs, tmp_path, "90", jobs=2):
        names = [k.name for k in built.kernels]
        assert built.error is None and HOPPER_PLAN.kernel_name({}) in names, (built.error, names)
        assert not next(k for k in built.kernels if k.name == HOPPER_PLAN.kernel_name({})).spills


def test_the_16_bit_decodes_knobs_are_constants_of_its_file_and_skeleton():
    from checks.task5.tune import HALF_PLAN

    for path in (REPO / "task5/kernels/decode_half.cu", REPO / "task5/solution/kernels/decode_half.cu"):
        text = path.read_text()
        for config in HALF_PLAN.configs:
            kernel_configs.configure(text, config)  # an unknown name would raise
        assert HALF_PLAN.configs[0].items() <= kernel_configs.tunables(text).items(), "the first row is the file as it is"


@needs_nvcc
def test_the_16_bit_decode_timed_is_one_the_build_reports(tmp_path):
    """The grouped bf16 case's instance (4 query heads a block, 16-byte rows of head_dim 128, contiguous), named from
    the constants: the figures task5.tune --half shows are its own."""
    from checks.task5.tune import HALF_PLAN

    source = REPO / "task5/solution/kernels/decode_half.cu"
    for config, built in zip([{}], kernel_configs.build_configs(source, [{}], tmp_path, "90", jobs=1)):
        name = HALF_PLAN.kernel_name(kernel_configs.tunables(source.read_text()) | config)
        assert built.error is None and name in [k.name for k in built.kernels], (name, [k.name for k in built.kernels])
        assert not next(k for k in built.kernels if k.name == name).spills


def test_the_16_bit_decode_tune_measures_a_checked_timing_with_the_stand_ins(stand_in, monkeypatch):
    """task5.tune --half's measure, as the driver calls it on a configuration's worker (here the stand-ins): each
    check in both types, then the grouped bf16 case timed; a configuration whose decode is wrong is refused."""
    import torch

    from checks.task5 import tune as task5_tune
    from harness import sandbox
    from tests.stand_in import Behaviour, CudaOnTheCpu

    monkeypatch.setattr(task5_tune, "HALF_BENCHMARK", (2, 8, 2, 256, 16, torch.bfloat16))  # a CPU's size
    monkeypatch.setattr(task5_tune, "copy_gbs", lambda: 3000.0)  # the stand-in GPU's
    with CudaOnTheCpu():
        worker = sandbox.Worker(5, REPO, solution=True)
        worker.start()
        measured = task5_tune.measure_half(worker)
        assert measured.error is None and measured.ms > 0 and 0 < measured.share, measured
        stand_in.student[5] = Behaviour(half="wrong")
        worker = sandbox.Worker(5, REPO)
        worker.start()
        refused = task5_tune.measure_half(worker)
    assert refused.error.startswith("wrong at bf16") and refused.ms is None, refused
