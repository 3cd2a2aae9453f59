"""Each known-bad CUDA submission is a reference kernel file with exact edits (tests/test_cuda_submissions.py,
run on a GPU only). An edit that no longer matches the reference would fail there, and only there: here, on
any machine, every named edit must still find its text, once the edits before it are made."""

import pytest

from tests import test_cuda_submissions as bad
from tests.conftest import REPO

REFERENCE = {2: "task2/solution/kernels/attention.cu", 4: "task4/solution/kernels/attention.cu",
             5: "task5/solution/kernels/decode.cu", "4h": "task4/solution/kernels/attention_half.cu",
             "5h": "task5/solution/kernels/decode_half.cu"}


def named_edits():
    """(name, task, [(old, new), ...]): the module's edit constants (NAME_2, NAME_4, T5_NAME) and DIAGNOSED."""
    for name, value in vars(bad).items():
        task = (5 if name.startswith("T5_") else "4h" if name.startswith("H4_") else "5h" if name.startswith("H5_")
                else int(name[-1]) if name[-2:] in ("_2", "_4") else None)
        if task is None or not isinstance(value, (tuple, list)):
            continue
        pairs = [value] if isinstance(value, tuple) else value
        if all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
            yield name, task, pairs
    for name, (task, pairs, *_) in bad.DIAGNOSED.items():
        yield name, task, pairs


EDITS = list(named_edits())


def test_the_edits_are_found():
    names = {name for name, _, _ in EDITS}
    assert {"NO_ROW_GUARD_2", "NO_WAIT_FOR_V_4", "T5_READ_PAST_LENGTH", "T5_PAGED_WITHOUT_TABLE",
            "task5_splits_without_weights", "H4_V_WITHOUT_TRANS", "H5_V_READ_AS_K"} <= names


@pytest.mark.parametrize("name, task, pairs", EDITS, ids=[name for name, _, _ in EDITS])
def test_each_known_bad_edit_still_applies_to_its_reference(name, task, pairs):
    text = (REPO / REFERENCE[task]).read_text()
    for old, new in pairs:
        assert old in text, f"{name}: {old!r} is no longer in {REFERENCE[task]}: update the known-bad variant"
        text = text.replace(old, new, 1)
