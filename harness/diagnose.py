"""Diagnoses of the common attention mistakes, tried when a check fails.

Each mistake is the float64 reference computed wrong in one place. A failed output is
compared with each in turn; the first one it matches names the mistake and the README
step where it is made: "looks like attention without the 1/sqrt(head_dim) scale: see
README, Task 1, step 2". A correct submission never pays for this: it runs only after a
check failed. The one list below holds every mistake with its step in each task, so every
task says the same thing, in PyTorch (tasks 1 and 3) and in CUDA (tasks 2, 4 and 5); what a
check looks at (the whole output, the scores alone, the mask alone, the heads' layout) picks
the mistakes that can show there. A kernel's slips in the online softmax depend on the order
it visits the keys in: the checks pass the orders the student's constants say (a Schedule),
and a slip is tried under each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from harness.checks import CheckResult, compare


LOG2E, LN2 = 1 / math.log(2), math.log(2)
# The scale a kernel really applied, from the one it was given: none at all, twice, exp() over scores
# already scaled for exp2 (scale * log2 e), exp2() over unscaled scores (exp2(x) = exp(x ln 2)).
SCALED = {"none": lambda s: 1.0, "twice": lambda s: s * s, "log2e": lambda s: s * LOG2E, "ln2": lambda s: LN2}


def _future(seq_q: int, seq_k: int, mask: str = "end") -> torch.Tensor:
    """Which (query, key) pairs a causal mask hides. "end" is right: query i sees key j <= i + seq_k - seq_q.
    "start": aligned to the first key; "late"/"early": the diagonal one too high/low; "past": the keys a
    query may see hidden instead (tril); "none": nothing hidden; "short": the last key hidden from every
    query (a decode over one position too few)."""
    ones = torch.ones(seq_q, seq_k, dtype=torch.bool)
    if mask == "none":
        return ~ones
    if mask == "past":
        return ones.tril(diagonal=seq_k - seq_q)
    if mask == "short":
        return torch.arange(seq_k).expand(seq_q, seq_k) == seq_k - 1
    offset = seq_k - seq_q
    return ones.triu(diagonal={"end": 1 + offset, "start": 1, "late": 2 + offset, "early": offset}[mask])


def _scores(q, k, causal, *, scale=None, scaled=None, mask="end"):
    """The scaled, masked score matrix in float64, made as the keywords say (SCALED, _future)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q.double() @ k.double().transpose(-2, -1)) * (SCALED[scaled](scale) if scaled else scale)
    if causal or mask == "short":
        scores = scores.masked_fill(_future(q.shape[-2], k.shape[-2], mask), -math.inf)
    return scores


def _attention(q, k, v, causal, softmax_dim=-1, scores=None, scale=None, **how):
    """(out, lse) of attention over `scores`, or over the scores made as `how` says."""
    scores = _scores(q, k, causal, scale=scale, **how) if scores is None else scores
    return torch.softmax(scores, dim=softmax_dim) @ v.double(), torch.logsumexp(scores, dim=-1)


@dataclass(frozen=True)
class Schedule:
    """The order a kernel visits the keys of a row in, which decides what a slip in the online softmax does.

    Key j is folded into running state `state[j]` at step `step[j]`; the states are merged at the
    end with their own maxima (exactly, as the merge of a decode block's groups or of the splits is).
    Tiles of `width` keys (tasks 3 and 4): one state, step j // width. Groups (task 5's decode): group
    j % groups takes `per_round` of its keys per step. `split_rows`: the keys cut into splits of that
    many first (split-KV), each split with its own groups."""
    width: int = 0
    groups: int = 1
    per_round: int = 1
    split_rows: int = 0

    def assign(self, seq_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = torch.arange(seq_k)
        if self.width:
            return torch.zeros_like(j), j // self.width
        split, j = (j // self.split_rows, j % self.split_rows) if self.split_rows else (torch.zeros_like(j), j)
        return split * self.groups + j % self.groups, j // (self.groups * self.per_round)

    def ragged(self, seq_k: int) -> bool:
        """Whether the last tile is partial (only tiles have one)."""
        return bool(self.width) and seq_k % self.width != 0


SANE_CONSTANT = 1024  # larger sizes are no tile or warp count a kernel can have: ignored, not modelled


def kernel_constants(rel: str, student_dir, solution: bool) -> dict[str, int]:
    """The `constexpr int` sizes at the top of a kernel file (the tuner's reading of them); {} when unreadable.
    Only read, never run: they say in which order the kernel visits the keys."""
    from common.impl import source_of
    from harness.kernel_configs import tunables

    try:
        found = tunables(source_of(rel, student_dir, solution).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return {name: value for name, value in found.items() if 0 < value <= SANE_CONSTANT}


def tile_schedules(*widths: int | None) -> list[Schedule]:
    """Key tiles of each width given (the student's first), then the usual ones."""
    return [Schedule(width=w) for w in dict.fromkeys([*widths, 32, 64, 128, 16]) if isinstance(w, int) and w > 0]


def decode_schedules(constants: dict[str, int], head_dim: int, length: int, splits: int,
                     per_lane: int = 4) -> list[Schedule]:
    """Task 5's decode as its skeleton lays it out: groups of G lanes read a row each (G = head_dim / 4
    rounded up to a power of two with float4 loads, else a whole warp; per_lane = 8 for the 16-bit file's
    16-byte loads), DECODE_WARPS warps a block, UNROLL rows per group per round; with split-KV, each split of
    ceil(length / splits) rows so. Then plain key tiles, for a kernel laid out otherwise."""
    lanes = -(-head_dim // per_lane)
    group = 32 if head_dim % per_lane else 1 << (lanes - 1).bit_length()
    warps, unroll = min(constants.get("DECODE_WARPS", 4), 32), min(constants.get("UNROLL", 1), 64)
    rows = -(-length // splits) if splits > 1 else 0
    laid_out = [Schedule(groups=max(1, warps * 32 // group), per_round=max(1, unroll), split_rows=rows)]
    return laid_out + ([] if rows else tile_schedules())


def _slipped(q, k, v, causal, schedule: Schedule, slip: str, scale=None):
    """(out, lse) of the online softmax visiting the keys as `schedule` says, with one slip, from the whole
    score matrix (a shortcut for diagnosing, not a way to do Task 3). A key folded in while its state's
    running maximum was R carries exp(s - R) where a rescaled sum carries exp(s - m), m that state's final
    maximum. slip: "acc" or "l" (that sum not rescaled), "lse" (the log-sum-exp without m), "tail" (the
    last partial key tile left out), "unmasked" (the last partial tile's keys past the end not masked:
    each scores 0 and holds a zero V row)."""
    scores, v = _scores(q, k, causal, scale=scale), v.double()
    seq_k = scores.shape[-1]
    if slip == "tail":
        scores[..., seq_k - seq_k % schedule.width:] = -math.inf
        return _attention(q, k, v, causal, scores=scores)
    if slip == "unmasked":
        pad = schedule.width - seq_k % schedule.width
        scores = torch.cat([scores, scores.new_zeros(*scores.shape[:-1], pad)], dim=-1)
        v = torch.cat([v, v.new_zeros(*v.shape[:-2], pad, v.shape[-1])], dim=-2)
        return _attention(q, k, v, causal, scores=scores)
    state, step = schedule.assign(seq_k)
    states, steps = int(state.max()) + 1, int(step.max()) + 1
    slot = (state * steps + step).expand_as(scores)
    step_max = scores.new_full((*scores.shape[:-1], states * steps), -math.inf).scatter_reduce(
        -1, slot, scores, "amax")
    running = step_max.view(*scores.shape[:-1], states, steps).cummax(dim=-1).values
    seen = running.flatten(-2).gather(-1, slot)  # R for every key
    final = running[..., -1].gather(-1, state.expand_as(scores))  # its state's final maximum
    m = scores.amax(dim=-1, keepdim=True)
    rescaled = torch.exp(scores - m)
    kept = rescaled * torch.exp(final - seen).nan_to_num(nan=1.0)  # a key that scored -inf stays 0
    acc = (kept if slip == "acc" else rescaled) @ v
    l = (kept if slip == "l" else rescaled).sum(dim=-1, keepdim=True)
    lse = torch.log(rescaled.sum(dim=-1)) + (0 if slip == "lse" else m[..., 0])
    return acc / l, lse


def _combined(q, k, v, splits: int, how: str, scale=None):
    """(out, None) of split-KV whose partial outputs (each normalised over its split's keys) are combined
    without their log-sum-exp weights: "mean" (every split weighs the same, an empty one as a zero
    output), "unnormalised" (weighted by exp(lse - max lse), but not divided by the weights' sum)."""
    scores, v = _scores(q, k, False, scale=scale), v.double()
    seq_k = scores.shape[-1]
    rows = -(-seq_k // splits)
    parts = [slice(s * rows, min(seq_k, (s + 1) * rows)) for s in range(splits) if s * rows < seq_k]
    partial = [torch.softmax(scores[..., p], dim=-1) @ v[..., p, :] for p in parts]
    if how == "mean":
        return sum(partial) / splits, None
    lse = torch.stack([torch.logsumexp(scores[..., p], dim=-1) for p in parts])
    weights = torch.exp(lse - lse.amax(dim=0))
    return sum(w[..., None] * o for w, o in zip(weights, partial)), None


def _heads(x, heads: int, layout: str):
    """The heads split or merged without the transpose: a view straight to the other shape."""
    if layout == "split":  # (batch, seq, heads * d) read as (batch, heads, seq, d)
        batch, seq, hidden = x.shape
        return x.reshape(batch, heads, seq, hidden // heads)
    batch, heads, seq, d = x.shape  # "merge": (batch, heads, seq, d) read as (batch, seq, heads * d)
    return x.reshape(batch, seq, heads * d)


@dataclass(frozen=True)
class Mistake:
    says: str  # what the output looks like, after "looks like "
    steps: dict[int, int]  # task -> the README step where it is made
    how: dict  # scaled, mask, softmax_dim (the reference made so), slip (a Schedule's), combine (split-KV), layout
    needs: set[str] = field(default_factory=set)  # "causal", "plain" (not causal), "cross" (seq_q != seq_k),
    #                       "ragged" (the last key tile partial), "partial" (and more than one tile)

    @property
    def made_in(self) -> str:
        """What a check must look at to see it: "scores", "mask", "softmax", "tiles", "splits" or "layout"."""
        key = next(iter(self.how))
        return {"scaled": "scores", "softmax_dim": "softmax", "slip": "tiles", "combine": "splits"}.get(key, key)

    def applies(self, causal: bool, seq_q: int, seq_k: int, schedule: Schedule | None = None) -> bool:
        ragged = schedule is not None and schedule.ragged(seq_k)
        return ((causal or "causal" not in self.needs) and (not causal or "plain" not in self.needs)
                and (seq_q != seq_k or "cross" not in self.needs) and (ragged or "ragged" not in self.needs)
                and (ragged and seq_k > schedule.width or "partial" not in self.needs))

    def attend(self, q, k, v, causal, schedule=None, splits=0, scale=None):
        """(out, lse) of attention with this mistake."""
        if "slip" in self.how:
            return _slipped(q, k, v, causal, schedule, self.how["slip"], scale)
        if "combine" in self.how:
            return _combined(q, k, v, splits, self.how["combine"], scale)
        return _attention(q, k, v, causal, scale=scale, **self.how)


ONE_FACTOR_PER_ROW = "l (the row sum) wrong while acc is right: each output row is the right one times a factor of its own"
MISTAKES = [
    Mistake("attention without the 1/sqrt(head_dim) scale", {1: 2, 3: 3, 4: 3, 5: 2}, {"scaled": "none"}),
    Mistake("attention scaled by 1/head_dim (the 1/sqrt(head_dim) scale applied twice?)", {1: 2, 3: 3, 4: 3, 5: 2},
            {"scaled": "twice"}),
    Mistake("exp() over scores already scaled for exp2 (by scale * log2(e)): use exp2f there, or scale alone",
            {4: 3, 5: 2}, {"scaled": "log2e"}),
    Mistake("exp2f() over scores that were never scaled: multiply them by scale * log2(e) first", {4: 3, 5: 2},
            {"scaled": "ln2"}),
    Mistake("attention whose scores were neither scaled nor masked (is scale_and_mask launched?)", {2: 5},
            {"scaled": "none", "mask": "none"}),
    Mistake("attention with no causal mask at all", {1: 3, 3: 3, 4: 3}, {"mask": "none"}, {"causal"}),
    Mistake("a causal mask aligned to the first key instead of the last (triu's diagonal without seq_k - seq_q)",
            {1: 3, 3: 3, 4: 3}, {"mask": "start"}, {"causal", "cross"}),
    Mistake("a causal mask that lets each query see one future key (triu's diagonal one too high)",
            {1: 3, 3: 3, 4: 3}, {"mask": "late"}, {"causal"}),
    Mistake("a causal mask that hides each query's own key too (triu's diagonal one too low; in a kernel, "
            "col >= row + offset where col > row + offset is meant)", {1: 3, 3: 3, 4: 3}, {"mask": "early"}, {"causal"}),
    Mistake("a mask turned around: it hides the keys a query may see, not its future ones (tril, or ~mask?)",
            {1: 3, 3: 3, 4: 3}, {"mask": "past"}, {"causal"}),
    Mistake("a decode over one position too few: the last cached key (position length - 1) left out", {5: 2},
            {"mask": "short"}),
    Mistake("softmax over the queries (dim=-2) instead of the keys (dim=-1)", {1: 4}, {"softmax_dim": -2}),
    Mistake("acc not rescaled by exp(m_old - m_new) when the maximum grows", {3: 4, 4: 4, 5: 2}, {"slip": "acc"}),
    Mistake("l_i not rescaled by exp(m_old - m_new) when the maximum grows", {3: 4, 4: 4, 5: 2}, {"slip": "l"}),
    Mistake("the last, partial key tile left out (count the tiles rounding up)", {3: 2, 4: 1}, {"slip": "tail"},
            {"partial"}),
    Mistake("the keys past seq_k in the last, partial tile not masked: each counts as a score of 0 (mask "
            "col >= seq_k whether or not the attention is causal)", {4: 3}, {"slip": "unmasked"}, {"ragged", "plain"}),
    Mistake("the log-sum-exp without m_i (log(l_i) alone)", {3: 5}, {"slip": "lse"}),
    Mistake("split-KV partial outputs averaged without their log-sum-exp weights (weight each by "
            "exp2(lse_s - max lse), then divide by the weights' sum)", {5: 3}, {"combine": "mean"}),
    Mistake("split-KV partial outputs weighted by exp2(lse_s - max lse) but not divided by the weights' sum",
            {5: 3}, {"combine": "unnormalised"}),
    Mistake("a view straight to (batch, heads, seq, head_dim), without the transpose: each head gets other "
            "tokens' values (view to (batch, seq, heads, head_dim), then transpose)", {1: 1}, {"layout": "split"}),
    Mistake("a reshape straight to (batch, seq, heads * head_dim), without the transpose: the heads' rows "
            "interleave (transpose to (batch, seq, heads, head_dim) first)", {1: 5}, {"layout": "merge"}),
]
# The step a whole-row factor (ONE_FACTOR_PER_ROW) points to: where l is kept
FACTOR_STEPS = {3: 4, 4: 4, 5: 2}


def _say(result: CheckResult, task: int, mistake: Mistake | str, step: int | None = None,
         extra: str = "") -> CheckResult:
    says, step = (mistake, step) if isinstance(mistake, str) else (mistake.says, mistake.steps[task])
    result.message = f"looks like {says}: see README, Task {task}, step {step}.{extra} {result.message}"
    return result


def named(message: str) -> bool:
    """Whether a case's message names a mistake (_say's words lead it)."""
    return message.startswith("looks like ")


def _candidates(task: int, made_in: tuple[str, ...]):
    return [m for m in MISTAKES if task in m.steps and m.made_in in made_in]


def _as_float64(got) -> torch.Tensor:
    return got.detach().to("cpu", torch.float64)


def matches_mistake(got, wrong, atol, rtol, every_row_lost=False) -> tuple[bool, str]:
    """Whether `got` is `wrong` within the tolerance, and what to add to the diagnosis. A row the mistake
    leaves without any key (NaN in `wrong`: 0/0) matches a row of NaN, as a kernel computes it, or of
    zeros, as a kernel that guards l == 0 writes it; the other rows must match, and there must be some, unless
    `every_row_lost` (a mistake that leaves every row of these inputs without a key may be named)."""
    lost = torch.isnan(wrong).any(dim=-1)
    if not lost.any():
        return compare(got, wrong, atol=atol, rtol=rtol).passed, ""
    got, every = _as_float64(got), bool(lost.all())
    if (every and not every_row_lost) or got.shape != wrong.shape:
        return False, ""
    there = got[lost]
    if not bool((torch.isnan(there) | (there == 0)).all()) or (not every and not compare(
            got[~lost], wrong[~lost], atol=atol, rtol=rtol).passed):
        return False, ""
    came = 'NaN (0/0)' if torch.isnan(there).any() else 'zero'
    if every:  # nothing else to tell it by: say so
        return True, (f" Under it no row sees a key here, and every row came out {came}; code that adds up no row "
                      "for another reason gives the same.")
    return True, f" The rows that see no key at all come out {came}."


def _one_factor_per_row(got, want, atol: float, rtol: float) -> bool:
    """Whether every row of `got` is its row of `want` times a positive factor of its own (a normaliser that
    is off: 1 / l_wrong where 1 / l is meant), some factor clearly not 1. Zeros or a sign flipped are not that."""
    got = _as_float64(got)
    if got.shape != want.shape or not bool(torch.isfinite(got).all()):
        return False
    factor = (got * want).sum(dim=-1, keepdim=True) / (want * want).sum(dim=-1, keepdim=True).clamp_min(1e-300)
    return (bool(((factor > 1e-3) & (factor < 1e3)).all()) and bool(((factor - 1).abs() > 1e-3).any())
            and not compare(factor * want, want, atol=2 * atol, rtol=2 * rtol).passed  # factors that show
            and compare(got, factor * want, atol=atol, rtol=rtol).passed)


def diagnose(task: int, result: CheckResult, got, q, k, v, causal: bool, *, atol: float, rtol: float,
             tiles=None, of: str = "out", scale: float | None = None, schedules=(), splits: int = 0,
             step: int | None = None) -> CheckResult:
    """`result`, a failed comparison of `got` (the attention output, or with of="lse" its log-sum-exp),
    with the first mistake it matches said in front. tiles: task 3's (rows, cols); schedules: the
    orders a kernel may visit the keys in (Schedule), tried in turn; splits: a split-KV decode's count;
    scale: the scale the code was given (1/sqrt(head_dim) when None); step: the README step an optional
    part makes all of these in (task 4's 16-bit kernel: the online softmax and its mask are step 10), in place
    of the float32 kernel's."""
    if result.passed or result.untouched or not isinstance(got, torch.Tensor):
        return result
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    schedules = [Schedule(width=tiles[1])] if tiles is not None else list(schedules)
    pick = 1 if of == "lse" else 0
    right = _attention(q, k, v, causal, scale=scale)[pick]
    for mistake in _candidates(task, ("scores", "mask", "softmax", "tiles", "splits")):
        if (mistake.how.get("slip") == "lse") != (of == "lse"):
            continue
        if mistake.made_in == "tiles":
            tries = [dict(schedule=s) for s in schedules if mistake.applies(causal, seq_q, seq_k, s)]
        elif mistake.made_in == "splits":
            tries = [dict(splits=splits)] if splits > 1 and not causal else []
        else:
            tries = [{}] if mistake.applies(causal, seq_q, seq_k) else []
        for how in tries:
            wrong = mistake.attend(q, k, v, causal, scale=scale, **how)[pick]
            # a mistake that does not show on these inputs (within twice the tolerance of the right output: acc not
            # rescaled over a single tile) names nothing: an output that only just misses the tolerance matches it
            if matches_mistake(wrong, right, 2 * atol, 2 * rtol)[0]:
                continue
            # a decode one position short of a single row reads none: every row NaN (or zero), and that is all it
            # shows; every other mistake must leave some row with keys to be told apart from a kernel that is NaN
            matched, extra = matches_mistake(got, wrong, atol, rtol,
                                             every_row_lost=mistake.how.get("mask") == "short")
            if matched:
                return _say(result, task, mistake.says, step or mistake.steps[task], extra=extra)
    if of == "out" and task in FACTOR_STEPS and _one_factor_per_row(got, right, atol, rtol):
        return _say(result, task, ONE_FACTOR_PER_ROW, step or FACTOR_STEPS[task])
    return result


def diagnose_sequences(task: int, result: CheckResult, got, q, k, v, causal: bool, spans, *, atol: float,
                       rtol: float, scale: float | None = None, schedules_for=lambda keys: (), splits: int = 0,
                       step: int | None = None) -> CheckResult:
    """diagnose() for a batch whose sequences see keys of their own (left padding: the kernels skip it, so each
    sequence is a problem of its own). spans[b] = (first query row, first key, end of keys) of sequence b; the
    first sequence whose rows fail is diagnosed alone, its keys tiled from its first (schedules_for(its key
    count)), and named in the diagnosis."""
    if result.passed or result.untouched or not isinstance(got, torch.Tensor):
        return result
    for b, (row, first, end) in enumerate(spans):
        if row >= q.shape[-2] or first >= end:
            continue
        qs, ks, vs = q[b:b + 1, ..., row:, :], k[b:b + 1, ..., first:end, :], v[b:b + 1, ..., first:end, :]
        mine = got[b:b + 1, ..., row:, :]
        if compare(mine, _attention(qs, ks, vs, causal, scale=scale)[0], atol=atol, rtol=rtol).passed:
            continue
        found = diagnose(task, CheckResult(False, ""), mine, qs, ks, vs, causal, atol=atol, rtol=rtol, scale=scale,
                         schedules=schedules_for(end - first), splits=splits, step=step)
        if found.message:
            where = f" (sequence {b}, whose keys are {first} .. {end - 1}{f' and queries {row} on' if row else ''})"
            result.message = f"{found.message.rstrip()}{where} {result.message}"
        return result
    return result


def diagnose_scores(task: int, result: CheckResult, got, q, k, *, atol: float, rtol: float) -> CheckResult:
    """`result`, a failed comparison of the score matrix `got` (no mask), with the mistake it matches."""
    if result.passed or not isinstance(got, torch.Tensor):
        return result
    for mistake in _candidates(task, ("scores",)):
        if matches_mistake(got, _scores(q, k, False, **mistake.how), atol, rtol)[0]:
            return _say(result, task, mistake)
    return result


def diagnose_mask(task: int, result: CheckResult, hidden: torch.Tensor) -> CheckResult:
    """`result`, a failed check of a causal mask, with the mistake whose hidden pairs are exactly `hidden`
    (bool, (..., seq_q, seq_k): where the output was -inf or very negative)."""
    seq_q, seq_k = hidden.shape[-2:]
    for mistake in _candidates(task, ("mask",)):
        if mistake.applies(True, seq_q, seq_k) and bool((hidden == _future(seq_q, seq_k, mistake.how["mask"])).all()):
            return _say(result, task, mistake)
    return result


def diagnose_layout(task: int, result: CheckResult, got, x, heads: int, layout: str) -> CheckResult:
    """`result`, a failed check of split_heads(x) (layout "split") or merge_heads(x) ("merge"), with the
    mistake it matches."""
    if result.passed or not isinstance(got, torch.Tensor):
        return result
    for mistake in _candidates(task, ("layout",)):
        if mistake.how["layout"] == layout and matches_mistake(got, _heads(x.double(), heads, layout), 0.0, 0.0)[0]:
            return _say(result, task, mistake)
    return result
