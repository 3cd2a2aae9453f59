import shutil
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit) on PATH")


def needs_solution(task: int):
    return pytest.mark.skipif(
        not (REPO / f"task{task}" / "solution").is_dir(),
        reason=f"task {task}'s reference solution is not in this checkout (student handout)",
    )


def bad_variant(task: int, relative: str, old: str, new: str) -> str:
    """The reference file with one exact change: a known-bad submission that stays in step with the reference."""
    text = (REPO / f"task{task}" / "solution" / relative).read_text()
    assert old in text, f"known-bad variant no longer applies: {old!r} not in task{task}/solution/{relative}"
    return text.replace(old, new, 1)
