"""The GPU's known-bad submissions are the references with exact edits: each edit must still apply (CPU).

tests/test_cuda_submissions.py runs only where there is a GPU; a reference renamed since (a variable, a comment)
would turn its known-bad variant into an assertion error there, days later. Here CI sees it.
"""

import pytest

from tests.conftest import REPO, needs_solution
from tests.test_cuda_hopper_submissions import EDITS as HOPPER_EDITS, HOPPER_REFERENCE
from tests.test_cuda_masks_submissions import (BACKWARD_EDITS as BACKWARD_MASKS_EDITS, BACKWARD_REFERENCE,
                                               EDITS as MASKS_EDITS, HOPPER_EDITS as HOPPER_MASKS_EDITS,
                                               MASKS_REFERENCE)
from tests.test_cuda_submissions import DIAGNOSED, EDITS_BY_REFERENCE
from tests import test_cuda_backward_half_submissions as backward_half

CASES = [(reference, edit) for reference, edits in {**EDITS_BY_REFERENCE, HOPPER_REFERENCE: HOPPER_EDITS}.items()
         for edit in edits]
CASES += [(MASKS_REFERENCE, edit) for edit, _ in MASKS_EDITS.values()]
CASES += [(HOPPER_REFERENCE, edit) for edit, _ in HOPPER_MASKS_EDITS.values()]
CASES += [(BACKWARD_REFERENCE, edit) for edit, _ in BACKWARD_MASKS_EDITS.values()]
CASES += [(f"task{task}/solution/kernels/{'decode' if task == 5 else 'attention'}.cu", edit)
          for task, edits, *_ in DIAGNOSED.values() for edit in edits]
CASES += [(backward_half.HALF_BACKWARD_REFERENCE, edit) for edit in backward_half.HALF_BACKWARD_EDITS]
CASES += [("task4/solution/kernels/attention_half.cu", backward_half.LSE_WITHOUT_THE_SUM)]


@needs_solution(4)
@pytest.mark.parametrize("reference, edit", CASES, ids=[f"{r.split('/')[0]}_{i}" for i, (r, _) in enumerate(CASES)])
def test_each_known_bad_edit_still_applies_to_its_reference(reference, edit):
    old, new = edit
    text = (REPO / reference).read_text()
    assert old in text, f"known-bad variant no longer applies: {old!r} not in {reference}"
    assert old != new
