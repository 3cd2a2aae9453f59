"""Task 3's entry points: how the checks call your code (task3/attention.py, and task 1's for timing).

Given: not graded; edits here are not submitted. This runs in the worker process, beside
your code; the checks (checks/task3/test.py) run in another process and only see what these
functions return.
"""

import contextlib
import inspect
from types import ModuleType

import torch
from torch.autograd.variable import Variable

from common.student_module import load_student_module

student = load_student_module("task3.attention")

MASK_STEPS = {"window_left": 9, "cu_seqlens": 10, "softcap": 11}  # the masks beyond causal: where each is written


def _masked(fn, masks, step=None):
    """masks (window_left, cu_seqlens, softcap: those a case uses), once fn takes them: a file from before the
    masks were in the handout is told what to copy rather than failing with a TypeError."""
    masks = masks or {}
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return masks
    if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        return masks
    missing = [name for name in masks if name not in parameters]
    if missing:
        raise NotImplementedError(
            f"see README, Task 3, step {step or MASK_STEPS[missing[0]]}: your {fn.__name__} takes no {missing[0]} "
            f"argument: copy its new signature from the handout's task3/attention.py"
            + (" (and FlashAttention's forward and backward, which pass the masks on: step 6)" if step == 12 else ""))
    return masks


def flash(q, k, v, causal, block_rows, block_cols, return_lse, masks=None):
    return student.flash_attention(q, k, v, causal=causal, block_rows=block_rows, block_cols=block_cols,
                                   return_lse=return_lse, **_masked(student.flash_attention, masks))


_staged = []  # the timed runs' inputs (stage_runs), sent apart so that a timed request's CPU time is the runs' alone


def stage_runs(runs):
    """The inputs of the next timed request: fresh ones for every run, so no run can reuse another's work."""
    _staged[:] = runs


@contextlib.contextmanager
def _one_thread():
    """The skip checks read the CPU time a request takes: on one thread (with more, their spin-waiting, which varies
    with the machine's load, would be counted too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def flash_one_thread(causal, block_rows, block_cols, masks=None):
    """flash_attention on each staged (q, k, v) once, on one CPU thread: every output, which the checks compare."""
    masks, runs = _masked(student.flash_attention, masks), list(_staged)
    _staged.clear()
    with _one_thread():
        return [student.flash_attention(q, k, v, causal=causal, block_rows=block_rows, block_cols=block_cols, **masks)
                for q, k, v in runs]


def flash_limited(q, k, v, causal, block_rows, block_cols, masks=None):
    """The memory-limit case: the output, which the checks compare on a sample of its rows."""
    return student.flash_attention(q, k, v, causal=causal, block_rows=block_rows, block_cols=block_cols,
                                   **_masked(student.flash_attention, masks))


# -- the optional backward pass (steps 6-8) ---------------------------------------------------------------------


def _trainable():
    if not all(hasattr(student, name) for name in ("flash_attention_trainable", "flash_attention_backward")):
        # a file from before the backward pass was in the handout
        raise NotImplementedError("see README, Task 3, step 6: your task3/attention.py has no flash_attention_backward or "
                                  "flash_attention_trainable: copy the backward pass's part of the handout's file")
    return student.flash_attention_trainable


def saved_by(grad_fn):
    """What the forward pass kept for the backward pass: the shapes of ctx.save_for_backward's tensors, and the
    names and shapes of any tensor kept another way on ctx (an attribute, or inside one: a container or any
    object's attributes, a few levels down)."""
    if grad_fn is None:
        return None
    saved = [tuple(t.shape) for t in getattr(grad_fn, "saved_tensors", ()) if isinstance(t, torch.Tensor)]
    others = []
    for name, value in getattr(grad_fn, "__dict__", {}).items():
        others += [(str(name), tuple(t.shape)) for t in _tensors_in(value)]
    return saved, others


def _tensors_in(value, depth=4, seen=None):
    """The tensors inside value: itself, its items (list, tuple, set, dict) or its attributes, down to `depth`."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        return [value]
    if (depth == 0 or id(value) in seen or isinstance(value, (str, bytes, int, float, bool, type(None), ModuleType))
            or callable(value)):  # a module's or a function's globals are not kept on ctx
        return []
    seen.add(id(value))
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        items = list(getattr(value, "__dict__", {}).values())
    return [t for item in items for t in _tensors_in(item, depth - 1, seen)]


def _forward(q, k, v, causal, block_rows, block_cols, masks=None):
    trainable = _trainable()
    masks = _masked(trainable, masks, step=12)
    function = getattr(student, "FlashAttention", None)
    if masks and function is not None:  # the handout's new flash_attention_trainable over a FlashAttention from before
        _masked(function.forward, {"masks": masks}, step=12)
    with torch.enable_grad():
        out = trainable(q, k, v, causal=causal, block_rows=block_rows, block_cols=block_cols, **masks)
    if not isinstance(out, torch.Tensor) or out.grad_fn is None:
        raise TypeError("flash_attention_trainable must return a tensor autograd can differentiate (one made by "
                        "FlashAttention.apply), got " + (f"{type(out).__name__}" if not isinstance(out, torch.Tensor)
                                                        else "a tensor without a gradient function"))
    return out


def flash_saved(q, k, v, causal, block_rows, block_cols, masks=None):
    """The forward pass alone: what it kept for the backward pass (saved_by)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = _forward(q, k, v, causal, block_rows, block_cols, masks)  # alive while its saved tensors are read: one is itself
    return saved_by(out.grad_fn)


_autograd = {"saved": 0, "engine_runs": 0}  # what autograd did inside the backward passes the checks ran


@contextlib.contextmanager
def _watching_autograd(checks_run_it: bool = False):
    """Counts, while the backward pass runs, the tensors autograd saves to differentiate later (a graph recorded,
    whichever way it is later run) and the runs of autograd's engine (backward(), autograd.grad, torch.func); with
    checks_run_it, the checks' own run (out.backward, which calls your backward pass) is not counted, the runs
    inside it are. Steps 7-8 compute the gradients themselves: a right file does neither."""
    engine, depth = Variable._execution_engine, [0]

    class CountingEngine:
        def __getattr__(self, name):
            return getattr(engine, name)

        def run_backward(self, *args, **kwargs):
            if depth[0] or not checks_run_it:
                _autograd["engine_runs"] += 1
            depth[0] += 1
            try:
                return engine.run_backward(*args, **kwargs)
            finally:
                depth[0] -= 1

    def pack(tensor):
        _autograd["saved"] += 1
        return tensor

    Variable._execution_engine = CountingEngine()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield
    finally:
        Variable._execution_engine = engine


def flash_backward(q, k, v, d_out, causal, block_rows, block_cols, masks=None):
    """out = flash_attention_trainable(q, k, v), then out.backward(d_out): (out, dq, dk, dv)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = _forward(q, k, v, causal, block_rows, block_cols, masks)
    with _watching_autograd(checks_run_it=True):
        out.backward(d_out)
    return out.detach(), q.grad, k.grad, v.grad


def flash_backward_limited(q, k, v, d_out, causal, block_rows, block_cols, masks=None):
    """The memory-limit case through the backward pass: out and dq, which the checks compare on a sample of their
    rows, and the shapes of dk and dv (every key's: too large to send back for what they would show)."""
    out, dq, dk, dv = flash_backward(q, k, v, d_out, causal, block_rows, block_cols, masks)
    return out, dq, tuple(tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in (dk, dv))


def flash_backward_one_thread(causal, block_rows, block_cols, masks=None):
    """flash_attention_backward on each staged (q, k, v, out, lse, d_out) once, on one CPU thread, autograd watched:
    every (dq, dk, dv), which the checks compare. out and lse are given (the checks' own forward pass), so that
    the request's CPU time is the backward pass's alone."""
    _trainable()
    masks, runs = _masked(student.flash_attention_backward, masks, step=12), list(_staged)
    _staged.clear()
    with _one_thread(), _watching_autograd():
        return [student.flash_attention_backward(*run, causal, block_rows, block_cols, **masks) for run in runs]


def autograd_seen():
    """What autograd did inside the backward passes so far (_watching_autograd)."""
    return dict(_autograd)


def repeat(times, which, q, k, v, causal):
    """Run task 3's flash attention (or task 1's attention) `times` times; the checks time the request."""
    fn = student.flash_attention if which == "flash" else load_student_module("task1.attention").attention
    for _ in range(times):
        fn(q, k, v, causal=causal)
    if q.is_cuda:
        torch.cuda.synchronize()
