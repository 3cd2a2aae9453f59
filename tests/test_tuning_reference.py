"""Tuning against the reference files: the untuned starts, the default configurations, the driver (instructor-only)."""

from harness import kernel_configs, tune
from tests.conftest import REPO, needs_nvcc, needs_solution


@needs_solution(4)
@needs_solution(5)
def test_the_tunable_sizes_start_untuned_in_the_skeletons():
    for kernel in ("task4/kernels/attention.cu", "task5/kernels/decode.cu"):
        reference = kernel_configs.tunables((REPO / kernel.replace("/", "/solution/", 1)).read_text())
        skeleton = kernel_configs.tunables((REPO / kernel).read_text())
        assert skeleton.keys() == reference.keys() and skeleton != reference, kernel


@needs_nvcc
@needs_solution(4)
@needs_solution(5)
def test_every_default_configuration_passes_the_kernels_static_asserts(tmp_path):
    from checks.task4.tune import PLAN as TASK4
    from checks.task5.tune import PLAN as TASK5

    for plan in (TASK4, TASK5):
        source = REPO / plan.kernel_file.replace("/", "/solution/", 1)
        built = kernel_configs.build_configs(source, plan.configs, tmp_path / str(plan.task), "90", jobs=2)
        assert [b.error for b in built] == [None] * len(built), plan.task
        names = [plan.kernel_name(kernel_configs.tunables(source.read_text()) | config) for config in plan.configs]
        assert all(any(k.name == name for k in b.kernels) for name, b in zip(names, built)), plan.task


@needs_solution(1)
def test_the_driver_runs_each_configuration_in_a_worker_of_its_own(tmp_path):
    # Task 1 runs on the CPU: the same driver, with a file that has no constants to set.
    import torch

    def measure(worker):
        x = torch.arange(24.0).reshape(1, 2, 12)
        heads = worker.call("split_heads", x, 3)  # the reference's, in a live worker
        assert worker.restarts == 0, "the worker built for this configuration died before it was measured"
        return tune.Measured(ms=float(heads.shape[1]), throughput=1.0, share=1.0)

    def beside(worker):  # no docstring: the driver names it in its own words
        return ["SDPA: 1 ms"]

    plan = tune.Plan(task=1, kernel_file="task1/attention.py", timed_kernel="none", what="a call", unit="calls/s",
                     limit="nothing", configs=[], measure=measure, also=beside)
    source = REPO / "task1/solution/attention.py"
    rows = tune.run(plan, [{}, {"TILE": 2}], student_dir=REPO, solution=True, source=source, root=tmp_path, jobs=2,
                    say=lambda *_: None)
    assert rows[0].ok and rows[0].measured.ms == 3.0 and rows[0].kernel is None and rows[0].occupancy == {}
    assert rows[0].also == ["SDPA: 1 ms"]
    assert rows[1].error.startswith("TILE: not a top-level `constexpr int`") and not rows[1].ok
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1  # one folder per configuration that built


def test_the_timings_beside_the_file_as_it_is_say_what_they_are():
    from checks.task4.tune import HALF_PLAN, HOPPER_PLAN
    assert HALF_PLAN.also.__doc__ == "SDPA's flash backend (FlashAttention-2) at the same case, in bf16"
    assert HOPPER_PLAN.also.__doc__ == ("SDPA's flash backend (FlashAttention-2) and cuDNN backend at the same case, "
                                        "in bf16")
