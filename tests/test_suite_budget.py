"""The suite's own time budget (tests/conftest.py): a file over it fails the run by name."""

import subprocess
import sys

from tests.conftest import FILE_BUDGET_S, REPO, over_budget


def test_a_file_over_the_budget_is_named_and_one_within_it_is_not():
    seconds = {"tests/test_fast.py": 1.0, "tests/test_slow.py": FILE_BUDGET_S + 1, "tests/test_edge.py": FILE_BUDGET_S}
    assert over_budget(seconds) == [f"tests/test_slow.py: {FILE_BUDGET_S + 1:.0f} s"]


def test_a_run_over_the_budget_fails(tmp_path):
    """Through pytest itself, with a budget of 0 s: the run's exit status says it, and the file is named."""
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                                          "from tests.conftest import *  # noqa: F401,F403\n"
                                          "import tests.conftest as kit\nkit.FILE_BUDGET_S = 0\n")
    (tmp_path / "test_one.py").write_text("def test_passes():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert "over the 0 s budget of one test file" in proc.stdout and "test_one.py" in proc.stdout, proc.stdout
