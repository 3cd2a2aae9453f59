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
    ALL = (TIMED_OUT, MALFORMED)


# The cases that load the student's code: failing one (not by a hang) is "not built".
LOADING_CASES = ("build", "import")


def cause_of(item: dict) -> str | None:
    """The cause of a case, a grader's entry or a batch error; for one written before causes were
    recorded (a class graded by an older kit), read from its words as those kits wrote them."""
    if "cause" in item:
        return item["cause"] if item["cause"] in Cause.ALL else None
    words = str(item.get("message") or item.get("summary") or item.get("error") or "")
    if "did not answer within" in words or words.startswith("timed out"):
        return Cause.TIMED_OUT
    if "malformed" in words:
        return Cause.MALFORMED
    return None
