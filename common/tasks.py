"""What each task is made of: the one list of the files a student writes, and the given code beside them.

Records (the TODO scan), the worker's view, the grader (what it takes from a submission)
and the handout all read this list. `tests/test_tasks.py` checks it against the skeletons
generated from the reference files, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    number: int
    student_files: tuple[str, ...]  # what the student writes (the skeletons), relative to the checkout
    given_files: tuple[str, ...]  # given code the worker runs beside them (not graded, not submitted)
    uses: tuple[int, ...] = ()  # other tasks whose student files this task's worker loads too
    cuda: bool = False  # the student's code is CUDA: the worker builds it
    # The worker records PyTorch's attention operators under a dispatch mode (common/watch.py) while
    # student Python code runs. It costs tens of microseconds per operator, too much around the
    # kernels of a whole model (tasks 6 and 7); PyTorch's attention stays blocked there all the same.
    watch_operators: bool = True
    # Student files of an optional part (reported, not scored): a submission may leave them out (the skeleton is
    # used, and no gradebook lists them missing), and one that does not compile is left out of the build, its
    # part told why, never the task.
    optional_files: tuple[str, ...] = ()


TASKS = {
    1: Task(1, ("task1/attention.py",), ("task1/__init__.py", "task1/entry.py")),
    2: Task(2, ("task2/kernels/attention.cu",),
            ("task2/__init__.py", "task2/entry.py", "task2/attention.py", "task2/binding.cpp"), cuda=True,
            watch_operators=False),
    3: Task(3, ("task3/attention.py",), ("task3/__init__.py", "task3/entry.py"), uses=(1,)),
    4: Task(4, ("task4/kernels/attention.cu", "task4/kernels/attention_half.cu",
                "task4/kernels/attention_backward.cu", "task4/kernels/attention_hopper.cu",
                "task4/kernels/attention_backward_half.cu"),
            ("task4/__init__.py", "task4/entry.py", "task4/attention.py", "task4/binding.cpp", "task4/train.py"),
            cuda=True, watch_operators=False,
            optional_files=("task4/kernels/attention_half.cu", "task4/kernels/attention_backward.cu",
                            "task4/kernels/attention_hopper.cu", "task4/kernels/attention_backward_half.cu")),
    5: Task(5, ("task5/kernels/decode.cu", "task5/kernels/decode_half.cu"),
            ("task5/__init__.py", "task5/entry.py", "task5/attention.py", "task5/binding.cpp"), uses=(4,), cuda=True,
            watch_operators=False, optional_files=("task5/kernels/decode_half.cu",)),
    6: Task(6, ("task6/attention.py",), ("task6/__init__.py", "task6/entry.py", "task6/model.py"), uses=(4, 5),
            watch_operators=False),
    7: Task(7, ("task7/attention.py",), ("task7/__init__.py", "task7/entry.py", "task7/gpt2.py"), uses=(4, 5),
            watch_operators=False),
}

# What the worker sees of the kit is the whole common/ folder (the given code students build on and the
# worker's side of the protocol) and each task's given files. The trusted side (harness/: the reference
# implementations, records, timing, the sandbox; checks/taskN/: each task's checks and measurements) and the
# grader are never in its view.
WORKER_FOLDER = "common"
# The kit's code, folder by folder: the trusted side, the grader and the tasks beside the worker's. The kit's
# fingerprint (grader/fingerprints.py) covers them all, and the suite's scans of the code read them.
KIT_FOLDERS = (WORKER_FOLDER, "harness", "checks", "grader", *(f"task{n}" for n in TASKS))


def runs_student_python(task: int) -> bool:
    """Whether the task's worker imports Python a student wrote (its own files or those of the tasks it uses)."""
    return any(rel.endswith(".py") for n in (task, *TASKS[task].uses) for rel in TASKS[n].student_files)


def student_files(task: int) -> tuple[str, ...]:
    return TASKS[task].student_files if task in TASKS else ()


def all_student_files() -> list[str]:
    return [rel for task in TASKS.values() for rel in task.student_files]
