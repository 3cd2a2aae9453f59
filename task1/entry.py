"""Task 1's entry points: how the checks call your code (task1/attention.py).

Given: not graded; edits here are not submitted. This runs in the worker process, beside
your code; the checks (checks/task1/test.py) run in another process and only see what these
functions return.
"""

import torch

from common.student_module import load_student_module

student = load_student_module("task1.attention")


def split_heads(x, heads):
    return student.split_heads(x, heads)


def attention_scores(q, k):
    return student.attention_scores(q, k)


def apply_causal_mask(scores):
    return student.apply_causal_mask(scores)


def attention(q, k, v, causal):
    return student.attention(q, k, v, causal=causal)


def merge_heads(x):
    return student.merge_heads(x)


def layer(hidden, heads, weights, query, key, value, causal):
    with torch.no_grad():
        mha = student.MultiHeadAttention(hidden, heads, device=query.device).load_weights(*weights)
        return mha(query, key, value, causal=causal)


def repeat(times, q, k, v, causal):
    """Run attention `times` times and wait for the GPU: the checks time the whole request."""
    for _ in range(times):
        student.attention(q, k, v, causal=causal)
    if q.is_cuda:
        torch.cuda.synchronize()
