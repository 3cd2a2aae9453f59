"""The reference's tensor-core kernel (task4/solution/tensor_cores/attention.cu), held to task 4's checks (GPU only).

It is not graded and not in the handout, but `python -m task4.test --solution` times it beside
SDPA, so it must be as correct as the reference: the same cases against float64 with poisoned
outputs and guard bands, and clean under compute-sanitizer's memcheck and racecheck.
"""

import subprocess
import sys

import pytest
import torch

from harness import sanitize
from tests.conftest import REPO, needs_cuda, needs_solution

pytestmark = [needs_cuda, needs_solution(4)]

SMALL_CASES = [((1, 2, 5, 133, 17), False), ((1, 2, 70, 70, 64), True), ((1, 1, 129, 129, 128), True),
               ((1, 2, 65, 200, 80), False), ((2, 1, 1, 64, 88), False), ((1, 1, 150, 260, 32), True)]


class Here:
    """Calls the kernel in this process the way task4.test calls a worker."""

    def __init__(self, ext):
        self.ext = ext

    def call(self, name, *args):
        assert name == "forward"
        self.ext.forward(*args)
        torch.cuda.synchronize()


@pytest.fixture(scope="module")
def tensor_cores():
    from task4 import attention
    from checks.task4.measure import TENSOR_CORES

    return attention.extension(solution=True, kernels=TENSOR_CORES)


def test_it_passes_task4s_checks(tensor_cores):
    from harness import cli
    from checks.task4.forward import CASES, GROUPED_CASES, check_case, grouped_text, shape_text

    here = Here(tensor_cores)
    failed = []
    hidden = cli.load_hidden(str(REPO / "grader" / "hidden.py"))
    for case in cli.cases(4, "attention", CASES, hidden, shape_text, causal_ok=lambda s: s[2] <= s[3]):  # hidden too
        result = check_case(here, case.shape, case.causal, case.seed)
        failed += [] if result.passed else [f"{case.name}: {result.message}"]
    result = check_case(here, (2, 2, 150, 150, 64), True, seed=7, scale=0.3, magnitude=4.0)
    failed += [] if result.passed else [f"large scores: {result.message}"]
    for case in cli.cases(4, "grouped", GROUPED_CASES, hidden, grouped_text, causal_ok=lambda s: s[3] <= s[4]):
        result = check_case(here, case.shape, case.causal, case.seed)
        failed += [] if result.passed else [f"{case.name}: {result.message}"]
    assert not failed, "\n".join(failed)


SCRIPT = f"""
import sys, torch
sys.path.insert(0, {str(REPO)!r})
from task4 import attention
from checks.task4.measure import TENSOR_CORES
from checks.task4.forward import check_case
from tests.test_tensor_cores import Here, SMALL_CASES
here = Here(attention.extension(solution=True, kernels=TENSOR_CORES))
for n, (shape, causal) in enumerate(SMALL_CASES):
    assert check_case(here, shape, causal, seed=n).passed, shape
assert check_case(here, (2, 6, 2, 30, 140, 80, (0, 130)), True, seed=9).passed
"""


@pytest.mark.skipif(sanitize.find_sanitizer() is None, reason="needs compute-sanitizer (CUDA_HOME/bin or PATH)")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_it_is_memory_safe_and_race_free(tensor_cores, tool):
    # The fixture built it: the sanitized process imports the build instead of compiling under the sanitizer.
    proc = subprocess.run([*sanitize.command(sanitize.find_sanitizer(), tool), sys.executable, "-c", SCRIPT],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    report = sanitize.parse(proc.stdout + proc.stderr)
    assert proc.returncode == 0 and report.complete and report.errors == 0 and not report.findings, \
        (proc.stdout + proc.stderr)[-4000:]
