"""The words a task's record and the grader's results are written in.

One place for the writer (a task's Report, the worker's client, the grader) and every reader
(scoring, Results.md, the class gradebook): a flag in an instructor's gradebook follows from these
fields, never from the wording of a message, so rewording a message cannot drop a flag.
"""


class Status:
    """A task run's status; the grader reports them in this order."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_IMPLEMENTED = "not_implemented"
    NEEDS_CUDA = "needs_cuda"
    RECORDED = (PASSED, FAILED, NOT_IMPLEMENTED, NEEDS_CUDA)  # what a test's record may say
    # the grader's own, for a task without a record
    CRASHED = "crashed"  # the test gave no usable record (cause: why, where known)
    NOT_GRADED = "not_graded"  # the machine took the grade (cause: infrastructure): no points either way, regrade
    UNAVAILABLE = "unavailable"  # the task is not in this kit


class Kind:
    """What a case counts as."""

    CHECK = "check"  # gates the points
    OPTIONAL = "optional"  # a check of an optional part: reported, not scored
    BENCHMARK = "benchmark"  # timings: the performance points
    RULE = "rule"  # a broken one scores the task 0 (PyTorch's attention, the reference's code)
    GIVEN = "given"  # a check of the given code: reported, not scored
    ALL = (CHECK, OPTIONAL, BENCHMARK, RULE, GIVEN)


class Cause:
    """Why a case failed or a task has no record, where it is more than a wrong answer."""

    TIMED_OUT = "timed_out"  # the student's code did not answer within its limit (an endless loop, a hang)
    MALFORMED = "malformed"  # a reply or record the harness refused
    INFRASTRUCTURE = "infrastructure"  # the machine, not the submission (grader/machine.py): graded again later
    ALL = (TIMED_OUT, MALFORMED, INFRASTRUCTURE)


# The cases that load the student's code: failing one (not by a hang) is "not built".
LOADING_CASES = ("build", "import")


def cause_of(item: dict) -> str | None:
    """The cause of a case, a grader's entry or a batch error. One written before causes were recorded (a
    class graded by an older kit) is read from the words those kits wrote, field by field as they did."""
    if "cause" in item:
        return item["cause"] if item["cause"] in Cause.ALL else None
    if "message" in item:  # a case
        words = str(item["message"])
        timed_out, malformed = "did not answer within" in words, "a malformed reply" in words
    else:  # a crashed task's summary, or a grading's error
        words = str(item.get("summary") or item.get("error") or "")
        timed_out, malformed = words.startswith("timed out"), "summary" in item and "malformed" in words
    return Cause.TIMED_OUT if timed_out else Cause.MALFORMED if malformed else None
