"""common/tasks.py is the one list of student files: it must match the skeletons and the given code."""

from common.skeleton import generate
from common.tasks import TASKS, WORKER_COMMON
from tests.conftest import REPO


def test_student_files_are_the_skeletons():
    skeletons = sorted(str(p) for p in generate(REPO))
    if skeletons:  # the student handout has no reference files to generate from
        assert sorted(rel for t in TASKS.values() for rel in t.student_files) == skeletons


def test_given_files_exist_and_say_so():
    for task in TASKS.values():
        for rel in (*task.given_files, *WORKER_COMMON):
            assert (REPO / rel).is_file(), rel
        for rel in task.given_files:
            if not rel.endswith("__init__.py"):
                head = (REPO / rel).read_text().splitlines()[:4]
                assert any("Given: not graded; edits here are not submitted" in line for line in head), rel


def test_the_worker_never_gets_the_checks_reference():
    assert "common/reference.py" not in WORKER_COMMON
    assert not [rel for t in TASKS.values() for rel in t.given_files if "solution" in rel or rel.endswith("test.py")]


def test_the_worker_gets_every_common_module_its_code_imports():
    # Without one, a task's worker fails at import ("cannot import name ... from 'common'"), and only
    # a run of that task would tell.
    import ast

    shipped = {rel for rel in WORKER_COMMON if rel.endswith(".py")}
    given = [rel for t in TASKS.values() for rel in (*t.given_files, *t.student_files) if rel.endswith(".py")]
    for rel in sorted(shipped | set(given)):
        path = REPO / rel
        if not path.exists():  # a student file missing from this checkout
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module == "common":
                names = [f"common/{alias.name}.py" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("common."):
                names = [node.module.replace(".", "/") + ".py"]
            elif isinstance(node, ast.Import):
                names = [a.name.replace(".", "/") + ".py" for a in node.names if a.name.startswith("common.")]
            for name in names:
                assert name in shipped, f"{rel} imports {name}, which common/tasks.py WORKER_COMMON does not ship"


def test_every_file_students_write_has_its_reference_and_one_function_finds_both(tmp_path):
    from common.impl import REPO, source_of

    for task in TASKS.values():
        for rel in task.student_files:
            assert source_of(rel, tmp_path, solution=False) == tmp_path / rel
            reference = source_of(rel, tmp_path, solution=True)
            assert reference.relative_to(REPO).parts[:2] == (f"task{task.number}", "solution"), reference
            assert reference.is_file() or not (REPO / f"task{task.number}" / "solution").is_dir(), reference
