"""Diagnoses of the common attention mistakes, tried when a check fails.

Each mistake is the float64 reference computed wrong in one place. A failed output is
compared with each in turn; the first one it matches names the mistake and the README
step where it is made: "looks like attention without the 1/sqrt(head_dim) scale: see
README, Task 1, step 2". A correct submission never pays for this: it runs only after a
check failed. The one list below holds every mistake with its step in each task, so every
task says the same thing; what a check looks at (the whole output, the scores alone, the
mask alone, the heads' layout) picks the mistakes that can show there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from harness.checks import CheckResult, compare


def _future(seq_q: int, seq_k: int, mask: str = "end") -> torch.Tensor:
    """Which (query, key) pairs a causal mask hides. "end" is right: query i sees key j <= i + seq_k - seq_q.
    "start": aligned to the first key; "late"/"early": the diagonal one too high/low; "past": the keys a
    query may see hidden instead (tril); "none": nothing hidden."""
    ones = torch.ones(seq_q, seq_k, dtype=torch.bool)
    if mask == "none":
        return ~ones
    if mask == "past":
        return ones.tril(diagonal=seq_k - seq_q)
    offset = seq_k - seq_q
    return ones.triu(diagonal={"end": 1 + offset, "start": 1, "late": 2 + offset, "early": offset}[mask])


def _scores(q, k, causal, *, scale_power=1, mask="end"):
    """The scaled, masked score matrix in float64, made as the keywords say (see _future)."""
    scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.shape[-1]) ** scale_power
    if causal:
        scores = scores.masked_fill(_future(q.shape[-2], k.shape[-2], mask), -math.inf)
    return scores


def _attention(q, k, v, causal, softmax_dim=-1, scores=None, **how):
    """(out, lse) of attention over `scores`, or over the scores made as `how` says."""
    scores = _scores(q, k, causal, **how) if scores is None else scores
    return torch.softmax(scores, dim=softmax_dim) @ v.double(), torch.logsumexp(scores, dim=-1)


def _tiled_slip(q, k, v, causal, tiles, slip: str):
    """(out, lse) of the online softmax over key tiles of tiles[1] columns, with one slip, from the whole
    score matrix (a shortcut for diagnosing, not a way to do Task 3). A key in tile t that was added while
    the running maximum was R_t carries exp(s - R_t) where a rescaled sum carries exp(s - m), m the final one.
    slip: "acc" or "l" (that sum not rescaled), "tail" (the last partial key tile left out), "lse" (no m)."""
    scores, v = _scores(q, k, causal), v.double()
    seq_k, width = scores.shape[-1], tiles[1]
    if slip == "tail":
        scores[..., seq_k - seq_k % width:] = -math.inf
        return _attention(q, k, v, causal, scores=scores)
    m = scores.amax(dim=-1, keepdim=True)
    tile = torch.arange(seq_k) // width
    tile_max = torch.stack([scores[..., tile == t].amax(dim=-1) for t in range(int(tile[-1]) + 1)], dim=-1)
    running = tile_max.cummax(dim=-1).values[..., tile]  # R_t for every key
    rescaled, kept = torch.exp(scores - m), torch.exp(scores - running)
    acc = (kept if slip == "acc" else rescaled) @ v
    l = (kept if slip == "l" else rescaled).sum(dim=-1, keepdim=True)
    lse = torch.log(rescaled.sum(dim=-1)) + (0 if slip == "lse" else m[..., 0])
    return acc / l, lse


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
    how: dict  # one of: scale_power, mask, softmax_dim (the reference made so), slip (task 3's tiles), layout
    needs: set[str] = field(default_factory=set)  # "causal", "cross" (seq_q != seq_k), "partial" (a partial tile)

    @property
    def made_in(self) -> str:
        """What a check must look at to see it: "scores", "mask", "softmax", "tiles" or "layout"."""
        key = next(iter(self.how))
        return {"scale_power": "scores", "softmax_dim": "softmax", "slip": "tiles"}.get(key, key)

    def applies(self, causal: bool, seq_q: int, seq_k: int, tiles) -> bool:
        partial = tiles is not None and seq_k % tiles[1] != 0 and seq_k > tiles[1]
        return ((tiles is not None or self.made_in != "tiles") and (causal or "causal" not in self.needs)
                and (seq_q != seq_k or "cross" not in self.needs) and (partial or "partial" not in self.needs))

    def attend(self, q, k, v, causal, tiles):
        """(out, lse) of attention with this mistake."""
        if "slip" in self.how:
            return _tiled_slip(q, k, v, causal, tiles, self.how["slip"])
        return _attention(q, k, v, causal, **self.how)


MISTAKES = [
    Mistake("attention without the 1/sqrt(head_dim) scale", {1: 2, 3: 3}, {"scale_power": 0}),
    Mistake("attention scaled by 1/head_dim (the 1/sqrt(head_dim) scale applied twice?)", {1: 2, 3: 3},
            {"scale_power": 2}),
    Mistake("attention with no causal mask at all", {1: 3, 3: 3}, {"mask": "none"}, {"causal"}),
    Mistake("a causal mask aligned to the first key instead of the last (triu's diagonal without seq_k - seq_q)",
            {1: 3, 3: 3}, {"mask": "start"}, {"causal", "cross"}),
    Mistake("a causal mask that lets each query see one future key (triu's diagonal one too high)", {1: 3, 3: 3},
            {"mask": "late"}, {"causal"}),
    Mistake("a causal mask that hides each query's own key too (triu's diagonal one too low)", {1: 3, 3: 3},
            {"mask": "early"}, {"causal"}),
    Mistake("a mask turned around: it hides the keys a query may see, not its future ones (tril, or ~mask?)",
            {1: 3, 3: 3}, {"mask": "past"}, {"causal"}),
    Mistake("softmax over the queries (dim=-2) instead of the keys (dim=-1)", {1: 4}, {"softmax_dim": -2}),
    Mistake("acc not rescaled by exp(m_old - m_new) when the maximum grows", {3: 4}, {"slip": "acc"}),
    Mistake("l_i not rescaled by exp(m_old - m_new) when the maximum grows", {3: 4}, {"slip": "l"}),
    Mistake("the last, partial key tile left out", {3: 2}, {"slip": "tail"}, {"partial"}),
    Mistake("the log-sum-exp without m_i (log(l_i) alone)", {3: 5}, {"slip": "lse"}),
    Mistake("a view straight to (batch, heads, seq, head_dim), without the transpose: each head gets other "
            "tokens' values (view to (batch, seq, heads, head_dim), then transpose)", {1: 1}, {"layout": "split"}),
    Mistake("a reshape straight to (batch, seq, heads * head_dim), without the transpose: the heads' rows "
            "interleave (transpose to (batch, seq, heads, head_dim) first)", {1: 5}, {"layout": "merge"}),
]


def _say(result: CheckResult, task: int, mistake: Mistake) -> CheckResult:
    result.message = f"looks like {mistake.says}: see README, Task {task}, step {mistake.steps[task]}. {result.message}"
    return result


def _candidates(task: int, made_in: tuple[str, ...]):
    return [m for m in MISTAKES if task in m.steps and m.made_in in made_in]


def _matches(got, wrong, atol, rtol) -> bool:
    # compare() ignores NaN in what it is compared with; a mistake whose result is NaN somewhere
    # (a row that sees no key) cannot be told apart that way, so it is never matched
    return bool(torch.isfinite(wrong).all()) and compare(got, wrong, atol=atol, rtol=rtol).passed


def diagnose(task: int, result: CheckResult, got, q, k, v, causal: bool, *, atol: float, rtol: float,
             tiles=None, of: str = "out") -> CheckResult:
    """`result`, a failed comparison of `got` (the attention output, or with of="lse" its log-sum-exp),
    with the first mistake it matches said in front."""
    if result.passed or result.untouched or not isinstance(got, torch.Tensor):
        return result
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    for mistake in _candidates(task, ("scores", "mask", "softmax", "tiles")):
        if not mistake.applies(causal, seq_q, seq_k, tiles) or (mistake.how.get("slip") == "lse") != (of == "lse"):
            continue
        if _matches(got, mistake.attend(q, k, v, causal, tiles)[1 if of == "lse" else 0], atol, rtol):
            return _say(result, task, mistake)
    return result


def diagnose_scores(task: int, result: CheckResult, got, q, k, *, atol: float, rtol: float) -> CheckResult:
    """`result`, a failed comparison of the score matrix `got` (no mask), with the mistake it matches."""
    if result.passed or not isinstance(got, torch.Tensor):
        return result
    for mistake in _candidates(task, ("scores",)):
        if _matches(got, _scores(q, k, False, **mistake.how), atol, rtol):
            return _say(result, task, mistake)
    return result


def diagnose_mask(task: int, result: CheckResult, hidden: torch.Tensor) -> CheckResult:
    """`result`, a failed check of a causal mask, with the mistake whose hidden pairs are exactly `hidden`
    (bool, (..., seq_q, seq_k): where the output was -inf or very negative)."""
    seq_q, seq_k = hidden.shape[-2:]
    for mistake in _candidates(task, ("mask",)):
        if mistake.applies(True, seq_q, seq_k, None) and bool((hidden == _future(seq_q, seq_k, mistake.how["mask"])).all()):
            return _say(result, task, mistake)
    return result


def diagnose_layout(task: int, result: CheckResult, got, x, heads: int, layout: str) -> CheckResult:
    """`result`, a failed check of split_heads(x) (layout "split") or merge_heads(x) ("merge"), with the
    mistake it matches."""
    if result.passed or not isinstance(got, torch.Tensor):
        return result
    for mistake in _candidates(task, ("layout",)):
        if mistake.how["layout"] == layout and _matches(got, _heads(x.double(), heads, layout), 0.0, 0.0):
            return _say(result, task, mistake)
    return result
