"""Tasks 2, 4, 5, 6 and 7 graded on the CPU from end to end, with PyTorch standing in for the kernels
(tests/stand_in/). The optional parts' flows: tests/test_cuda_optional_parts.py.

The part of a CUDA task's test that runs after its checks (the benchmarks, loading the reference,
the estimate from the calibration, the record's speed fields) is never reached on a machine
without a GPU. Task 5's performance point was lost for every student when a shared loader
changed, and nothing here noticed: these tests run that part with stand-in kernels and score the
record as the grader does.
"""

import re

import pytest

from harness import bench, calibration, gpu_share
from harness.checks import HALF_TYPES
from harness.records import Report
from grader.calibrate import ratios_of
from grader.rubric import RUBRIC, estimated, score
from tests.conftest import REPO, needs_solution
from tests.stand_in import (GPU_NAME, HIDDEN, SCORED, Behaviour, Task2Kernels, Task4Kernels, Task5Kernels,  # noqa: F401
                            failed, stand_in)

pytestmark = [needs_solution(2), needs_solution(4), needs_solution(5)]
TIMED_HEAD_DIM = {4: 24, 5: 48}  # the head_dim of the scored benchmarks at the stand-in's sizes, and of no check


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
    share = re.search(r"\((\d+)% of the performance points", said[0]) if len(said) == 1 else None
    assert share and 48 <= int(share[1]) <= 50, record["notes"]  # half, less what the CPU adds around the calls
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
