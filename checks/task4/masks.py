"""Task 4's steps 23-24 (optional): the float32 kernel with the masks beyond causal (a sliding window, packed
documents, soft-capped scores; task 3's steps 9-11 in CUDA), each with grouped heads and key_start, against float64;
and step 25, the same masks in the Hopper kernel (bf16 and fp16). Run by checks/task4/test.py in a process of its
own."""

from __future__ import annotations

import dataclasses
import math

import torch

from checks.task3.cases import tiles_visited
from checks.task3.masks import documents_text
from checks.task4.forward import make_inputs, padded_spans
from checks.task4 import measure
from checks.task4.measure import ATOL, RTOL
from harness import bench, cli, sanitize
from harness.attention_math import (attention_flops, attention_float64, expand_kv_heads, masked_scores,
                                    padded_queries, padding_mask)
from harness.checks import (bit_sum, compare, exact_float32, expect_errors, guard_damage, guarded_input,
                            guarded_output, in_each_type)
from harness.diagnose_masks import diagnose_masked

MASK_STEPS = (23, 24)
HOPPER_MASK_STEPS = (25,)
# Where task 3's steps of the masks are in this task's README (harness/diagnose_masks.py names task 3's): the window
# and the documents are step 23's ranges (and step 24's element mask), the cap and the row that saw no key step 24's
TASK3_STEPS = {"task": 4, 9: "steps 23-24", 10: "steps 23-24", 11: "step 24", 4: "step 24", "all": "steps 23-24"}
HOPPER_TASK3_STEPS = {"task": 4, 9: "step 25", 10: "step 25", 11: "step 25", 4: "step 19", "all": "step 25"}
# (batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, window_left, the documents' lengths, softcap, key_start),
# None where unused. The reference's tiles are 128 x 128 and the skeleton's 64 x 64: windows of 1 key, of a tile
# and wider than the sequence; documents of one position, of a tile, many short ones; caps that bind (the scaled
# scores of these inputs reach about 5, and a third are past 1) and one that never does (1e6: a soft-cap computed
# with an error that grows with the cap, as 1 - 2 / (1 + e^(2x / c)) in float32, loses the scores). The first case
# has no padding: a kernel that writes nothing there is one not written.
MASK_CASES = [
    (1, 2, 2, 300, 300, 64, True, 0, None, None, None),  # a window of one key, the query's own
    (2, 4, 2, 333, 333, 64, True, 127, None, None, None),  # a window of a tile (128 keys), grouped heads
    (1, 2, 1, 200, 520, 80, True, 150, None, None, None),  # seq_q != seq_k, one key/value head
    (1, 2, 2, 100, 100, 32, True, 500, None, None, None),  # a window wider than the sequence: causal's values
    (2, 2, 2, 400, 400, 64, False, None, (1, 128, 100, 171), None, None),  # documents of 1 and of a tile
    (1, 4, 2, 300, 300, 96, True, None, (5,) * 20 + (200,), None, None),  # many short documents, causal inside
    (2, 2, 2, 257, 257, 128, False, None, None, 1.0, None),  # soft-capping
    (1, 2, 2, 130, 130, 64, True, None, None, 1e6, None),  # a cap that never binds: the scores as they are
    (1, 2, 2, 300, 300, 64, True, 60, (130, 170), 2.0, None),  # all three
    (2, 4, 2, 200, 260, 64, True, 50, None, None, (0, 100)),  # a window with left padding
    (2, 2, 2, 300, 300, 64, True, None, (90, 210), None, (0, 150)),  # documents, one cut by the padding
    (2, 2, 1, 150, 150, 33, False, None, None, 1.5, (0, 70)),  # a cap with padding, head_dim not a tile's
    # 160 blocks of the Hopper kernel's rows, more than an H100/H200's SMs: its persistent blocks walk several
    (2, 16, 4, 600, 600, 64, True, 200, (150, 450), None, (0, 100)),
]


def mask_text(shape) -> str:
    b, h, kvh, sq, sk, d, causal, window_left, lengths, softcap, starts = shape
    group = "" if kvh == h else " (MQA)" if kvh == 1 else f" ({kvh} kv heads)"
    text = f"batch {b} heads {h}{group} seq {sq}x{sk} head_dim {d}" + " causal" * causal
    if window_left is not None:
        text += f" window {window_left}"
    if lengths is not None:
        text += f" documents {documents_text(lengths)}"
    if softcap is not None:
        text += f" softcap {softcap:g}"
    if starts is not None:
        text += f" key_start {','.join(map(str, starts))}"
    return text


def mask_arguments(shape) -> dict:
    """The masks as forward_masks's keyword arguments (cu_seqlens from the lengths, int32 on the GPU)."""
    *_, window_left, lengths, softcap, _ = shape
    cu_seqlens = None if lengths is None else torch.tensor([sum(lengths[:i]) for i in range(len(lengths) + 1)],
                                                           dtype=torch.int32)
    return {"window_left": window_left, "softcap": softcap, "cu_seqlens": cu_seqlens}


def check_masked_case(worker, shape, seed, dtype=torch.float32):
    """One masked case against float64, poisoned output and guard bands; a failure compared with the masks' common
    mistakes (in the first sequence's rows that are not padding when there is padding). dtype: float32 (steps 23-24),
    or bf16/fp16 (step 25, the Hopper kernel), held to what PyTorch's own 16-bit arithmetic misses by
    (masked_16bit_allowance)."""
    b, h, kvh, sq, sk, d, causal, window_left, lengths, softcap, starts = shape
    q, k, v = (t.to(dtype) for t in make_inputs((b, h, kvh, sq, sk, d, starts), seed))
    scale = 1.0 / math.sqrt(d)
    key_start = None if starts is None else torch.tensor(starts, dtype=torch.int32)
    masks = mask_arguments(shape)
    inputs = [guarded_input(name, t) for name, t in zip("qkv", (q, k, v))]
    out = guarded_output("out", q.shape, dtype=dtype)
    cu_seqlens = masks["cu_seqlens"]
    worker.call("forward_masks", *(t.tensor for t in inputs), out.tensor, causal, scale,
                None if key_start is None else key_start.cuda(), window_left, softcap,
                None if cu_seqlens is None else cu_seqlens.cuda())
    documents = None if cu_seqlens is None else cu_seqlens.tolist()
    how = dict(window_left=window_left, documents=documents, softcap=softcap)
    reference = attention_float64(q, k, v, causal, scale, key_start, **how)[0]
    atol, rtol, mistakes_rtol = ATOL, RTOL, RTOL
    if dtype != torch.float32:  # a mistake's output is compared to within a unit in the last place of each value too
        (atol, said), rtol, mistakes_rtol = masked_16bit_allowance(q, k, v, causal, scale, key_start, how,
                                                                   reference), 0.0, torch.finfo(dtype).eps
    result = compare(out.tensor, reference, atol=atol, rtol=rtol, poisoned=True)
    if dtype != torch.float32:
        result = dataclasses.replace(result, message=f"{result.message} ({said})")
    damage = guard_damage(*inputs, out)
    if damage:
        return damage
    if result.passed or result.untouched:
        return result
    got = out.tensor
    steps = TASK3_STEPS if dtype == torch.float32 else HOPPER_TASK3_STEPS
    if key_start is not None:  # the mistakes are named on the unpadded sequence alone (the first one)
        row, key, _ = padded_spans(starts, sq, sk)[0]
        if row or key:
            return step_words(result, steps)
        q, k, v, got = q[:1], k[:1], v[:1], got[:1]
    return diagnose_masked(result, got, q, k, v, causal, atol=atol, rtol=mistakes_rtol, scale=scale, steps=steps,
                           **how)


def masked_16bit_allowance(q, k, v, causal, scale, key_start, masks: dict, expected) -> tuple[float, str]:
    """(the largest error a 16-bit output of these masked inputs may have, the words that say why): as steps 8-11's
    rule (measure.half_allowance), with PyTorch's own attention in the inputs' type as the yardstick; SDPA takes no
    soft-cap, so it is PyTorch's arithmetic as the kernels do it: the scores in float32, P rounded to the type, P V
    summed in float32, the output rounded."""
    with torch.no_grad():
        heads = q.shape[1]
        q32, k32, v32 = q.cuda().float(), expand_kv_heads(k, heads).cuda().float(), expand_kv_heads(v, heads).cuda()
        scores = masked_scores(q32, k32, causal, scale, **masks)
        if key_start is not None:
            scores = scores.masked_fill(padding_mask(key_start.cuda(), q.shape[2], k.shape[2]), -math.inf)
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(q.dtype)  # a padded row sees no key: zeros
        got = (p.float() @ v32.float()).to(q.dtype).double()
        if key_start is not None:
            got = got.masked_fill(padded_queries(key_start.cuda(), q.shape[2], k.shape[2]), 0.0)
        yardstick = float((got - expected.to(got.device)).abs().max())
    allowed = max(measure.HALF_ERROR_FACTOR * yardstick, measure.HALF_EPS[q.dtype] * float(expected.abs().max()))
    return allowed, (f"allowed {allowed:.1e}: the larger of {measure.HALF_ERROR_FACTOR:g}x PyTorch's {yardstick:.1e} "
                     f"in {str(q.dtype)[6:]} on these inputs and half a unit in the last place of the largest "
                     "|expected|")


def step_words(result, steps=TASK3_STEPS):
    result.message += f" (README, Task 4, {steps['all']})"
    return result


def check_mask_errors(worker):
    """The binding's errors for the masks' arguments: each names the argument and what it must be."""
    q = torch.randn(1, 2, 16, 32, device="cuda")
    long_k = torch.randn(1, 2, 20, 32, device="cuda")
    cu = lambda values: torch.tensor(values, dtype=torch.int32, device="cuda")  # noqa: E731

    def args(causal=True, window_left=None, softcap=None, cu_seqlens=None, k=q):
        return q, k.clone(), k.clone(), torch.empty_like(q), causal, 0.2, None, window_left, softcap, cu_seqlens

    return expect_errors(lambda *a: worker.call("forward_masks", *a), [
        ("window_left -1", args(window_left=-1), "window_left must be None or >= 0"),
        ("a window without causal", args(causal=False, window_left=4), "window_left needs causal=True"),
        ("softcap 0", args(softcap=0.0), "softcap must be None or a finite number > 0"),
        ("softcap inf", args(softcap=math.inf), "softcap must be None or a finite number > 0"),
        ("softcap 1e-40 (0 as a float32)", args(softcap=1e-40), "softcap must be None or a finite number > 0"),
        ("cu_seqlens not rising", args(cu_seqlens=cu([0, 8, 8, 16])), "cu_seqlens must rise from 0"),
        ("cu_seqlens past the end", args(cu_seqlens=cu([0, 8, 17])), "cu_seqlens must rise from 0"),
        ("cu_seqlens int64", args(cu_seqlens=cu([0, 16]).long()), "cu_seqlens must be a contiguous 1-D int32"),
        ("cu_seqlens with seq_q != seq_k", args(cu_seqlens=cu([0, 20]), k=long_k),
         "cu_seqlens packs documents into one sequence"),
    ])


def masks_part(report, worker, hidden_cases) -> bool:
    """Steps 23-24 (optional): every masked case, then the binding's errors for the masks; whether all passed."""
    report.begin_part("masks", MASK_STEPS, optional=True)
    before = len(report.cases)
    for case in cli.cases(4, "masks", MASK_CASES, hidden_cases, mask_text, causal=(False,)):
        report.run(f"masks: {case.name}", lambda: check_masked_case(worker, case.shape, case.seed))
        if report.process_died_since(before, "the masks part"):
            return report.end_part("masks")
    report.run("bad input to the masks raises clear errors (the given binding)", lambda: check_mask_errors(worker))
    return report.end_part("masks")


def hopper_masks_part(report, worker, hidden_cases, grading=False) -> bool:
    """Step 25 (optional, compute capability 9.0): the masks' cases (and the hidden ones) through the Hopper kernel in
    bf16 and fp16 (a grading: each in one, in_each_type); whether all passed. The binding's errors are steps 23-24's
    (one function checks them for both)."""
    report.begin_part("hopper masks", HOPPER_MASK_STEPS, optional=True)
    before = len(report.cases)
    cases_of = lambda name: cli.cases(4, "masks", MASK_CASES, hidden_cases,  # noqa: E731
                                      lambda s: f"Hopper masks: {name} {mask_text(s)}", causal=(False,))
    for case, dtype in in_each_type(cases_of, grading):
        report.run(case.name, lambda: check_masked_case(worker, case.shape, case.seed, dtype))
        if report.process_died_since(before, "the Hopper masks part"):
            return report.end_part("hopper masks")
    return report.end_part("hopper masks")


MASKS_PASS_NAME = f"{sanitize.PASS_NAME}, the masks (optional)"
HOPPER_MASKS_PASS_NAME = f"{sanitize.PASS_NAME}, the Hopper kernel's masks (optional)"


def masks_sanitizer_calls(hidden: cli.Hidden | None, dtype=torch.float32) -> list[sanitize.Call]:
    """The masks' pass (steps 23-24; step 25 in bf16): a window over a padded grouped batch, documents (one of a
    single position, one cut by the padding), and a cap, at the tile edges."""
    calls, name = [], "" if dtype == torch.float32 else f"Hopper {str(dtype)[6:]} "
    for i, shape in enumerate([(2, 4, 2, 140, 200, 64, True, 30, None, None, (0, 100)),
                               (2, 2, 2, 150, 150, 80, True, None, (1, 100, 49), None, (0, 60)),
                               (1, 2, 1, 129, 129, 128, False, None, (64, 65), 1.5, None)]):
        b, h, kvh, sq, sk, d, causal, window_left, _, softcap, starts = shape
        q, k, v = (t.to(dtype) for t in make_inputs((b, h, kvh, sq, sk, d, starts), cli.seed(sq + sk + d + 3 * i,
                                                                                             hidden)))
        cu_seqlens = mask_arguments(shape)["cu_seqlens"]
        key_start = None if starts is None else torch.tensor(starts, dtype=torch.int32)
        names = ("q", "k", "v", "out") + ("key_start",) * (key_start is not None) + ("cu_seqlens",) * (
            cu_seqlens is not None)  # the tensors', in order
        calls.append(sanitize.Call(f"{name}masks {mask_text(shape)}", "forward_masks",
                                   (q, k, v, torch.empty_like(q), causal, 1 / math.sqrt(d), key_start, window_left,
                                    softcap, cu_seqlens), names))
    return calls


# The skip, timed (a student's own run; the grader leaves it out): causal, a window of 1024 keys and causal documents
# of 512 over 16384 positions, batch 1, 16 heads, head_dim 128. With the reference's 128-key tiles a window visits
# 1/7.4 of causal's tiles and the documents 1/26 (TILE_SHARES); the issue that added the part asked for at least 6x
# and 10x causal's speed: reported beside the share, never scored.
SKIP_SHAPE = (1, 16, 16384, 128)
SKIP_MASKS = {"causal": {}, "a window of 1024 keys": {"window_left": 1023},
              "causal documents of 512": {"cu_seqlens": list(range(0, 16384 + 1, 512))}}
CHECKED_ROWS = 32  # rows of the sampled head checked in float64 after each timed request


class MaskedSets(measure.TimedSets):
    """TimedSets whose check is the masked attention of CHECKED_ROWS random rows of each sampled head, in float64
    (a whole head of 16384 rows would take the CPU seconds per set)."""

    def __init__(self, masks, *args):
        super().__init__(*args)
        self.masks = masks

    def check(self, causal, scale):
        for i, (group, prints) in enumerate(zip(self.guarded, self.bit_sums)):
            damage = guard_damage(*group)
            if damage:
                raise AssertionError(f"{damage.message} (in timed run {i + 1} of {self.count})")
            if any(bit_sum(g.tensor) != before for g, before in zip(group, prints)):
                raise AssertionError(f"changed an input in timed run {i + 1} of {self.count}; inputs are read-only")
        for i, ((*_, out), (b, h, q, k, v)) in enumerate(zip(self.sets, self.picked)):
            rows = torch.tensor(sorted(self.rng.sample(range(q.shape[0]), CHECKED_ROWS)))
            keys = torch.arange(k.shape[0])
            hidden = keys[None, :] > rows[:, None]  # seq_q == seq_k here, and every case causal
            if "window_left" in self.masks:
                hidden |= keys[None, :] < rows[:, None] - self.masks["window_left"]
            if "cu_seqlens" in self.masks:
                ends = torch.tensor(self.masks["cu_seqlens"][1:])
                doc = torch.bucketize(keys, ends, right=True)
                hidden |= doc[None, :] != doc[rows][:, None]
            with exact_float32():
                scores = (q[rows].double() @ k.double().T * scale).masked_fill(hidden.to(q.device), -math.inf)
                expected = torch.softmax(scores, dim=-1) @ v.double()
            result = compare(out[b, h, rows.to(out.device)], expected, atol=ATOL, rtol=RTOL, poisoned=True,
                             name=f"output of timed run {i + 1} of {self.count}, head ({b}, {h}), {CHECKED_ROWS} rows")
            if not result.passed:
                raise AssertionError(result.message)


def time_masks(worker, masks: dict):
    """The kernel with `masks` (causal) over distinct sets per request, the outputs checked; (Timing, sets) or
    (message, None)."""
    batch, heads, seq, head_dim = SKIP_SHAPE
    estimate_ms = attention_flops(batch, heads, seq, seq, head_dim, True) / (measure.ESTIMATE_TFLOPS * 1e9)
    timed = MaskedSets(masks, batch, heads, seq, head_dim, estimate_ms)
    scale = 1.0 / math.sqrt(head_dim)
    cu_seqlens = masks.get("cu_seqlens")
    arguments = (masks.get("window_left"), None,
                 None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32, device="cuda"))
    kept = worker.keep("timed sets", timed.sets)
    try:
        timed.refresh()
        worker.call("run_batch_masks", kept, True, scale, *arguments)  # warm-up
        timing = bench.host_clock(lambda: worker.call("run_batch_masks", kept, True, scale, *arguments),
                                  reps=measure.REPS, per_request=timed.count, before=timed.refresh,
                                  after=lambda: timed.check(True, scale))
    except AssertionError as err:
        return str(err), None
    finally:
        worker.drop("timed sets")
    return timing, timed.count


def run_masks_benchmarks(report, worker) -> None:
    """The window and the documents against causal, each in the same run: the time and the share of causal's tiles
    each visits (128-key tiles), reported (optional), never scored."""
    timed = {name: time_masks(worker, masks) for name, masks in SKIP_MASKS.items()}
    causal, _ = timed["causal"]
    batch, heads, seq, head_dim = SKIP_SHAPE
    tiles = {name: tiles_visited(seq, True, masks.get("window_left"), masks.get("cu_seqlens"))
             for name, masks in SKIP_MASKS.items()}
    for name, (timing, _) in timed.items():
        if name == "causal":
            continue

        def result(name=name, timing=timing):
            if isinstance(timing, str) or isinstance(causal, str):
                return False, f"not timed: {timing if isinstance(timing, str) else causal}", {}
            speed = causal.median_ms / timing.median_ms
            share = tiles["causal"] / tiles[name]
            return True, (f"{timing.median_ms:.2f} ms against causal's {causal.median_ms:.2f} ms: {speed:.1f}x its "
                          f"speed; it visits 1/{share:.1f} of causal's tiles (of 128 keys); reported, not scored"), \
                {"kernel_ms": timing.median_ms, "causal_ms": causal.median_ms, "speedup_vs_causal": speed}
        report.run(f"masks: {name} at batch {batch} heads {heads} seq {seq} head_dim {head_dim}", result,
                   kind="optional")
