"""common/tasks.py is the one list of student files: it must match the skeletons and the given code."""

from harness.skeleton import generate
from common.tasks import KIT_FOLDERS, TASKS, WORKER_FOLDER
from tests.conftest import REPO


def test_student_files_are_the_skeletons():
    skeletons = sorted(str(p) for p in generate(REPO))
    if skeletons:  # the student handout has no reference files to generate from
        assert sorted(rel for t in TASKS.values() for rel in t.student_files) == skeletons


def test_given_files_exist_and_say_so():
    for task in TASKS.values():
        for rel in task.given_files:
            assert (REPO / rel).is_file(), rel
            if not rel.endswith("__init__.py"):
                head = (REPO / rel).read_text().splitlines()[:4]
                assert any("Given: not graded; edits here are not submitted" in line for line in head), rel


def test_the_worker_never_gets_the_checks_or_the_references():
    assert not [rel for t in TASKS.values() for rel in t.given_files if "solution" in rel or rel.endswith("test.py")]
    assert not [p for p in (REPO / WORKER_FOLDER).rglob("*") if p.name in ("reference.py", "checks.py", "sandbox.py")]


# What a task folder holds besides the worker's view and solution/: the commands students type. test.py and tune.py
# are thin entry points into the trusted side (checks/taskN/), which the worker never sees.
COMMANDS = {"test.py", "tune.py", "compile.py", "profile.py", "inference.py", "inference_ref.py", "compare.py"}


def test_a_task_folder_holds_the_workers_view_its_solution_and_its_commands():
    for n, task in TASKS.items():
        in_view = {*task.student_files, *task.given_files}
        for path in sorted((REPO / f"task{n}").rglob("*")):
            rel = path.relative_to(REPO).as_posix()
            if path.is_dir() or {"solution", "__pycache__"} & set(path.parts) or rel in in_view:
                continue
            assert path.name in COMMANDS, f"{rel} is neither the worker's view, solution/ nor a command: trusted " \
                                          f"code belongs in checks/task{n}/"
        for name in ("test.py", "tune.py", "compare.py"):
            thin = REPO / f"task{n}" / name
            if thin.exists():
                text = thin.read_text()
                assert len(text.splitlines()) <= 12 and f"from checks.task{n}.{thin.stem} import main" in text, f"task{n}/{name}"
    assert not [rel for t in TASKS.values() for rel in t.given_files if rel.startswith("checks/")]


def _imports(path):
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module in ("common", "harness", "grader"):
                yield from (f"{node.module}.{alias.name}" for alias in node.names)
            else:
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def test_the_workers_code_imports_only_what_its_view_holds():
    # The view is common/ and the given files: a module of harness/ or grader/ imported there fails the
    # task's worker at import ("No module named 'harness'"), and only a run of that task would tell.
    given = [rel for t in TASKS.values() for rel in (*t.given_files, *t.student_files) if rel.endswith(".py")]
    in_view = [p.relative_to(REPO) for p in sorted((REPO / WORKER_FOLDER).rglob("*.py"))]
    for rel in [*in_view, *given]:
        path = REPO / rel
        if not path.exists():  # a student file missing from this checkout
            continue
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in ("harness", "checks", "grader"), f"{rel} imports {name}, which the worker's view does not hold"
            if top == WORKER_FOLDER:
                module = REPO / (name.replace(".", "/") + ".py")
                assert module.is_file() or (REPO / name.replace(".", "/")).is_dir(), f"{rel} imports {name}"


def test_every_file_students_write_has_its_reference_and_one_function_finds_both(tmp_path):
    from common.impl import REPO, source_of

    for task in TASKS.values():
        for rel in task.student_files:
            assert source_of(rel, tmp_path, solution=False) == tmp_path / rel
            reference = source_of(rel, tmp_path, solution=True)
            assert reference.relative_to(REPO).parts[:2] == (f"task{task.number}", "solution"), reference
            assert reference.is_file() or not (REPO / f"task{task.number}" / "solution").is_dir(), reference


def test_nothing_below_the_grader_imports_it():
    # The grader runs the tasks' tests and passes them what they need (the hidden cases' file, --hidden FILE):
    # a test importing grader/ would tie the harness to the grader's layout, and break in the handout.
    below = [p for folder in KIT_FOLDERS if folder != "grader" for p in (REPO / folder).rglob("*.py")]
    assert below
    for path in below:
        found = [name for name in _imports(path) if name.split(".")[0] == "grader"]
        assert not found, f"{path.relative_to(REPO)} imports {found}"


def test_the_view_gets_commons_code_and_nothing_else_there(tmp_path):
    import os
    import subprocess

    from harness.view import copy_tree, make_view

    make_view(1, tmp_path / "student", tmp_path / "view", solution=True)
    got = sorted(p.relative_to(tmp_path / "view").as_posix() for p in (tmp_path / "view" / WORKER_FOLDER).rglob("*")
                 if p.is_file())
    tracked = subprocess.run(["git", "ls-files", WORKER_FOLDER], cwd=REPO, capture_output=True, text=True).stdout.split()
    if tracked:  # a git checkout (the handout may be an unpacked archive)
        assert got == sorted(tracked)
    # a link, an editor's backup or a cache left in the folder stays out of the view
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "reference.py").write_text("SECRET = 1\n")
    tree = tmp_path / "tree"
    (tmp_path / "tree" / "csrc").mkdir(parents=True)
    (tree / "__pycache__").mkdir()
    for rel in ("build.py", "csrc/checks.h", "build.py~", "__pycache__/build.cpython.pyc"):
        (tree / rel).write_text("x\n")
    os.symlink(tmp_path / "secret" / "reference.py", tree / "peek.py")
    os.symlink(tmp_path / "secret", tree / "folder")
    copy_tree(tree, tmp_path / "copy", suffixes=(".py", ".h"))
    copied = sorted(p.relative_to(tmp_path / "copy").as_posix() for p in (tmp_path / "copy").rglob("*"))
    assert copied == ["build.py", "csrc", "csrc/checks.h"]


def test_files_missing_from_a_checkout_are_named_in_one_note(tmp_path):
    """A checkout with one task's file only (as the known-bad submissions are): its sibling tasks' and optional
    files are named in one line, so that the first lines of the test's output are still its failures."""
    from harness.view import make_view

    student = tmp_path / "student"
    (student / "task5/kernels").mkdir(parents=True)
    (student / "task5/kernels/decode.cu").write_text((REPO / "task5/kernels/decode.cu").read_text())
    (student / "task5/kernels/decode_half.cu").symlink_to(student / "task5/kernels/decode.cu")
    notes = make_view(5, student, tmp_path / "view", solution=False)
    assert notes[0] == ("task4/kernels/attention.cu, task4/kernels/attention_half.cu, "
                        "task4/kernels/attention_backward.cu, task4/kernels/attention_hopper.cu, "
                        "task4/kernels/attention_backward_half.cu: missing, so they were not used")
    assert notes[1:] == ["task5/kernels/decode_half.cu: not a regular file (a link?), so it was not used"]


# README.md's lists that common/tasks.py decides, each between a pair of markers; a failure prints the text to put
# there, so a task or a file added to common/tasks.py reaches the README by pasting it.
def _quoted(files) -> str:
    names = [f"`{rel}`" for rel in files]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def submitted_files_text() -> str:
    """The Submitting section's list: the files students write, then the optional parts'."""
    optional = [rel for task in TASKS.values() for rel in task.optional_files]
    required = [rel for task in TASKS.values() for rel in task.student_files if rel not in optional]
    return (f"Only the files you write are graded: {_quoted(required)}, and those of the optional parts, "
            f"{_quoted(optional)} (reported, not scored).")


def task_map_text() -> str:
    """The instructors' map of each task folder: what students write, the given files in the worker's view, the
    commands students type, and the task's trusted code in checks/taskN/."""
    rows = ["| task | students write | given, in the worker's view | commands | trusted: `checks/taskN/` |",
            "|---|---|---|---|---|"]
    for n, task in TASKS.items():
        def short(rel, n=n):
            return rel.removeprefix(f"task{n}/")
        written = ", ".join(f"`{short(rel)}`" + (" (optional)" if rel in task.optional_files else "")
                            for rel in task.student_files)
        given = ", ".join(f"`{short(rel)}`" for rel in task.given_files if not rel.endswith("__init__.py"))
        commands = ", ".join(f"`{name}`" for name in sorted(COMMANDS) if (REPO / f"task{n}" / name).is_file())
        trusted = ", ".join(f"`{p.name}`" for p in sorted((REPO / "checks" / f"task{n}").glob("*.py"))
                            if p.name != "__init__.py")
        rows.append(f"| {n} | {written} | {given} | {commands} | {trusted} |")
    return "\n".join(rows)


def _between_markers(name: str) -> str | None:
    import re

    found = re.search(rf"<!-- {name}:[^\n]*-->\n(.*?)\n<!-- /{name} -->", (REPO / "README.md").read_text(), re.S)
    return found.group(1) if found else None


def test_the_readmes_list_of_submitted_files_is_common_tasks():
    """README's Submitting section names every file students hand in, the optional parts' too."""
    found = _between_markers("submitted files")
    assert found is not None, "README.md: the Submitting section's markers (<!-- submitted files: ... -->) are missing"
    expected = submitted_files_text()
    assert " ".join(found.split()) == expected, \
        f"README.md's Submitting list differs from common/tasks.py; put this between its markers:\n{expected}"


def test_the_instructors_map_of_the_task_folders_is_common_tasks():
    """The instructors' map says, for each task folder, which file is whose; the students' README has none."""
    import pytest

    if "<!-- instructors" not in (REPO / "README.md").read_text():
        pytest.skip("the students' README (python -m grader.handout) leaves out the instructors' sections")
    found = _between_markers("task map")
    assert found is not None, "README.md: the instructors' task map's markers (<!-- task map: ... -->) are missing"
    expected = task_map_text()
    assert found == expected, \
        f"README.md's task map differs from common/tasks.py and the folders; put this between its markers:\n{expected}"
