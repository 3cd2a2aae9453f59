"""Task 4's backward timings (checks/task4/measure_backward.py): a request runs enough distinct input sets that the
worker's round trip is small next to it (the bf16 sizes), one where a set is large (the float32 ones), and every set
of a request is checked, a fault named with its set."""

import math

import pytest
import torch

from harness.attention_math import attention_gradients
from tests.stand_in import CudaOnTheCpu, stand_in  # noqa: F401


def test_the_bf16_sizes_run_several_sets_a_request_and_the_float32_ones_one():
    from checks.task4.measure_backward import BACKWARD_BENCHMARKS, BACKWARD_HALF_BENCHMARKS, backward_sets_count

    assert all(backward_sets_count(*size, causal) == 1 for size in BACKWARD_BENCHMARKS for causal in (False, True))
    assert all(backward_sets_count(*size, causal, torch.bfloat16) >= 4
               for size in BACKWARD_HALF_BENCHMARKS for causal in (False, True))


def test_every_set_of_a_request_is_checked_and_a_fault_names_its_set(stand_in, monkeypatch):
    """Three sets: right gradients in each pass; set 2's dk off, or a band written past set 3's dv, fails, named."""
    from checks.task4 import measure_backward

    monkeypatch.setattr(measure_backward, "backward_sets_count", lambda *args: 3)
    scale = 1 / math.sqrt(8)
    with CudaOnTheCpu():
        timed = measure_backward.BackwardSets(1, 2, 16, 8, True, scale)
        assert timed.count == 3 and len(timed.sets) == 3 and len({id(s[0]) for s in timed.sets}) == 3

        def request():
            timed.refresh()
            for q, k, v, _, dout, _, dq, dk, dv in timed.sets:
                for t, want in zip((dq, dk, dv), attention_gradients(q, k, v, dout, True, scale)):
                    t.copy_(want)
        request()
        timed.check(True, scale)
        request()
        timed.sets[1][7].add_(1.0)  # set 2's dk
        with pytest.raises(AssertionError, match="dk of a timed run, set 2 of 3"):
            timed.check(True, scale)
        request()
        timed.guarded[2][1][2].buffer[-1] = 0.0  # set 3's dv: the band after it
        with pytest.raises(AssertionError, match="in set 3 of 3 of a timed run"):
            timed.check(True, scale)
