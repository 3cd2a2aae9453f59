"""Tasks 2, 4, 5, 6 and 7 graded on the CPU from end to end, with PyTorch standing in for the kernels
(tests/stand_in/).

The part of a CUDA task's test that runs after its checks (the benchmarks, loading the reference,
the estimate from the calibration, the record's speed fields) is never reached on a machine
without a GPU. Task 5's performance point was lost for every student when a shared loader
changed, and nothing here noticed: these tests run that part with stand-in kernels and score the
record as the grader does.
"""

import pytest
import torch

from harness import bench, calibration, gpu_share
from harness.checks import HALF_TYPES
from harness.records import Report
from grader.calibrate import ratios_of
from grader.rubric import RUBRIC, estimated, score
from common.tasks import KIT_FOLDERS
from tests.conftest import REPO, needs_solution
from tests.stand_in import (GPU_NAME, Behaviour, CudaOnTheCpu, Task2Kernels, Task4Kernels, Task5Kernels,  # noqa: F401
                             stand_in)

pytestmark = [needs_solution(2), needs_solution(4), needs_solution(5)]
HIDDEN = ("--hidden", str(REPO / "grader" / "hidden.py"))  # as the grader passes it (grader/runner.py)
TIMED_HEAD_DIM = {4: 24, 5: 48}  # the head_dim of the scored benchmarks at the stand-in's sizes, and of no check
# The scored parts alone, for a test of a bar, a point or a float32 flow: the optional parts (task 4's bf16/fp16
# kernel and backward pass, task 5's paged and 16-bit caches) move no point and take most of a run's time on the
# CPU. The reference's whole flow (the first tests below) and each optional part's own test run them.
SCORED = {4: ("--attention",), 5: ("--cache", "--decode", "--split", "--layer")}


def failed(record):
    return [f"{c['name']}: {c['message'][:300]}" for c in record["cases"] if not c["passed"]]


def scored_ratios(record, metric=bench.VS_REFERENCE):
    return [c["metrics"][metric] for c in record["cases"] if c["kind"] == "benchmark" and metric in c["metrics"]]


def test_every_cuda_task_loads_its_reference_through_one_interface(stand_in):
    for task, kernels in ((2, Task2Kernels), (4, Task4Kernels), (5, Task5Kernels)):
        report = Report(task, True, "reference loading")
        assert isinstance(bench.load_reference(report, task), kernels), report.notes
        assert report.notes == []
        assert stand_in.loads[-1] == (task, True, None)
    # task 4's other kernels folder; a task without one simply has none, and says nothing
    report = Report(4, True, "reference loading")
    assert isinstance(bench.load_reference(report, 4, "tensor_cores"), Task4Kernels) and report.notes == []
    report = Report(5, True, "reference loading")
    assert bench.load_reference(report, 5, "tensor_cores") is None and report.notes == []


def timed_last(record) -> bool:
    """Every timed case after every check (harness/gpu_share.py: a grading's tests check side by side, and a timed
    part waits until none of them is in the middle of its checks, so a check after a timing holds up the others)."""
    kinds = [c["kind"] for c in record["cases"]]
    timed_optional = [c["kind"] == "optional" and "kernel_ms" in c["metrics"] for c in record["cases"]]  # benchmarks
    checks = [i for i, kind in enumerate(kinds) if kind in ("check", "optional", "given") and not timed_optional[i]]
    return "benchmark" in kinds and kinds.index("benchmark") > max(checks)


@pytest.mark.parametrize("task", [2, 4, 5])
def test_the_reference_earns_every_point_through_the_whole_flow(stand_in, task):
    record = stand_in.run(task, "--solution", *HIDDEN)
    points, why = score(task, record)
    assert record["status"] == "passed", failed(record)
    assert points == RUBRIC[task].points, why
    kinds = {c["kind"] for c in record["cases"]}
    assert {"check", "benchmark", "rule", "given"} <= kinds
    assert any(c["name"].startswith("memory-safe") and c["passed"] for c in record["cases"])
    assert timed_last(record), [(c["kind"], c["name"]) for c in record["cases"]]
    if RUBRIC[task].performance_points:
        ratios = scored_ratios(record)
        assert ratios and "100% of the performance points" in why
        assert not any("could not be built" in note for note in record["notes"]), record["notes"]


@needs_solution(6)
@needs_solution(7)
@pytest.mark.parametrize("task", [6, 7])
def test_the_models_earn_their_points_on_the_gpu_path(stand_in, monkeypatch, task):
    """Tasks 6 and 7's GPU part (the checks with your kernels inside the model, the timings), every line of it,
    with the stand-in kernels; task 6's handout generation at the tiny size."""
    from checks.task6 import measure, test as task6_test
    from task6.model import SIZES

    monkeypatch.setattr(task6_test, "HANDOUT", measure.Run(batch=2, prompt=10, steps=6))
    monkeypatch.setitem(SIZES, "small", SIZES["tiny"])
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda *args, **kwargs: 1e3)  # the floor of a model run here
    record = stand_in.run(task, "--solution", *HIDDEN, *(("--size", "small") if task == 6 else ()))
    assert record["status"] == "passed", failed(record)
    points, why = score(task, record)
    assert points == RUBRIC[task].points, why
    gpu = [c for c in record["cases"] if c["kind"] == "check" and not c["name"].startswith("cpu")]
    assert len(gpu) >= 6 and any("padded" in c["name"] or "prompts of" in c["name"] for c in gpu)
    timed = [c for c in record["cases"] if c["kind"] == "benchmark"]
    assert timed and all(c["passed"] for c in timed)
    assert timed_last(record), [(c["kind"], c["name"]) for c in record["cases"]]
    if task == 7:  # GPT-2's size and the Llama-family model, each against its own attention
        assert [("ms_per_token" in c["metrics"]) for c in timed] == [True, True]
        from checks.task7.test import HALF_CASES  # the optional part, the models in bf16 and fp16, before the timing
        half = [c for c in record["cases"] if c["name"].split()[0] in HALF_TYPES]
        assert len(half) == len(HALF_TYPES) * len(HALF_CASES), [c["name"] for c in half]
        assert all(c["kind"] == "optional" and c["passed"] and "x the largest logit error of the same model in"
                   in c["message"] for c in half), half
        assert record["cases"].index(half[-1]) < record["cases"].index(timed[0])
    if task == 6:  # the decode step as a CUDA graph: its checks (optional) pass, and it is timed with its floor
        graph = [c for c in record["cases"] if c["name"].startswith("graph:")]
        assert len(graph) >= 2 and all(c["passed"] and c["kind"] == "optional" for c in graph), graph
        generation, half_generation = timed
        assert {"tbt_graph_ms", "ttft_floor_ms"} <= set(generation["metrics"]), generation["message"]
        # the optional part: the model in bf16 and fp16 (before the timings), and the generation run in bf16 with its
        # floor, last
        half = [c for c in record["cases"] if c["name"].split(":")[0] in HALF_TYPES]
        assert len(half) >= len(HALF_TYPES) * len(task6_test.HALF_CASES), [c["name"] for c in half]
        assert all(c["kind"] == "optional" and c["passed"] and "x the largest logit error of the same model in"
                   in c["message"] for c in half), half
        assert record["cases"].index(half[-1]) < record["cases"].index(generation)
        assert "in bfloat16" in half_generation["name"], half_generation["name"]
        ratio = half_generation["metrics"]["tbt_floor_ms"] / generation["metrics"]["tbt_floor_ms"]
        assert ratio == pytest.approx(0.5), half_generation["message"]  # 2 bytes a value: half float32's floor
        assert "against the float32 model's TBT" in half_generation["message"], half_generation["message"]
        assert {"tbt_over_float32", "tbt_graph_over_float32"} <= set(half_generation["metrics"])


@needs_solution(6)
def test_the_grader_leaves_out_the_timings_no_point_depends_on(stand_in, monkeypatch):
    """Tasks 3, 6 and 7 have no performance points: a grading runs every check of theirs (task 6's 16-bit model's
    too) and leaves their timings to the student's own run, each with a note that says so; no timed part of theirs
    holds the GPU."""
    from checks.task6 import measure, test as task6_test
    from task6.model import SIZES

    monkeypatch.setattr(task6_test, "HANDOUT", measure.Run(batch=2, prompt=10, steps=6))
    monkeypatch.setitem(SIZES, "small", SIZES["tiny"])
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda *args, **kwargs: 1e3)
    record = stand_in.run(6, "--solution", *HIDDEN, "--size", "small", "--grading")
    assert record["status"] == "passed", failed(record)
    assert not [c for c in record["cases"] if c["kind"] == "benchmark"]
    half = [c for c in record["cases"] if c["name"].split(":")[0] in HALF_TYPES]
    assert half and all(c["passed"] for c in half)
    assert any("the generation run, in float32 and in 16 bits" in note for note in record["notes"]), record["notes"]
    # task 7: test_task7s_16_bit_models_fail_on_a_wrong_16_bit_kernel_and_cost_no_point, graded there


def test_the_grader_leaves_out_task3s_timing(monkeypatch):
    """Task 3's timing against task 1 (no point depends on it) is left out of a grading with a note, before
    anything would start a worker or hold the GPU."""
    import argparse

    from checks.task3.test import run_timing

    report = Report(3, True, "FlashAttention-2")
    monkeypatch.setattr(gpu_share, "alone", None)  # a timed part would call it
    run_timing(report, None, argparse.Namespace(grading=True))
    assert not report.cases and any("the CPU and CUDA time against task 1" in n for n in report.notes)

@needs_solution(6)
def test_task6_a_step_that_passes_the_python_length_is_told_so_by_the_graph(stand_in, monkeypatch, tmp_path):
    """cache.length (a Python int) where the kernels need cache.lengths: right launched from Python; replayed from
    a CUDA graph, wrong (kept at the captured step's value) or not capturable (the int form reads key_start back).
    Step 5 is optional: its checks fail with the reason, and the score holds."""
    from checks.task6 import measure, test as task6_test
    from task6.model import SIZES
    from tests.conftest import bad_variant, submission

    monkeypatch.setattr(task6_test, "HANDOUT", measure.Run(batch=2, prompt=10, steps=6))
    monkeypatch.setitem(SIZES, "small", SIZES["tiny"])
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda *args, **kwargs: 1e3)
    text = bad_variant(6, "attention.py", "cache.k, cache.v, cache.lengths)", "cache.k, cache.v, cache.length)")
    text = text.replace("cache.lengths + 1, cache.key_start)", "cache.length + 1, cache.key_start)")
    student = submission(tmp_path, {"task6/attention.py": text})
    # float32 alone: the 16-bit models (two thirds of the run on a CPU) replay the same graph code
    record = stand_in.run(6, "--student-dir", str(student), "--size", "small", "--dtype", "float32")
    graph = {c["name"]: c["message"] for c in record["cases"] if c["name"].startswith("graph:")}
    assert graph and not any(c["passed"] for c in record["cases"] if c["name"] in graph)
    assert any("not the Python int cache.length" in m for m in graph.values()), graph
    assert any("could not be captured (CUDA error: operation not permitted" in m for m in graph.values()), graph
    assert record["status"] == "passed", failed(record)
    (generation,) = [c for c in record["cases"] if c["kind"] == "benchmark"]
    assert "with the graph is wrong" in generation["message"] and "tbt_graph_ms" not in generation["metrics"]


def test_task4s_sweep_writes_a_row_per_timed_case(stand_in, tmp_path, monkeypatch):
    import csv

    from checks.task4 import sweep

    for name, small in (("SEQS", (64, 128)), ("TOKENS", 256), ("HEADS", 2), ("HEAD_DIM", 24)):
        monkeypatch.setattr(sweep, name, small)
    monkeypatch.chdir(tmp_path)
    record = stand_in.run(4, "--solution", "--sweep", *SCORED[4])
    assert record["status"] == "passed", failed(record)
    rows = list(csv.DictReader(open(tmp_path / "task4-sweep.csv")))
    assert [(r["seq"], r["batch"], r["heads"], r["causal"]) for r in rows] == [
        ("64", "4", "2", "False"), ("64", "4", "2", "True"), ("128", "2", "2", "False"), ("128", "2", "2", "True")]
    assert all(float(r["kernel_ms"]) > 0 and r["kernel_correct"] == "True" for r in rows)


# task 5 at 2.0 is left out for two CI minutes: below a bar's lower end the points are 0 by Bar.fraction's clamp
# (harness/points.py), which task 4 at 2.0 reaches; task 5 at 1.25 checks its own bar at a value between its ends
@pytest.mark.parametrize("task, slowdown", [(4, 1.25), (4, 2.0), (5, 1.25)])
def test_a_slower_kernel_loses_performance_points_on_the_bar(stand_in, task, slowdown):
    """harness/points.py's bars: task 4 against the reference (full at 0.9x, none at 0.5x), task 5 against the copy
    bandwidth (full at 90%, none at 60%); the stand-in reference is as fast as the stand-in GPU's copy."""
    from harness.points import BARS
    stand_in.student[task] = Behaviour(slowdown=slowdown)
    record = stand_in.run(task, *SCORED[task], *HIDDEN)
    points, why = score(task, record)
    assert record["status"] == "passed", failed(record)
    values = scored_ratios(record, BARS[task].metric)
    assert values and all(abs(v - 1 / slowdown) < 0.03 for v in values), values
    correctness = RUBRIC[task].points - RUBRIC[task].performance_points
    expected = correctness + RUBRIC[task].performance_points * BARS[task].fraction(1 / slowdown)
    assert abs(points - expected) < 0.1 * RUBRIC[task].performance_points, why
    assert (points < RUBRIC[task].points - 0.2) and (slowdown < 2 or points == correctness), why


@pytest.mark.parametrize("task", [4, 5])
def test_a_kernel_whose_timed_outputs_are_wrong_gets_no_performance_points(stand_in, task):
    stand_in.student[task] = Behaviour(wrong_head_dim=TIMED_HEAD_DIM[task])
    record = stand_in.run(task, *SCORED[task], *HIDDEN)
    points, why = score(task, record)
    assert all(c["passed"] for c in record["cases"] if c["kind"] == "check"), failed(record)
    wrong = [c for c in record["cases"] if c["kind"] == "benchmark" and not c["passed"]]
    assert wrong and all("timed" in c["message"] for c in wrong), failed(record)
    assert points == RUBRIC[task].points - RUBRIC[task].performance_points, why
    assert "no performance points" in why


def test_the_handout_estimates_the_points_from_the_calibration(stand_in, tmp_path):
    from harness.points import BARS

    task = 4
    reference = stand_in.run(task, "--solution", *SCORED[task])
    found = ratios_of(task, reference)  # what python -m grader.calibrate records
    assert found and all(value > 0 for value in found.values())
    path = tmp_path / "calibration.json"
    calibration.record(task, GPU_NAME, found, {"measured": "in this test"}, path)
    stand_in.as_handout(path)
    loaded = len(stand_in.loads)

    record = stand_in.run(task, *SCORED[task])
    points, why = score(task, record)
    assert record["status"] == "passed", failed(record)
    assert scored_ratios(record) == [] and len(scored_ratios(record, calibration.ESTIMATE)) == len(found)
    assert estimated(task, record) and "an ESTIMATE" in why, why
    # The stand-in student is the reference, so the estimate is 1 up to the baseline (SDPA, a copy), which is
    # the CPU's own, timed in two runs on a machine that may be busy (the suite's other tests run beside it):
    # a bound that catches a wrong formula, and the points are the bar's for those estimates.
    estimates = scored_ratios(record, calibration.ESTIMATE)
    assert all(0.1 < e < 10 for e in estimates), estimates
    bar, rubric = BARS[task], RUBRIC[task]
    assert points == pytest.approx(rubric.points - rubric.performance_points
                                   + rubric.performance_points * bar.mean_fraction(estimates), abs=1e-3), (points, why)
    assert all(not solution for _, solution, _ in stand_in.loads[loaded:]), "the handout has no reference to load"
    said = [n for n in record["notes"] if n.startswith("performance points, an estimate from this run")]
    assert len(said) == 1 and "an ESTIMATE from grader/calibration.json" in said[0], record["notes"]


def test_task5s_points_in_the_handout_need_no_calibration_and_the_long_cache_counts_with_split_kv(stand_in):
    """Task 5's bar is the copy bandwidth of the student's own run: the handout's points are the grader's rule
    applied to its own numbers. Without split-KV the long cache of one sequence is reported, not scored."""
    from harness.points import BARS, NOT_SCORED

    stand_in.as_handout(REPO / "no calibration.json")
    stand_in.student[5] = Behaviour(slowdown=1 / 0.75)  # 75% of the copy bandwidth: half the performance points
    record = stand_in.run(5, *SCORED[5])
    points, why = score(5, record)
    assert record["status"] == "passed", failed(record)
    assert not estimated(5, record) and "ESTIMATE" not in why and "of the copy bandwidth" in why, why
    assert abs(points - (3 + BARS[5].fraction(0.75))) < 0.05, why
    said = [n for n in record["notes"] if n.startswith("performance points, an estimate from this run")]
    assert len(said) == 1 and "(50% of the performance points" in said[0], record["notes"]
    timed = [c for c in record["cases"] if c["name"].startswith("decode batch")]
    grouped = [c for c in timed if "kv heads)" in c["name"]]  # grouped-query attention: reported, never scored
    assert grouped and all("grouped-query attention is reported only" in c["message"] for c in grouped)
    assert not any(NOT_SCORED in c["metrics"] for c in timed if c not in grouped)  # split-KV passed: the rest count

    stand_in.student[5] = Behaviour(slowdown=1 / 0.75)
    record = stand_in.run(5, "--decode", "--cache", "--layer")  # no split-KV tested: one block per head
    points_without, why = score(5, record)
    timed = {c["name"]: c for c in record["cases"] if c["name"].startswith("decode batch")}
    long_cache = [c for name, c in timed.items() if name.startswith("decode batch 1 heads 1 ")]  # 1 x 1 < 2
    assert long_cache and all(NOT_SCORED in c["metrics"] and "not scored" in c["message"] for c in long_cache)
    assert any(NOT_SCORED not in c["metrics"] for c in timed.values())
    assert abs(points_without - (3 + BARS[5].fraction(0.75))) < 0.05, why


def test_task5_times_shapes_nobody_tuned_for_says_their_bound_and_scores_none(stand_in):
    """The public shapes, and with --hidden the hidden ones too (at the stand-in's sizes), each timed against a
    call over one cached position; reported, never scored: the points are those of the run without them, and a
    grading leaves them out."""
    from harness.points import NOT_SCORED
    from checks.task5 import measure
    from tests.stand_in import SMALL_HIDDEN

    def shapes(record):
        return [c for c in record["cases"] if c["name"].startswith("decode, a shape nobody tuned for")]

    public = shapes(stand_in.run(5, "--solution", *SCORED[5]))
    record = stand_in.run(5, "--solution", *SCORED[5], *HIDDEN)
    every = shapes(record)
    assert len(public) == len(measure.SHAPE_BENCHMARKS)
    assert len(every) == len(public) + len(SMALL_HIDDEN[(5, "shapes")])
    for case in every:
        m = case["metrics"]
        assert case["passed"] and NOT_SCORED in m and case["message"].endswith("not scored"), case
        assert m["bound"] == ("memory" if m["copy_ms"] > m["floor_ms"] else "launch")
        assert f"{m['bound']}-bound: the bytes take" in case["message"] and 0 < m["of_copy"] < 1.25
    hidden = [c for c in every if "heads 4 (1 kv heads) cached tokens 200 " in c["name"]]
    assert hidden and {c["name"] for c in public} < {c["name"] for c in every} - {c["name"] for c in hidden}
    graded = stand_in.run(5, "--solution", *SCORED[5], *HIDDEN, "--grading")  # no point depends on them
    assert shapes(graded) == [] and scored_ratios(graded), failed(graded)
    assert any("not scored (the shapes nobody tuned for)" in note for note in graded["notes"]), graded["notes"]
    points, why = score(5, record)
    assert points == RUBRIC[5].points, why


def test_the_stand_in_gpu_tells_a_models_device_from_a_host_tensors():
    """`.to(model.device)` moves a host tensor to the (stand-in) GPU; `.to(host_tensor.device)` does not, as on a
    real GPU, where the bindings then refuse it."""
    import torch

    from tests.stand_in import CudaOnTheCpu

    on_host = lambda t: getattr(t, "on_host", False)  # noqa: E731
    with CudaOnTheCpu():
        model = torch.nn.Linear(2, 2, device="cuda")
        tokens, key_start = torch.zeros(2, dtype=torch.long), torch.tensor([1, 2], dtype=torch.int32)
        assert on_host(tokens) and on_host(key_start)
        assert not on_host(key_start.to(model.weight.device)) and not on_host(key_start.to(device=model.weight.device))
        assert on_host(key_start.to(tokens.device)) and on_host(key_start.to(torch.device("cpu")))
        assert not on_host(key_start.cuda()) and on_host(key_start.cuda().cpu())


def test_the_stand_in_cuda_graph_replays_as_a_gpu_does(stand_in):
    """A capture runs nothing for good; a replay reads memory anew but keeps a Python value as it was captured,
    and a stand-in kernel is one launch that reads its lengths from memory; reading a value back refuses."""
    import pytest
    import torch

    from task5.attention import extension
    from tests.stand_in import CudaOnTheCpu

    ext = extension(solution=True)
    with CudaOnTheCpu():
        cache, lengths = torch.zeros(1, 1, 8, 4, device="cuda"), torch.tensor([2], dtype=torch.int32, device="cuda")
        new, step = torch.ones(1, 1, 1, 4, device="cuda"), 5
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ext.update_cache(new * step, new, cache, cache.clone(), lengths)  # step: a Python int, kept as captured
            lengths.add_(1)
        assert lengths.tolist() == [2] and not cache.any()  # the capture wrote nothing for good
        step = 7
        for _ in range(2):
            graph.replay()
        assert lengths.tolist() == [4] and cache[0, 0, :, 0].tolist() == [0, 0, 5, 5, 0, 0, 0, 0]
        with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                int(lengths[0])


def test_a_kernel_in_another_thread_leaves_a_capture_and_the_clock_alone(stand_in):
    """A sanitizer pass runs the stand-in kernels in a thread beside the checks: while one of its kernels runs, a
    capture in the checks' thread still records theirs as launches, and their clock does not count its time."""
    import threading

    import torch

    from task5.attention import extension
    from tests.stand_in import CudaOnTheCpu
    from tests.stand_in import gpu

    inside, leave = threading.Event(), threading.Event()

    def a_long_kernel():
        gpu.CLOCK.ahead += 100.0  # its modelled time, on its own thread's clock
        inside.set()
        leave.wait(timeout=60)
    beside = threading.Thread(target=gpu.run_kernel, args=(a_long_kernel, (), {}))
    beside.start()
    try:
        assert inside.wait(timeout=60)
        before = gpu.CLOCK.perf_counter()
        ext = extension(solution=True)
        with CudaOnTheCpu():
            cache, lengths = torch.zeros(1, 1, 8, 4, device="cuda"), torch.tensor([2], dtype=torch.int32, device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                new = torch.ones(1, 1, 1, 4, device="cuda")
                ext.update_cache(new, new, cache, cache.clone(), lengths)
                lengths.add_(1)
            for _ in range(2):
                graph.replay()
            assert cache[0, 0, :, 0].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]  # each replay wrote at the length it read
        assert gpu.CLOCK.perf_counter() - before < 50.0
    finally:
        leave.set()
        beside.join(timeout=60)


def test_no_real_run_can_reach_the_stand_ins():
    """The stand-ins are monkeypatches made by this test suite's fixture: no code outside tests/ imports them."""
    names = ("tests.stand_in", "import stand_in", "CudaOnTheCpu", "InProcessWorker")
    found = [f"{path.relative_to(REPO)}" for folder in KIT_FOLDERS
             for path in (REPO / folder).rglob("*.py") if any(name in path.read_text() for name in names)]
    assert found == []


def test_the_grader_leaves_out_only_the_largest_layer_timing(stand_in, monkeypatch):
    """No point depends on the handout layer at its largest batch (a second a request): the grader's run leaves it
    out and says so; the scored case and the checks of the timed outputs stay."""
    from checks.task4 import measure

    monkeypatch.setattr(measure, "HANDOUT_CASES", [(2, 64), (3, 64)])
    assert measure.layer_cases(grading=True) == [(2, 64, False), (2, 64, True)]
    record = stand_in.run(4, "--solution", *SCORED[4], *HIDDEN, "--grading")
    assert record["status"] == "passed", failed(record)
    layers = [c["name"] for c in record["cases"] if c["name"].startswith("layer batch")]
    assert layers and all(name.startswith("layer batch 2 ") for name in layers), layers
    assert any(c["name"].startswith("attention alone batch 3 ") and c["passed"] for c in record["cases"])
    assert any("the grader leaves out" in note for note in record["notes"])
    assert scored_ratios(record)


def test_task5_is_graded_on_its_own_kernels_when_task4s_prefill_is_wrong(stand_in):
    """Task 5's layer runs the prompt through Task 4's kernel. When that is wrong, the layer's checks and the
    generation run again with a prefill in plain PyTorch, labelled so: Task 5's kernels keep their points."""
    stand_in.student[4] = Behaviour(wrong_head_dim=64)  # the first layer case's head_dim (hidden 256, 4 heads)
    record = stand_in.run(5, *SCORED[5], *HIDDEN)
    points, why = score(5, record)
    assert record["status"] == "passed" and points == RUBRIC[5].points, (why, failed(record))
    layers = [c for c in record["cases"] if c["name"].startswith("layer hidden")]
    assert layers and all("the prefill in plain PyTorch" in c["message"] for c in layers)
    assert any("your Task 4 kernel, which failed here (prefill output:" in n for n in record["notes"]), record["notes"]
    generation = [c for c in record["cases"] if c["name"].startswith("generation")]
    assert generation and "TTFT with a prefill in plain PyTorch" in generation[0]["message"]


def test_task5s_generation_does_not_wait_for_a_task4_kernel_wrong_only_at_its_size(stand_in):
    stand_in.student[4] = Behaviour(wrong_head_dim=16)  # the stand-in generation's head_dim: no layer check's
    record = stand_in.run(5, *SCORED[5], *HIDDEN)
    points, why = score(5, record)
    assert record["status"] == "passed" and points == RUBRIC[5].points, (why, failed(record))
    layers = [c for c in record["cases"] if c["name"].startswith("layer hidden")]
    assert layers and not any("plain PyTorch" in c["message"] for c in layers)  # Task 4's kernel was right there
    generation = [c for c in record["cases"] if c["name"].startswith("generation")]
    assert generation and "TTFT with a prefill in plain PyTorch: your Task 4 kernel's was wrong" in generation[0]["message"]


def test_task5_keeps_its_points_when_task4_does_not_build(stand_in):
    stand_in.student[4] = Behaviour(build_error="compiling task4/kernels/attention.cu failed: error: expected ';'")
    record = stand_in.run(5, *SCORED[5], *HIDDEN)
    points, why = score(5, record)
    assert record["status"] == "passed" and points == RUBRIC[5].points, (why, failed(record))
    assert any("your Task 4 kernel, which failed here (the prefill runs your Task 4 kernel, which did not build" in n
               for n in record["notes"]), record["notes"]
    given = [c for c in record["cases"] if c["kind"] == "given"]
    assert given and all(c["passed"] for c in given)  # the given layer's checks need no Task 4 kernel


def half_checks(record):
    """The bf16/fp16 part's checks: optional cases named by their type (bf16 ..., fp16 ...), timings left out."""
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].split()[0] in ("bf16", "fp16")
            and " attention batch " not in c["name"]]


def test_task4s_half_precision_part_is_checked_in_both_types_and_scores_nothing(stand_in, tmp_path):
    """The optional bf16/fp16 kernel (steps 8-11): every public and hidden case in both types passes for the
    reference, then its own sanitizer pass, its bad input and its timings, all optional; a student's kernel 1% off
    fails those cases only, with the allowance said, and keeps every point; with the steps still TODO the part
    says which step, and the float32 part is untouched by those TODOs."""
    from checks.task4 import measure
    from checks.task4.cases import HALF_CASES
    from checks.task4.measure import HALF_TYPES
    from checks.task4.test import BACKWARD_PASS_NAME, HALF_PASS_NAME
    from grader.hidden import CASES as HIDDEN_CASES

    record = stand_in.run(4, "--solution", *SCORED[4], "--half", *HIDDEN)  # the float32 part, then this one
    checks = half_checks(record)
    shapes = HALF_CASES + HIDDEN_CASES[4]["half"]
    causal = sum(1 for s in shapes if s[3] <= s[4])
    assert len(checks) == len(HALF_TYPES) * (len(shapes) + causal + 1), [c["name"] for c in checks]  # + large scores
    assert all(c["passed"] and "x SDPA's" in c["message"] for c in checks), failed(record)
    assert sum("large scores" in c["name"] for c in checks) == len(HALF_TYPES)
    passes = {c["name"]: c for c in record["cases"] if c["name"].startswith("memory-safe")}
    assert passes[HALF_PASS_NAME]["kind"] == "optional" and passes[HALF_PASS_NAME]["passed"]
    assert [c["kind"] for name, c in passes.items() if name not in (HALF_PASS_NAME, BACKWARD_PASS_NAME)] == ["rule"]
    timed = [c for c in record["cases"] if " attention batch " in c["name"] and c["name"].split()[0] in HALF_TYPES]
    assert len(timed) == len(HALF_TYPES) * len(measure.HALF_BENCHMARKS) * 2, [c["name"] for c in timed]
    assert all(c["kind"] == "optional" and c["passed"] and c["message"].endswith("not scored")
               and "flash backend" in c["message"] and "reference kernel" in c["message"]
               and bench.VS_REFERENCE not in c["metrics"] for c in timed), timed
    assert score(4, record)[0] == RUBRIC[4].points
    graded = stand_in.run(4, "--solution", *SCORED[4], "--half", "--grading")
    assert half_checks(graded) and not [c for c in graded["cases"] if " attention batch " in c["name"]
                                        and c["name"].split()[0] in HALF_TYPES]
    assert any("the bf16/fp16 kernel against SDPA's flash backend" in n for n in graded["notes"]), graded["notes"]

    for rel in ("task4/kernels/attention.cu", "task4/kernels/attention_half.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    stand_in.student[4] = Behaviour(half="wrong")
    record = stand_in.run(4, "--student-dir", str(tmp_path), *SCORED[4], "--half")
    points, why = score(4, record)
    assert record["status"] == "passed" and points == RUBRIC[4].points, why
    wrong = [c for c in half_checks(record) if not c["passed"]]
    assert wrong and all("allowed" in c["message"] and "not implemented" not in c["message"] for c in wrong)
    assert all(c["passed"] for c in record["cases"] if c["kind"] == "check")
    assert HALF_PASS_NAME not in {c["name"] for c in record["cases"]}  # the part failed: no pass of its own

    stand_in.student[4] = Behaviour(half="unwritten")
    record = stand_in.run(4, *SCORED[4], "--half")  # the handout's skeletons: every step TODO, float32's right
    assert record["status"] == "passed", failed(record)
    said = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert len(said) == 1 and "not implemented yet: see README, Task 4, step 8" in said[0], said


def half_cache_checks(record):
    """Task 5's bf16/fp16 part (step 6): its update and decode checks, named by their type, timings left out."""
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].split()[0] in ("bf16", "fp16")
            and " cached tokens " not in c["name"]]


def test_task5s_half_precision_cache_is_checked_in_both_types_and_scores_nothing(stand_in, tmp_path):
    """The optional bf16/fp16 cache (step 6): every public and hidden update and decode case in both types passes for
    the reference, then its own sanitizer pass, its bad input and its timings, all optional; a decode 1% off fails
    those cases only and keeps every point; the skeleton's step 6 says so, the float32 parts untouched by it."""
    from checks.task4.measure import HALF_TYPES
    from checks.task5 import measure
    from checks.task5.cases import HALF_DECODE_CASES, HALF_UPDATE_CASES
    from checks.task5.half import HALF_PASS_NAME
    from grader.hidden import CASES as HIDDEN_CASES

    record = stand_in.run(5, "--solution", "--half", *HIDDEN)
    checks = half_cache_checks(record)
    cases = (len(HALF_UPDATE_CASES) + len(HIDDEN_CASES[5]["half update"]) + len(HALF_DECODE_CASES)
             + len(HIDDEN_CASES[5]["half decode"]))
    assert len(checks) == len(HALF_TYPES) * cases, [c["name"] for c in checks]
    assert all(c["passed"] for c in checks), failed(record)
    decodes = [c for c in checks if " decode " in c["name"]]
    assert decodes and all("x SDPA's" in c["message"] or "out of range: NaN" in c["message"] for c in decodes)
    passes = {c["name"]: c for c in record["cases"] if c["name"].startswith("memory-safe")}
    assert passes[HALF_PASS_NAME]["kind"] == "optional" and passes[HALF_PASS_NAME]["passed"]
    errors = [c for c in record["cases"] if c["name"].startswith("bad input to the bf16/fp16 cache")]
    assert len(errors) == 1 and errors[0]["passed"] and errors[0]["kind"] == "optional", errors
    timed = [c for c in record["cases"] if " cached tokens " in c["name"] and c["name"].split()[0] in HALF_TYPES]
    assert len(timed) == len(measure.HALF_BENCHMARKS), [c["name"] for c in timed]
    assert all(c["kind"] == "optional" and c["passed"] and c["message"].endswith("not scored")
               and "copy bandwidth" in c["message"] and "reference kernel" in c["message"] for c in timed), timed
    graded = stand_in.run(5, "--solution", "--grading", "--half")
    assert half_cache_checks(graded) and not [c for c in graded["cases"] if " cached tokens " in c["name"]
                                              and c["name"].split()[0] in HALF_TYPES]

    for rel in ("task5/kernels/decode.cu", "task5/kernels/decode_half.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    stand_in.student[5] = Behaviour(half="wrong")
    record = stand_in.run(5, "--student-dir", str(tmp_path), *SCORED[5], "--half")  # its checks before the timings
    points, why = score(5, record)
    assert record["status"] == "passed" and points == RUBRIC[5].points, why
    kinds = [c["kind"] for c in record["cases"]]
    last_half = record["cases"].index(half_cache_checks(record)[-1])
    assert "benchmark" in kinds and last_half < kinds.index("benchmark")
    wrong = [c for c in half_cache_checks(record) if not c["passed"]]
    assert wrong and all(" decode " in c["name"] and "allowed" in c["message"] for c in wrong), wrong
    assert all(c["passed"] for c in half_cache_checks(record) if " update " in c["name"])
    assert HALF_PASS_NAME not in {c["name"] for c in record["cases"]}  # the part failed: no pass of its own

    stand_in.student[5] = Behaviour(half="unwritten")
    record = stand_in.run(5, "--half")  # the handout's skeleton: step 6 TODO
    said = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert len(said) == 1 and "not implemented yet: see README, Task 5, step 6" in said[0], said
    assert any("--half tests the optional part alone" in n for n in record["notes"]), record["notes"]


def test_a_16_bit_cache_goes_to_step_6s_kernels(stand_in):
    """task5/attention.py's update_cache and decode take a bf16/fp16 cache to update_cache_half and decode_half (as
    task 4's flash_attention does for its 16-bit kernel): the cached layer, and tasks 6 and 7, run in 16 bits through
    the same functions; a 16-bit query over a float32 cache is refused with the type each needs."""
    from task5 import attention

    with CudaOnTheCpu():
        check_16_bit_cache(attention)


def check_16_bit_cache(attention):
    for dtype in (torch.bfloat16, torch.float16):
        k_cache, v_cache = (torch.zeros(2, 2, 16, 32, device="cuda", dtype=dtype) for _ in range(2))
        k_new, v_new = (torch.randn(2, 2, 5, 32, device="cuda").to(dtype) for _ in range(2))
        attention.update_cache(k_new, v_new, k_cache, v_cache, 0, solution=True)
        assert torch.equal(k_cache[:, :, :5], k_new) and torch.equal(v_cache[:, :, :5], v_new)
        q = torch.randn(2, 4, 1, 32, device="cuda").to(dtype)
        out = attention.decode(q, k_cache, v_cache, 5, solution=True)
        k, v = (c[:, :, :5].float().repeat_interleave(2, 1) for c in (k_cache, v_cache))
        expected = torch.softmax(q.float() @ k.transpose(-1, -2) / 32 ** 0.5, -1) @ v
        assert out.dtype == dtype and torch.allclose(out.float(), expected, atol=2e-2), (out.float() - expected).abs().max()
    with pytest.raises(RuntimeError, match="q must be float32"):
        attention.decode(q, torch.zeros(2, 2, 16, 32, device="cuda"), torch.zeros(2, 2, 16, 32, device="cuda"), 5,
                         solution=True)


@needs_solution(7)
def test_task7s_16_bit_models_fail_on_a_wrong_16_bit_kernel_and_cost_no_point(stand_in, monkeypatch, tmp_path):
    """Task 4's bf16/fp16 kernel 1% off: task 7's float32 models (and every point) are untouched, and its optional
    16-bit models say what is off, within what the type allows, and where to look. Graded: the generation's timing
    (no point depends on it) is left out with a note."""
    from checks.task7.test import HALF_TYPES

    (tmp_path / "task7").mkdir()
    (tmp_path / "task7/attention.py").write_text((REPO / "task7/solution/attention.py").read_text())
    stand_in.student[4] = Behaviour(half="wrong")
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda *args, **kwargs: 1e3)
    record = stand_in.run(7, "--student-dir", str(tmp_path), *HIDDEN, "--grading")
    points, why = score(7, record)
    assert record["status"] == "passed" and points == RUBRIC[7].points, why
    assert not [c for c in record["cases"] if c["kind"] == "benchmark"]
    assert any("the generation's time per token" in note for note in record["notes"]), record["notes"]
    half = [c for c in record["cases"] if c["name"].split()[0] in HALF_TYPES]
    wrong = [c["message"] for c in half if not c["passed"]]
    assert wrong and all("allowed" in m and "--half" in m for m in wrong), wrong


@needs_solution(6)
def test_task6s_16_bit_model_fails_on_a_wrong_16_bit_kernel_and_costs_no_point(stand_in, monkeypatch, tmp_path):
    """Task 5's bf16/fp16 decode 1% off: task 6's float32 model (and every point) is untouched, and its optional
    16-bit model says what is off, within what the type allows, and where to look; its generation run waits."""
    from checks.task6 import measure, test as task6_test
    from task6.model import SIZES

    monkeypatch.setattr(task6_test, "HANDOUT", measure.Run(batch=2, prompt=10, steps=6))
    monkeypatch.setitem(SIZES, "small", SIZES["tiny"])
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda *args, **kwargs: 1e3)
    (tmp_path / "task6").mkdir()
    (tmp_path / "task6/attention.py").write_text((REPO / "task6/solution/attention.py").read_text())
    stand_in.student[5] = Behaviour(half="wrong")
    record = stand_in.run(6, "--student-dir", str(tmp_path), "--size", "small")
    points, why = score(6, record)
    assert record["status"] == "passed" and points == RUBRIC[6].points, why
    half = [c for c in record["cases"] if c["name"].split(":")[0] in HALF_TYPES]
    wrong = [c["message"] for c in half if not c["passed"]]
    assert wrong and all("allowed" in m and "--half" in m for m in wrong), wrong
    assert not any("in bfloat16" in c["name"] for c in record["cases"])  # no 16-bit generation run
    assert any("generation run in 16 bits is skipped" in n for n in record["notes"]), record["notes"]


def backward_checks(record):
    """The backward part's checks (steps 12-16): optional cases named "backward ...", timings left out."""
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].startswith("backward batch ")]


def test_task4s_backward_part_is_checked_timed_and_scores_nothing(stand_in, tmp_path, monkeypatch):
    """The optional backward part (steps 12-16): every public and hidden case passes for the reference (lse, out,
    then dq, dk, dv), then its sanitizer pass, its bad input, the copy model trained through it against SDPA (its
    curves written with --backward) and its timings against SDPA's backward, all optional (a grading checks the
    training untimed and times nothing of the part); a student's dk 1% off
    fails those cases only, with the step named, and keeps every point; with the steps still TODO the part says
    which step."""
    from checks.task4 import measure_backward
    from checks.task4.cases import BACKWARD_CASES
    from checks.task4.test import BACKWARD_PASS_NAME
    from grader.hidden import CASES as HIDDEN_CASES

    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where --backward writes the training curves
    record = stand_in.run(4, "--solution", "--backward", *HIDDEN)
    checks = backward_checks(record)
    shapes = BACKWARD_CASES + HIDDEN_CASES[4]["backward"]
    causal = sum(1 for s in shapes if s[3] <= s[4])
    assert len(checks) == len(shapes) + causal + 2, [c["name"] for c in checks]  # + every score very negative
    assert all(c["passed"] and "lse " in c["message"] and "dv " in c["message"] for c in checks), failed(record)
    passes = {c["name"]: c for c in record["cases"] if c["name"].startswith("memory-safe")}
    assert passes[BACKWARD_PASS_NAME]["kind"] == "optional" and passes[BACKWARD_PASS_NAME]["passed"]
    errors = [c for c in record["cases"] if c["name"].startswith("bad input to the backward part")]
    assert len(errors) == 1 and errors[0]["passed"], errors
    training = [c for c in record["cases"] if c["name"].startswith("a model trained through your kernels")]
    assert len(training) == 1 and training[0]["passed"] and training[0]["kind"] == "optional", training
    assert "the curves agree step by step" in training[0]["message"], training[0]["message"]
    assert {"kernel_step_ms", "sdpa_step_ms", "largest_loss_gap"} <= set(training[0]["metrics"])
    assert (tmp_path / "cwd" / "task4-training.csv").exists() and "wrote task4-training.csv" in training[0]["message"]
    timed = [c for c in record["cases"] if c["name"].startswith("backward pass time: ")]
    assert len(timed) == len(measure_backward.BACKWARD_BENCHMARKS) * 2, [c["name"] for c in timed]
    assert all(c["kind"] == "optional" and c["passed"] and c["message"].endswith("not scored")
               and "SDPA's backward" in c["message"] and "reference kernels" in c["message"] for c in timed), timed
    assert any("--backward tests the optional part alone" in n for n in record["notes"]), record["notes"]

    # a grading runs the training check untimed, as a check beside the sanitizer passes, and times nothing optional
    record = stand_in.run(4, "--solution", "--backward", "--grading", *HIDDEN)
    names = [c["name"] for c in record["cases"]]
    training = [c for c in record["cases"] if c["name"].startswith("a model trained through your kernels")]
    assert len(training) == 1 and training[0]["passed"], training
    assert "not timed in a grading" in training[0]["message"] and "kernel_step_ms" not in training[0]["metrics"]
    assert names.index(training[0]["name"]) < names.index(BACKWARD_PASS_NAME)
    assert not any(name.startswith("backward pass time: ") for name in names)

    for rel in ("task4/kernels/attention.cu", "task4/kernels/attention_backward.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    stand_in.student[4] = Behaviour(backward="wrong")
    record = stand_in.run(4, "--student-dir", str(tmp_path), *SCORED[4], "--backward")
    points, why = score(4, record)
    assert record["status"] == "passed" and points == RUBRIC[4].points, why
    wrong = [c for c in backward_checks(record) if not c["passed"]]
    assert wrong and all("dk" in c["message"] and "steps 13-15" in c["message"] for c in wrong), wrong
    assert all(c["passed"] for c in record["cases"] if c["kind"] == "check")
    assert BACKWARD_PASS_NAME not in {c["name"] for c in record["cases"]}  # the part failed: no pass of its own

    stand_in.student[4] = Behaviour(backward="unwritten")
    record = stand_in.run(4, "--backward")  # the handout's skeletons: every step TODO
    said = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert len(said) == 1 and "not implemented yet: see README, Task 4, step 12" in said[0], said


def test_task4s_trainable_attention_gives_autograds_gradients(stand_in):
    """flash_attention_trainable (given) saves forward_lse's output and L and hands them to backward: autograd
    through it gives what autograd through naive attention gives, grouped heads and causal included."""
    from harness.reference import attention_gradients
    from task4.attention import flash_attention_trainable

    with CudaOnTheCpu():
        q = torch.randn(2, 4, 37, 24, device="cuda", requires_grad=True)
        k, v = (torch.randn(2, 2, 53, 24, device="cuda", requires_grad=True) for _ in range(2))
        d_out = torch.randn(2, 4, 37, 24, device="cuda")
        flash_attention_trainable(q, k, v, causal=True, solution=True).backward(d_out)
    for got, expected in zip((q.grad, k.grad, v.grad), attention_gradients(q, k, v, d_out, causal=True)):
        assert torch.allclose(got.double(), expected, atol=1e-5), (got - expected).abs().max()
