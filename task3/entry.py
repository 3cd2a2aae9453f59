"""Task 3's entry points: how the checks call your code (task3/attention.py, and task 1's for timing).

Given: not graded; edits here are not submitted. This runs in the worker process, beside
your code; the checks (task3/test.py) run in another process and only see what these
functions return.
"""

import torch

from common.worker import load_student_module

student = load_student_module("task3.attention")


def flash(q, k, v, causal, block_rows, block_cols, return_lse):
    return student.flash_attention(q, k, v, causal=causal, block_rows=block_rows, block_cols=block_cols,
                                   return_lse=return_lse)


def flash_one_thread(q, k, v, causal, block_rows, block_cols, times=1):
    """Run `times` times on one CPU thread, returning nothing: the causal-skip check reads the CPU time this
    takes, and with more threads their spin-waiting, which varies with the machine's load, would be counted too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(times):
            student.flash_attention(q, k, v, causal=causal, block_rows=block_rows, block_cols=block_cols)
    finally:
        torch.set_num_threads(threads)


def flash_shapes(q, k, v, causal, block_rows, block_cols):
    """Run without returning the output (the memory-limit case): only whether it fits matters."""
    out = student.flash_attention(q, k, v, causal=causal, block_rows=block_rows, block_cols=block_cols)
    return tuple(out.shape) if isinstance(out, torch.Tensor) else None


def repeat(times, which, q, k, v, causal):
    """Run task 3's flash attention (or task 1's attention) `times` times; the checks time the request."""
    fn = student.flash_attention if which == "flash" else load_student_module("task1.attention").attention
    for _ in range(times):
        fn(q, k, v, causal=causal)
    if q.is_cuda:
        torch.cuda.synchronize()
