"""What task 3's checks share (checks/task3/test.py and masks.py): the tolerance, the inputs, the reading of what a
forward pass saved, the CPU-time ratio the skip checks measure and the rule's case, the full score matrix never
built."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

import torch

from harness.attention_math import attention_float64, attention_rows, backward_from_saved, masked_scores
from harness.checks import compare, random_tensor
from harness.diagnose import diagnose
from harness.outcome import Kind
from harness.sandbox import Worker, WorkerDied, WorkerError

ATOL, RTOL = 2e-5, 1e-4
BACKWARD_CALL_TIMEOUT_S = 60  # a call of the backward part: small cases, so a hang costs a minute, not five


def inputs(shape, seed, dtype=torch.float32):
    batch, heads, seq_q, seq_k, d = shape[:5]
    return (random_tensor((batch, heads, seq_q, d), seed, dtype=dtype),
            random_tensor((batch, heads, seq_k, d), seed + 1, dtype=dtype),
            random_tensor((batch, heads, seq_k, d), seed + 2, dtype=dtype))


def saved_wrong(saved, q_shape, k_shape) -> str | None:
    """What is wrong with what the forward pass saved (the worker's description of ctx), or None.

    Exactly q, k, v, the output and one (batch, heads, seq_q) tensor, the log-sum-exp, with
    ctx.save_for_backward; no other tensor on ctx (P, or the scores, kept aside).
    """
    if not (isinstance(saved, tuple) and len(saved) == 2 and all(isinstance(x, list) for x in saved)):
        return "the forward pass's saved tensors could not be read"
    tensors, others = saved
    if others:
        kept = ", ".join(f"ctx.{name} {tuple(shape)}" for name, shape in others[:3])
        return (f"the forward pass keeps tensors on ctx besides ctx.save_for_backward: {kept}; save q, k, v, the "
                f"output and the log-sum-exp with ctx.save_for_backward, nothing else")
    expected = sorted([tuple(q_shape), tuple(k_shape), tuple(k_shape), tuple(q_shape), tuple(q_shape[:3])])
    if sorted(tuple(s) for s in tensors) != expected:
        return (f"the forward pass saved tensors of shapes {[tuple(s) for s in tensors]}; expected q, k, v, the output "
                f"and the log-sum-exp: {expected} in any order (never P: the backward pass computes it again)")
    return None


# The skip checks' sizes: (1, 2, seq, seq, 32) inputs in 128 x 128 tiles; the masks' checks add a window of
# `window` keys (against causal alone) and packed documents of `documents` lengths (against no mask at all: causal's
# own bound would hide a document bound left out). Public: 2048, 128, 16 of 128. With the grading's secret seed
# they are drawn around those (seq 1800-2299; a window of 64-128, two key tiles a row as the public one's; documents
# of 96-199, the last one what is left), so that a file cannot skip, or fake its timing, at the public shape alone.
SKIP_TILE = 128


@dataclass(frozen=True)
class SkipSizes:
    seq: int = 2048
    window: int = 128
    documents: tuple = (128,) * 16

    @property
    def cu_seqlens(self) -> list[int]:
        return [sum(self.documents[:i]) for i in range(len(self.documents) + 1)]


def skip_sizes(seed: int, hidden) -> SkipSizes:
    if not hidden:
        return SkipSizes()
    draw = random.Random(seed)
    seq, documents = draw.randrange(1800, 2300), []
    while sum(documents) < seq:
        documents.append(min(draw.randrange(96, 200), seq - sum(documents)))
    return SkipSizes(seq, draw.randrange(64, 129), tuple(documents))


def tiles_visited(seq: int, causal: bool, window_left=None, documents=None) -> int:
    """The tiles of a skip check's square case that a loop with every bound of steps 2, 9 and 10 visits (the same
    count for the backward pass's query loops, by symmetry). documents: cu_seqlens."""
    from common.masks import document_of

    count = 0
    for row_start in range(0, seq, SKIP_TILE):
        row_end = min(row_start + SKIP_TILE, seq)
        begin, stop = 0, row_end if causal else seq
        if window_left is not None:
            begin = max(0, row_start - window_left)
        if documents is not None:
            begin = max(begin, documents[document_of(documents, row_start)])
            stop = min(stop, documents[document_of(documents, row_end - 1) + 1])
        count += -(-stop // SKIP_TILE) - begin // SKIP_TILE
    return count


# The causal-skip check measures pairs of requests, a full run and a causal one back to back (in turn first),
# each request SKIP_CHECK_RUNS runs, and takes the median of the pairs' ratios. One run is about 0.1 s of CPU
# (10 ticks of the clock /proc counts in), and a machine's load changes the CPU time a run takes: on 2 loaded
# cores, the smallest of three single runs each gave ratios of 38-76% over 25 checks, near the 80% that fails
# it; the median of five pairs of two runs gave 53-65% over 20 (about 2 s of CPU per check).
SKIP_CHECK_RUNS, SKIP_CHECK_PAIRS = 2, 5


def causal_cpu_ratio(cpu_seconds) -> tuple[float, float, float]:
    """The median over SKIP_CHECK_PAIRS pairs of cpu_seconds(True) / cpu_seconds(False), and each one's median."""
    pairs = []
    for i in range(SKIP_CHECK_PAIRS):
        spent = {causal: cpu_seconds(causal) for causal in ((False, True) if i % 2 == 0 else (True, False))}
        pairs.append((spent[True], spent[False]))
    return (statistics.median(causal / max(full, 1e-9) for causal, full in pairs),
            statistics.median(c for c, _ in pairs), statistics.median(f for _, f in pairs))


# The rule case: one query tile against half a million keys. Tile by tile it needs a few
# tiles of memory; the full score matrix (float64) needs 2 GiB, more than the worker may use.
FULL_MATRIX_CASE = (1, 1, 512, 1 << 19, 4, 512, 4096)  # (batch, heads, seq_q, seq_k, head_dim, Br, Bc)
MEMORY_LIMIT = 1 << 30  # address space your code may add to the worker's (PyTorch loaded): 1 GiB
OUT_OF_MEMORY = ("can't allocate memory", "bad_alloc", "MemoryError", "out of memory", "not enough memory")
# The same rule with each mask of steps 9-12, each where its full matrix would need 2 GiB: soft-capping over the
# rule case's keys, a window of 4096 keys at their end (causal), and 8 documents of 2048 positions in 16384 (packed
# documents need seq_q == seq_k). Each mask's own path, so a file that builds the matrix for one of them alone shows.
MASK_MEMORY_RUNS = [  # (shape, causal, masks)
    (FULL_MATRIX_CASE, False, {"softcap": 30.0}),
    (FULL_MATRIX_CASE, True, {"window_left": 4096}),
    ((1, 1, 1 << 14, 1 << 14, 4, 512, 4096), False, {"cu_seqlens": list(range(0, (1 << 14) + 1, 2048))}),
]


def check_no_full_matrix(report, args, seed, backward=False, masks: bool = False):
    """In a worker of its own whose memory the operating system limits: the worker cannot lift it.

    Running out of memory there breaks the rule (the task scores 0); any other error is a
    failed check, since the rule could not be judged. backward: the same for the optional backward
    pass (forward and backward through flash_attention_trainable), a check of the optional part. masks: the same
    with each of the optional masks of steps 9-12 (MASK_MEMORY_RUNS), in turn in the one worker.
    """
    name = "never builds the full score matrix"
    if masks:
        name = f"masks{' backward' if backward else ''}: {name} (softcap, window_left, cu_seqlens)"
    elif backward:
        name = f"backward: {name}"
    optional = backward or masks
    kind, judged = (Kind.OPTIONAL, Kind.OPTIONAL) if optional else (Kind.RULE, Kind.CHECK)  # the rule's; "could not judge"
    runs = MASK_MEMORY_RUNS if masks else [(FULL_MATRIX_CASE, False, None)]
    limit_gib, said, full = MEMORY_LIMIT / 2**30, [], set()
    with Worker(3, args.student_dir, solution=args.solution, scratch=args.scratch, cuda=False,
                memory_limit=MEMORY_LIMIT, purpose="memory-limit") as limited:
        try:
            limited.start()
        except (WorkerError, WorkerDied) as err:
            report.add(name, False, f"could not be judged, your code did not start: {err}",
                       kind=judged, cause=getattr(err, "cause", None))
            return
        for shape, causal, chosen in runs:
            b, h, sq, sk, d, br, bc = shape
            q, k, v = inputs(shape, seed, torch.float64)
            full_gib = b * h * sq * sk * 8 / 2**30
            what = (f"seq {sq}x{sk} with {br}x{bc} tiles (float64)" + " causal" * causal
                    + "".join(f" {key} {value if key != 'cu_seqlens' else f'({len(value) - 1} documents)'}"
                              for key, value in (chosen or {}).items()))
            try:
                if backward:
                    got = limited.call("flash_backward_limited", q, k, v, torch.ones_like(q), causal, br, bc, chosen,
                                       timeout=4 * BACKWARD_CALL_TIMEOUT_S)
                else:
                    got = limited.call("flash_limited", q, k, v, causal, br, bc, chosen)
            except (WorkerError, WorkerDied) as err:
                if isinstance(err, WorkerDied) or any(words in str(err) for words in OUT_OF_MEMORY):
                    report.add(name, False, f"{what} ran out of the {limit_gib:.1f} GiB of memory your code may use, "
                               f"where the full score matrix would need {full_gib:.0f} GiB: work tile by tile and "
                               f"never build it ({err})", kind=kind, cause=getattr(err, "cause", None))
                else:
                    report.add(name, False, f"{what}: could not be judged, your code raised {err}", kind=judged)
                return
            wrong = limited_wrong(got, q, k, v, causal, chosen or {}, backward, seed)
            if wrong:
                report.add(name, False, f"{what}: {wrong}", kind=judged)
                return
            said.append(what)
            full.add(f"{full_gib:.0f}")
    report.add(name, True, f"{'; '.join(said)}: ran within {limit_gib:.1f} GiB of memory; the full score matrix would "
               f"need {' or '.join(sorted(full))} GiB{' in each' if len(said) > 1 else ''}", kind=kind)


LIMITED_ROWS = 8  # the memory case's output (and dq) rows compared with float64, drawn from the seed


def limited_wrong(got, q, k, v, causal: bool, masks: dict, backward: bool, seed: int) -> str | None:
    """What is wrong with what a memory case returned (out, or (out, dq, (dk and dv's shapes))), or None: the
    shapes, and LIMITED_ROWS rows of out (and of dq, for d_out = 1) against float64, each from its own row of scores
    (the checks cannot hold the full matrix either), so an output made up where the memory is limited fails."""
    if backward:
        if not (isinstance(got, tuple) and len(got) == 3):
            return "the memory case's backward call returned something else than (out, dq, the shapes of dk and dv)"
        out, dq, shapes = got
        if shapes != (tuple(k.shape), tuple(v.shape)):
            return f"dk and dv have shapes {shapes}, expected {(tuple(k.shape), tuple(v.shape))}"
    else:
        out, dq = got, None
    for name, tensor in (("out", out), ("dq", dq)) if backward else (("out", out),):
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(q.shape):
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            return f"{name} has shape {shape}, expected {tuple(q.shape)}"
    rows = sorted(random.Random(seed).sample(range(q.shape[-2]), min(LIMITED_ROWS, q.shape[-2])))
    want = attention_rows(q, k, v, rows, causal, **float64_masks(masks), d_out=torch.ones_like(q) if backward else None)
    for name, tensor, expected in zip(("out", "dq"), (out, dq), want):
        if expected is None:
            continue
        checked = compare(tensor[..., rows, :], expected, atol=ATOL, rtol=RTOL, name=f"{name} (rows {rows})",
                          device="cpu")
        if not checked.passed:
            return (f"{checked.message.splitlines()[0]} (README, Task 3, {'steps 7-8' if backward else 'steps 1-5'}; "
                    f"the value cases name a mistake they match)")
    return None


def float64_masks(masks: dict) -> dict:
    """flash_attention's mask arguments as attention_float64's."""
    return {"window_left": masks.get("window_left"), "documents": masks.get("cu_seqlens"),
            "softcap": masks.get("softcap")}


def backward_call(worker, case, q, k, v, d_out, causal: bool, tiles, masks=None, steps: str = "step 6"):
    """The backward checks' two calls (steps 6-8, and 12 with masks): what the forward pass saved, asked first from
    the forward pass alone (a backward pass that reads what it should not have may fail; `steps` write it), then
    out, dq, dk, dv. Returns (what is wrong, None) or (None, (out, dq, dk, dv))."""
    on = lambda t: t.to(case.device)  # noqa: E731
    said = saved_wrong(worker.call("flash_saved", on(q), on(k), on(v), causal, *tiles, masks,
                                   timeout=BACKWARD_CALL_TIMEOUT_S), q.shape, k.shape)
    if said:
        return f"{said} (README, Task 3, {steps})", None
    result = worker.call("flash_backward", on(q), on(k), on(v), on(d_out), causal, *tiles, masks,
                         timeout=BACKWARD_CALL_TIMEOUT_S)
    if not (isinstance(result, tuple) and len(result) == 4):
        return "the backward check's call returned something else than (out, dq, dk, dv)", None
    return None, result


CHECKED_RUNS = 2  # timed outputs of each side compared with float64, picked at random once all have come back


def timed_runs(seed: int, count: int, seq: int, backward: bool, causal: bool, masks: dict) -> list[tuple]:
    """Fresh inputs for each of `count` timed runs on (1, 2, seq, seq, 32): (q, k, v), and for a backward run an out
    and lse near a float32 forward pass's (the checks' own, moved off it: not_the_forwards) and a random d_out."""
    runs = []
    for i in range(count):
        q, k, v = inputs((1, 2, seq, seq, 32), seed + 10 * i)
        if backward:
            scores = masked_scores(q, k, causal, 32 ** -0.5, **float64_masks(masks))
            out, lse = not_the_forwards(torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1),
                                        seed + 10 * i + 4)
            runs.append((q, k, v, out, lse, random_tensor(q.shape, seed + 10 * i + 3)))
        else:
            runs.append((q, k, v))
    return runs


def not_the_forwards(out, lse, seed: int):
    """out and lse moved off the forward pass's: lse up by 0.1-1 a row, out by noise of 0.1. Algorithm 2 computes its
    gradients from what it is given (backward_from_saved, the check's expectation); autograd through the forward pass
    computed again ignores it and is told apart, whatever runs it and however it is hidden."""
    draw = torch.Generator().manual_seed(seed)
    return (out + 0.1 * torch.randn(out.shape, generator=draw, dtype=out.dtype),
            lse + 0.1 + 0.9 * torch.rand(lse.shape, generator=draw, dtype=lse.dtype))


def timed_wrong(timed, backward: bool, seed: int, labels: dict) -> str | None:
    """What is wrong with the timed requests of a skip check, [(side, causal, masks, runs, what came back)], or
    None: each request's outputs, and CHECKED_RUNS of each side's values, picked from the seed (timed_outputs_wrong).
    labels: each side's name in the message."""
    pick = random.Random(seed)
    for side in (True, False):
        requests = [entry for entry in timed if entry[0] == side]
        if not requests:
            continue
        _, causal, masks = requests[0][:3]
        runs = [run for *_, request, _ in requests for run in request]
        got = [out for *_, outs in requests for out in (outs if isinstance(outs, list) else [outs])]
        wrong = timed_outputs_wrong(got, runs, causal, masks, backward, (SKIP_TILE, SKIP_TILE), pick)
        if wrong:
            return f"{labels[side]}, {wrong}"
    return None


def timed_outputs_wrong(got, runs, causal: bool, masks: dict, backward: bool, tiles, pick: random.Random) -> str | None:
    """What is wrong with what a timed request returned for its runs (one output, or (dq, dk, dv), a run): each one's
    shapes and, for CHECKED_RUNS of them drawn by `pick` (from the seed: secret in a grading), its values."""
    if not (isinstance(got, list) and len(got) == len(runs)):
        return f"the timed request returned {type(got).__name__} for {len(runs)} runs, expected a list of their outputs"
    for i, (result, run) in enumerate(zip(got, runs)):
        tensors = list(result) if backward and isinstance(result, (tuple, list)) else [result]
        expected = [run[0].shape, run[1].shape, run[2].shape] if backward else [run[0].shape]
        if [tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in tensors] != [tuple(e) for e in expected]:
            return (f"run {i + 1}: {'flash_attention_backward' if backward else 'flash_attention'} returned something "
                    f"else than {'(dq, dk, dv)' if backward else 'the output'} of shapes {[tuple(e) for e in expected]}")
    for i in sorted(pick.sample(range(len(runs)), min(CHECKED_RUNS, len(runs)))):
        wrong = timed_output_wrong(got[i], runs[i], causal, masks, backward, tiles)
        if wrong:
            return f"run {i + 1} of {len(runs)}: {wrong}"
    return None


def timed_output_wrong(got, run, causal: bool, masks: dict, backward: bool, tiles=None) -> str | None:
    """What is wrong with the output of a timed run (the forward's out, or the backward's dq, dk, dv), or None. A
    forward's output without masks is diagnosed on its tiles (rows, cols): a student whose checked cases fail the
    same way is told the same step here."""
    plain = not any(value is not None for value in masks.values())
    masks = float64_masks(masks)
    q, k, v = run[:3]
    if backward:
        kept = {name: value for name, value in masks.items() if name != "softcap"}  # the skip checks cap nothing
        pairs = list(zip(("dq", "dk", "dv"), got, backward_from_saved(*run, causal, **kept)))
    else:
        pairs = [("out", got, attention_float64(q, k, v, causal, **masks)[0])]
    for name, tensor, want in pairs:
        checked = compare(tensor, want, atol=ATOL, rtol=RTOL, name=name, device="cpu")
        if not checked.passed and not backward and plain and tiles is not None:
            checked = diagnose(3, checked, tensor, q, k, v, causal, atol=ATOL, rtol=RTOL, tiles=tiles)
        if not checked.passed:
            return checked.message.splitlines()[0]
    return None


def autograd_wrong(seen) -> tuple[bool, str, dict]:
    """The verdict on what autograd did inside the backward passes run so far (task3/entry.py's autograd_seen)."""
    if not (isinstance(seen, dict) and all(isinstance(seen.get(n), int) for n in ("saved", "engine_runs"))):
        return False, "what autograd did inside the backward pass could not be read", {}
    if seen["saved"] or seen["engine_runs"]:
        return False, (f"autograd ran inside the backward pass ({seen['saved']} tensors saved for a backward pass, "
                       f"{seen['engine_runs']} runs of its engine): the backward pass computes dq, dk and dv "
                       f"itself, tile by tile (README, Task 3, steps 7-8)"), {}
    return True, "no autograd run inside the backward pass", {}
