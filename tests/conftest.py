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


def run_test(task: int, student_dir, tmp_path, *extra) -> dict:
    """Run taskN.test on a student checkout (its own worker, as the grader does); returns the record."""
    import json
    import subprocess

    record = tmp_path / f"task{task}-record.json"
    proc = subprocess.run([sys.executable, "-m", f"task{task}.test", "--student-dir", str(student_dir),
                           "--scratch", str(tmp_path / "scratch"), "--json", str(record), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert record.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(record.read_text())


def submission(tmp_path, files: dict) -> Path:
    """A student checkout holding `files` (relative path -> text or bytes)."""
    sub = tmp_path / "submission"
    for rel, content in files.items():
        path = sub / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    sub.mkdir(exist_ok=True)
    return sub
