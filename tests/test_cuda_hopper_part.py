"""Task 4's Hopper part (steps 17-22) graded on the CPU from end to end, with PyTorch standing in for the kernels
(tests/stand_in/): checked in both 16-bit types, its sanitizer pass, bad input and timings beside SDPA's flash and
cuDNN backends, all optional; left out, with the reason, on a GPU other than compute capability 9.0."""

import pytest

from grader.rubric import RUBRIC, score
from tests.conftest import REPO, needs_solution
from tests.stand_in import HIDDEN, SCORED, Behaviour, CudaOnTheCpu, failed, stand_in  # noqa: F401
from tests.stand_in import gpu

pytestmark = [needs_solution(4)]


def hopper_checks(record):
    """The part's checks (named "Hopper bf16 ...", "Hopper fp16 ..."), timings left out."""
    return [c for c in record["cases"] if c["kind"] == "optional" and c["name"].startswith("Hopper ")
            and " attention batch " not in c["name"]]


def test_the_hopper_part_is_checked_in_both_types_and_scores_nothing(stand_in):
    from checks.task4 import measure
    from checks.task4 import hopper
    from checks.task4.measure import HALF_TYPES
    from checks.task4.test import HOPPER_PASS_NAME
    from grader.hidden import CASES as HIDDEN_CASES

    record = stand_in.run(4, "--solution", "--hopper", *HIDDEN)
    checks = hopper_checks(record)
    shapes = hopper.HOPPER_CASES + HIDDEN_CASES[4]["hopper"]  # the stand-in's few public shapes (tests/stand_in)
    causal = sum(1 for s in shapes if s[3] <= s[4])
    assert len(checks) == (len(HALF_TYPES) * (len(shapes) + causal + 1)  # + large scores, + the shifted tensors (bf16)
                           + len(hopper.HOPPER_SHIFTED_CASES)), [c["name"] for c in checks]
    assert all(c["passed"] and "x SDPA's" in c["message"] for c in checks), failed(record)
    passes = {c["name"]: c for c in record["cases"] if c["name"].startswith("memory-safe")}
    assert passes[HOPPER_PASS_NAME]["kind"] == "optional" and passes[HOPPER_PASS_NAME]["passed"], passes
    errors = [c for c in record["cases"] if c["name"].startswith("bad input to the Hopper kernel")]
    assert len(errors) == 1 and errors[0]["passed"], errors
    timed = [c for c in record["cases"] if c["name"].startswith("Hopper ") and " attention batch " in c["name"]]
    assert len(timed) == len(HALF_TYPES) * len(measure.HALF_BENCHMARKS) * 2, [c["name"] for c in timed]
    assert all(c["kind"] == "optional" and c["passed"] and c["message"].endswith("not scored")
               and "flash backend" in c["message"] and "cuDNN's" in c["message"]
               and "reference kernel" in c["message"] for c in timed), timed
    assert any("--hopper tests the optional part alone" in n for n in record["notes"]), record["notes"]
    graded = stand_in.run(4, "--solution", *SCORED[4], "--hopper", "--grading")
    assert hopper_checks(graded) and not [c for c in graded["cases"] if " attention batch " in c["name"]
                                          and c["name"].startswith("Hopper ")]
    assert score(4, graded)[0] == RUBRIC[4].points


def test_a_wrong_or_unwritten_hopper_kernel_fails_its_part_only(stand_in, monkeypatch, tmp_path):
    """A kernel 1% off fails the part's cases, each with the allowance, and keeps every point; one that traps or
    hangs ends the part at its first case (a hang with where hangs come from); the skeleton's part says which step
    is still to do."""
    from checks.task4.test import HOPPER_PASS_NAME

    for rel in ("task4/kernels/attention.cu", "task4/kernels/attention_hopper.cu"):  # a finished student's files
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    stand_in.student[4] = Behaviour(hopper="wrong")
    from checks.task4 import half
    compared = []
    for name in ("diagnose", "diagnose_sequences"):  # counted as they are called
        original = getattr(half, name)
        monkeypatch.setattr(half, name, lambda *a, _call=original, **k: compared.append(1) or _call(*a, **k))
    record = stand_in.run(4, "--student-dir", str(tmp_path), *SCORED[4], "--hopper")
    points, why = score(4, record)
    assert record["status"] == "passed" and points == RUBRIC[4].points, why
    wrong = [c for c in hopper_checks(record) if not c["passed"]]
    assert wrong and all("allowed" in c["message"] for c in wrong), wrong
    from checks.task4.half import DIAGNOSED_FAILURES  # none explained: the rest not compared, said once
    said = f"{len(wrong) - DIAGNOSED_FAILURES} failed case(s) were not compared with the common mistakes, after"
    assert any(said in n for n in record["notes"]), record["notes"]
    assert len(compared) == DIAGNOSED_FAILURES, len(compared)
    assert HOPPER_PASS_NAME not in {c["name"] for c in record["cases"]}  # the part failed: no pass of its own

    stand_in.student[4] = Behaviour(hopper="trap")  # a CUDA error ends the part at its first case
    record = stand_in.run(4, "--student-dir", str(tmp_path), *SCORED[4], "--hopper")
    assert record["status"] == "passed" and score(4, record)[0] == RUBRIC[4].points, failed(record)
    trapped = hopper_checks(record)
    assert len(trapped) == 1 and "unspecified launch failure" in trapped[0]["message"], trapped
    assert any("the rest of the Hopper part was not run" in n for n in record["notes"]), record["notes"]

    stand_in.student[4] = Behaviour(hopper="hang")  # a turn that never comes (step 22): no trap, the call's time
    record = stand_in.run(4, "--student-dir", str(tmp_path), *SCORED[4], "--hopper")
    assert record["status"] == "passed" and score(4, record)[0] == RUBRIC[4].points, failed(record)
    hung = hopper_checks(record)
    assert len(hung) == 1 and "did not answer within 60 s" in hung[0]["message"], hung
    assert any("the rest of the Hopper part was not run" in n for n in record["notes"]), record["notes"]
    assert any("step 22" in n and "step 20" in n for n in record["notes"]), record["notes"]

    stand_in.student[4] = Behaviour(hopper="unwritten")
    record = stand_in.run(4, *SCORED[4], "--hopper")  # the handout's skeletons: every step TODO, float32's right
    assert record["status"] == "passed", failed(record)
    said = [c["message"] for c in record["cases"] if c["kind"] == "optional" and not c["passed"]]
    assert len(said) == 1 and "not implemented yet: see README, Task 4, step 17" in said[0], said


@pytest.mark.parametrize("capability", [(8, 0), (9, 0)])
def test_the_hopper_part_runs_on_compute_capability_9_0_alone(stand_in, monkeypatch, capability):
    """On an A100 (8.0) the part says why it did not run and has no case; the other parts run as ever."""
    monkeypatch.setattr(gpu.GPU, "major", capability[0])
    monkeypatch.setattr(gpu.GPU, "minor", capability[1])
    record = stand_in.run(4, "--solution", "--half", "--hopper")
    said = [n for n in record["notes"] if "compute capability 9.0 only" in n]
    assert bool(said) == (capability != (9, 0)) and bool(hopper_checks(record)) == (capability == (9, 0)), said
    if said:
        assert said[0].endswith("not run on this GPU (8.0)"), said
    assert any(c["name"].startswith("bf16 ") and c["passed"] for c in record["cases"]), failed(record)


def test_the_hopper_sanitizer_pass_alone_says_why_it_did_not_run_off_compute_capability_9_0(stand_in, monkeypatch):
    monkeypatch.setattr(gpu.GPU, "major", 8)
    monkeypatch.setattr(gpu.GPU, "minor", 0)
    record = stand_in.run(4, "--solution", "--sanitize", "--hopper")
    said = [n for n in record["notes"] if "compute capability 9.0 only" in n]
    assert said and said[0].endswith("not run on this GPU (8.0)"), record["notes"]
    assert not [c for c in record["cases"] if "Hopper" in c["name"]], record["cases"]


def test_flash_attention_sends_16_bit_tensors_to_the_hopper_kernel_once_it_is_written(stand_in, monkeypatch, tmp_path):
    """On compute capability 9.0 the reference's bf16/fp16 attention (and with it tasks 5-7's 16-bit models) runs
    the Hopper kernel; a student's only once kernels/attention_hopper.cu marks no step TODO; float32, another GPU,
    a head_dim past 128 or hopper=False keep their kernels."""
    import torch

    from common import build
    from task4 import attention

    called = []

    def spied(solution):
        module = attention.extension(solution)
        for name in ("forward", "forward_half", "forward_hopper"):
            if not hasattr(getattr(module, name), "spied"):
                def spy(*args, _name=name, _call=getattr(module, name), **kwargs):
                    called.append(_name)
                    return _call(*args, **kwargs)
                spy.spied = True
                monkeypatch.setattr(module, name, spy)

    def kernel(dtype=torch.bfloat16, head_dim=64, solution=True, **how):
        monkeypatch.setattr(attention, "_hopper_written", {})  # asked again: the file or the GPU changed
        spied(solution)
        with CudaOnTheCpu():
            q, k, v = (torch.randn(1, 2, 70, head_dim, device="cuda", dtype=dtype) for _ in range(3))
            out = attention.flash_attention(q, k, v, True, solution=solution, **how)
        expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        assert torch.allclose(out.float(), expected, atol=2e-2), (out.float() - expected).abs().max()
        return called.pop()

    assert kernel() == kernel(torch.float16) == "forward_hopper"
    assert kernel(torch.float32) == "forward"
    assert kernel(hopper=False) == "forward_half"
    monkeypatch.setattr(attention, "HOPPER_MAX_HEAD_DIM", 32)  # the Hopper kernel's largest, standing in for 128
    assert kernel() == "forward_half"
    monkeypatch.setattr(attention, "HOPPER_MAX_HEAD_DIM", 128)
    monkeypatch.setattr(gpu.GPU, "major", 8)
    assert kernel() == "forward_half"
    monkeypatch.setattr(gpu.GPU, "major", 9)

    student = tmp_path / "task4" / "kernels"  # the student's folder: the skeleton, then a finished file
    student.mkdir(parents=True)
    monkeypatch.setattr(build, "kernel_folder", lambda task, solution, kernels=None: student)
    stand_in.worker_started(4, solution=False)  # the student's build, as a worker loads it
    (student / "attention_hopper.cu").write_text((REPO / "task4/kernels/attention_hopper.cu").read_text())
    assert kernel(solution=False) == "forward_half"
    (student / "attention_hopper.cu").write_text((REPO / "task4/solution/kernels/attention_hopper.cu").read_text())
    assert kernel(solution=False) == "forward_hopper"


def test_the_hopper_route_is_a_constant_to_torch_compile(monkeypatch, tmp_path):
    """uses_hopper asks the build and reads the student's file (its TODO lines): under torch.compile(fullgraph=True)
    that part is called once while tracing and its answer taken as a constant, never traced (a file read in the
    trace would break the graph, which fullgraph refuses)."""
    import torch

    from common import build
    from task4 import attention

    class Built:  # the build: its Hopper kernel is there, with its masks
        def has_hopper(self):
            return True

        def has_hopper_masks(self):
            return True

    # an H100, to uses_hopper only: torch.cuda itself stays as it is (torch.compile asks it about graph capture, which
    # a CUDA build of PyTorch on a machine without a driver answers with an error)
    monkeypatch.setattr(attention, "_is_hopper_gpu", lambda device: True)
    monkeypatch.setattr(attention, "extension", lambda solution=False: Built())
    monkeypatch.setattr(build, "kernel_folder", lambda task, solution, kernels=None: tmp_path)
    monkeypatch.setattr(attention, "_hopper_written", {})
    (tmp_path / "attention_hopper.cu").write_text("// every step written\n")
    torch._dynamo.reset()
    route = torch.compile(lambda q: q * 2 if attention.uses_hopper(q) else q + 1, fullgraph=True)
    q = torch.ones(1, 2, 3, 64, dtype=torch.bfloat16)
    assert torch.equal(route(q), q * 2)
    torch._dynamo.reset()
