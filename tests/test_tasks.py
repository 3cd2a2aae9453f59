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
