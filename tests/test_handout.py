import subprocess
import sys

import pytest

from harness.skeleton import solution_files
from common.tasks import TASKS
from tests.conftest import REPO, needs_solution


def solution_lines() -> set[str]:
    """The lines students write, from the reference's BEGIN/END SOLUTION regions, long enough to be telling."""
    lines, inside = set(), False
    for path in solution_files(REPO):
        for line in path.read_text().splitlines():
            text = line.strip()
            if "BEGIN SOLUTION" in text or "END SOLUTION" in text:
                inside = "BEGIN" in text
            elif inside and len(text) >= 24 and not text.startswith(("#", "//")):
                lines.add(text)
    return lines


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    dest = tmp_path_factory.mktemp("export") / "handout"
    subprocess.run([sys.executable, "-m", "grader.handout", str(dest)], cwd=REPO, check=True, capture_output=True)
    return dest


@needs_solution(1)
def test_handout_has_no_solutions_and_blank_results(handout):
    dest = handout
    files = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert not [f for f in files if "/solution/" in f], "solutions leaked into the handout"
    assert "grader/hidden.py" not in files
    assert not [f for f in files if f.startswith("notes/")], "instructor notes leaked into the handout"
    assert {"README.md", "task1/attention.py", "task3/attention.py", "grader/__main__.py", ".ci/run"} <= files
    assert {"LICENSE", "CITATION.cff", "AGENTS.md", *ASSISTANT_POINTERS, "course.ipynb"} <= files, "left out of the handout"
    assert "Not graded yet" in (dest / "Results.md").read_text()
    assert "BEGIN SOLUTION" not in (dest / "task1/attention.py").read_text()

    # the students' README: no instructors' section, and how to hand in
    readme = (dest / "README.md").read_text()
    for words in ("For instructors", "instructors -->", "--solution", "BEGIN SOLUTION", "notes/", "hidden.py"):
        assert words not in readme, f"{words!r} in the students' README"
    assert "## Submitting" in readme and all(rel in readme for task in TASKS.values() for rel in task.student_files)
    # nothing handed out points students at the notes they do not have (the exporter says it leaves them out)
    pointing = [f for f in files if f.endswith((".py", ".cu", ".cpp", ".h", ".md", ".sh")) and f != "grader/handout.py"
                and "notes/" in (dest / f).read_text()]
    assert not pointing, f"handed-out files refer to notes/: {pointing}"
    # tests/ holds no line of the reference: the known-bad variants stay in the instructors' copy
    solution = solution_lines()
    for path in (dest / "tests").rglob("*.py"):
        text = path.read_text()
        leaked = [line for line in solution if line in text]
        assert not leaked, f"{path.relative_to(dest)} holds reference lines: {leaked[:3]}"
        assert "correction = torch.exp(m_i - m_sub)" not in text and "bad_variant(" not in text.replace(
            "def bad_variant(", "")

    # the handout grades on its own: skeletons not implemented, no crash, no hidden cases needed
    proc = subprocess.run([sys.executable, "-m", "grader", "--tasks", "1,3"], cwd=dest, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "not implemented yet" in (dest / "Results.md").read_text()


@needs_solution(1)
def test_the_students_copy_of_the_kits_tests_passes_from_the_start(handout):
    """The README says so. A test left in the handout that needs the reference, or imports a test that was left out,
    fails there and nowhere else."""
    where = subprocess.run([sys.executable, "-c", "import common; print(common.__file__)"], cwd=handout,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(handout)), f"the handout's tests would import another copy of the kit: {where}"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=handout,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.splitlines()[-1], proc.stdout[-2000:]


@needs_solution(1)
def test_handout_from_a_copy_without_git(tmp_path, monkeypatch):
    from grader import handout

    monkeypatch.setattr(handout.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(OSError("no git")))
    written = {p.as_posix() for p in handout.export(tmp_path / "h")}
    assert {"README.md", "task1/attention.py", ".ci/run"} <= written
    assert not [f for f in written if "/solution/" in f or f.startswith(("build/", ".git/", "graded/"))]


# The file names assistants that do not read AGENTS.md look for; each only points to AGENTS.md.
ASSISTANT_POINTERS = ("CLAUDE.md", "GEMINI.md", ".github/copilot-instructions.md")


def test_the_assistants_policy_names_every_graded_file_and_every_pointer_leads_to_it():
    policy = (REPO / "AGENTS.md").read_text()
    missing = [rel for task in TASKS.values() for rel in task.student_files if f"`{rel}`" not in policy]
    assert not missing, f"AGENTS.md does not name {missing}: an assistant would not know they are graded"
    for name in ASSISTANT_POINTERS:
        text = (REPO / name).read_text()
        assert "AGENTS.md" in text, name
    # Claude Code and Gemini CLI inline a file named on its own line after an @ (not inside backticks)
    for name in ("CLAUDE.md", "GEMINI.md"):
        assert "@AGENTS.md" in (REPO / name).read_text().splitlines(), f"{name} does not import AGENTS.md"
