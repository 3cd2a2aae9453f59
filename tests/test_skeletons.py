"""The skeletons are generated from the reference files and must stay in sync."""

import pytest

from common.impl import remaining_todos
from harness.skeleton import REPO, MarkerError, generate, make_skeleton


def test_committed_skeletons_match_the_generator():
    stale = [str(rel) for rel, text in generate().items() if not (REPO / rel).exists() or (REPO / rel).read_text() != text]
    assert not stale, f"skeletons out of date, run `python -m harness.skeleton`: {stale}"


def test_every_region_names_a_readme_step_that_exists():
    readme = (REPO / "README.md").read_text()
    for rel, text in generate().items():
        task = rel.parts[0].removeprefix("task")
        for line in text.splitlines():
            if "TODO (README, Task" in line:
                step = line.split(f"Task {task}, ")[1].split(":")[0]  # "step 3"
                assert f"Task {task}" in readme and f"Step {step.split()[1]}" in readme.split(f"## Task {task}")[1].split("\n## ")[0], (
                    f"{rel}: {step} is not described in README's Task {task} section")


def test_each_todo_says_what_its_own_place_holds():
    """A step written in several places has a TODO per place, each saying what goes there: the same text
    twice sent a student to load operands a function already received."""
    for rel, text in generate().items():
        todos = [line.strip() for line in text.splitlines() if "TODO (README, Task" in line]
        assert len(todos) == len(set(todos)), f"{rel}: one TODO text in two places: {sorted(todos)}"


def test_a_reference_only_line_is_left_out_of_the_skeleton():
    text = "// build: python -m task4.compile\n// add --solution for the reference  [reference only]\nint x;\n"
    assert make_skeleton(text, 4, "//") == "// build: python -m task4.compile\nint x;\n"
    assert not [rel for rel, text in generate().items() if "--solution" in text], "a skeleton offers --solution"


PY = '''def f(x):
    # BEGIN SOLUTION "step 2: double it"
    return 2 * x
    # END SOLUTION
'''


def test_python_region_becomes_todo_and_raise():
    out = make_skeleton(PY, 1, "#")
    assert "return 2 * x" not in out
    assert '    # TODO (README, Task 1, step 2: double it)' in out
    namespace = {}
    exec(out, namespace)
    with pytest.raises(NotImplementedError, match="README, Task 1, step 2: double it"):
        namespace["f"](1)


def test_cuda_region_keeps_placeholder_uncommented():
    cu = ('__global__ void k(float* x) {\n'
          '  // BEGIN SOLUTION "step 1: load"\n  float v = x[0];\n  // SKELETON\n  // float v = 0.0f;\n'
          '  // END SOLUTION\n  x[1] = v;\n}\n')
    out = make_skeleton(cu, 4, "//")
    assert out == ('__global__ void k(float* x) {\n  // TODO (README, Task 4, step 1: load)\n'
                   '  float v = 0.0f;\n  x[1] = v;\n}\n')


@pytest.mark.parametrize("text, problem", [
    ('# BEGIN SOLUTION "step 1: a"\nx = 1\n', "without END"),
    ("x = 1\n# END SOLUTION\n", "outside a region"),
    ('# BEGIN SOLUTION "step 1: a"\n# BEGIN SOLUTION "step 2: b"\n# END SOLUTION\n# END SOLUTION\n', "nested"),
    ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n", "hint"),
    ("x = 1  # [skeleton: 2]\n", "belongs at the end of a `constexpr int"),
    ('# BEGIN SOLUTION "step 1: a"\n# SKELETON\nx = 0\n# END SOLUTION\n', "commented out"),
])
def test_unpaired_or_malformed_markers_are_errors(text, problem):
    with pytest.raises(MarkerError, match=problem):
        make_skeleton(text, 1, "#")


def test_remaining_todos_lists_steps_in_file_order(tmp_path):
    f = tmp_path / "a.py"
    f.write_text(make_skeleton(PY + PY.replace("step 2: double", "step 3: triple"), 1, "#"))
    assert remaining_todos(f) == ["step 2: double it", "step 3: triple it"]


def test_a_constant_marked_for_the_skeleton_starts_there():
    cu = "constexpr int A = 128;  // rows [skeleton: 64]\nconstexpr int B = 4;  // [skeleton: 1]\nconstexpr int C = 2;\n"
    assert make_skeleton(cu, 4, "//") == "constexpr int A = 64;  // rows\nconstexpr int B = 1;\nconstexpr int C = 2;\n"


def test_a_skeleton_defines_every_constant_of_the_reference_that_it_names():
    # Task 5's skeleton named MIN_KEYS_PER_SPLIT in a comment (and README step 4 did), but only the reference's
    # step 3 defined it: a student looked for it in vain.
    import re

    from common.tasks import TASKS

    constant = re.compile(r"^\s*(?:\[\[maybe_unused\]\] )?(?:static )?constexpr \w+ ([A-Z][A-Z0-9_]+)\s*=", re.M)
    for rel in [rel for t in TASKS.values() for rel in t.student_files if rel.endswith(".cu")]:
        reference = REPO / rel.replace("/kernels/", "/solution/kernels/")
        if not reference.exists():  # the handout
            continue
        skeleton = (REPO / rel).read_text()
        defined = set(constant.findall(skeleton))
        named = set(re.findall(r"\b[A-Z][A-Z0-9_]{3,}\b", skeleton))
        missing = sorted((set(constant.findall(reference.read_text())) & named) - defined)
        assert not missing, f"{rel} names {missing}, which only the reference defines"
