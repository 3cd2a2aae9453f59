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


def bad_variant(task: int, relative: str, old: str, new: str, *more: tuple[str, str]) -> str:
    """The reference file with one exact change (and each of `more` after it): a known-bad submission that stays
    in step with the reference."""
    text = (REPO / f"task{task}" / "solution" / relative).read_text()
    for before, after in ((old, new), *more):
        assert before in text, f"known-bad variant no longer applies: {before!r} not in task{task}/solution/{relative}"
        text = text.replace(before, after, 1)
    return text


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


def zipped(path: Path, files: dict, links=()) -> Path:
    """A zip archive at `path` of `files` (name -> text), and `links` (names of symbolic links to /etc/passwd)."""
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16)  # a symbolic link
            zf.writestr(info, "/etc/passwd")
    return path


def submission(tmp_path, files: dict) -> Path:
    """A student checkout holding `files` (relative path -> text or bytes)."""
    sub = tmp_path / "submission"
    for rel, content in files.items():
        path = sub / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    sub.mkdir(exist_ok=True)
    return sub


# -- the suite's time --------------------------------------------------------------------------------------
# CI stops a run at 90 minutes, and a run past it does not land; the suite runs on CI's 2 cores (pytest-xdist, see
# pyproject.toml), where each test takes about twice its time alone. A file whose tests together take longer than
# half of CI's limit fails the run by name, before the suite as a whole nears the limit: make its tests cheaper
# (the kit's measurements of where the time went are in its notes) rather than raise the budget.
FILE_BUDGET_S = 2700
_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def over_budget(seconds: dict[str, float]) -> list[str]:
    return [f"{path}: {s:.0f} s" for path, s in sorted(seconds.items(), key=lambda kv: -kv[1]) if s > FILE_BUDGET_S]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput") or not _file_seconds:  # an xdist worker: the controller sums every report
        return
    slowest = sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:8]
    terminalreporter.write_line("slowest test files (seconds of their tests, setup and teardown included): "
                                + ", ".join(f"{path} {s:.0f}" for path, s in slowest))
    over = over_budget(_file_seconds)
    if over:
        terminalreporter.write_line(f"FAILED: over the {FILE_BUDGET_S} s budget of one test file "
                                    f"(tests/conftest.py): {'; '.join(over)}", red=True)


def pytest_sessionfinish(session, exitstatus):
    if not hasattr(session.config, "workerinput") and over_budget(_file_seconds) and exitstatus == 0:
        session.exitstatus = 1
