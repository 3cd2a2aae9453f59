"""Diagnoses of the common attention mistakes, tried when a check fails.

Each mistake is the float64 reference computed wrong in one place. A failed output is
compared with each in turn; the first one it matches names the mistake and the README
step where it is made: "looks like attention without the 1/sqrt(head_dim) scale: see
README, Task 1, step 2". A correct submission never pays for this: it runs only after a
check failed. Each mistake's steps per task are here, so every task says the same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from common.checks import CheckResult, compare


def _scores(q, k, causal, *, scale_power=1, mask="end"):
    """The scaled, masked score matrix in float64; mask: "end" (right: query i sees key j <= i + seq_k - seq_q),
    "start" (aligned to the first key), "late" (one future key seen), "none" (ignored)."""
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.shape[-1]) ** scale_power
    if causal and mask != "none":
        shift = {"end": seq_k - seq_q, "start": 0, "late": seq_k - seq_q + 1}[mask]
        future = torch.ones(seq_q, seq_k, dtype=torch.bool).triu(diagonal=1 + shift)
        scores = scores.masked_fill(future, -math.inf)
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


@dataclass(frozen=True)
class Mistake:
    says: str  # what the output looks like, after "looks like "
    steps: dict[int, int]  # task -> the README step where it is made
    attend: object  # (q, k, v, causal, tiles) -> (out, lse)
    needs: set[str] = field(default_factory=set)  # "causal", "cross" (seq_q != seq_k), "partial", "tiles"

    def applies(self, causal: bool, seq_q: int, seq_k: int, tiles) -> bool:
        if tiles is None and "tiles" in self.needs:
            return False
        partial = tiles is not None and seq_k % tiles[1] != 0 and seq_k > tiles[1]
        return ((causal or "causal" not in self.needs) and (seq_q != seq_k or "cross" not in self.needs)
                and (partial or "partial" not in self.needs))


MISTAKES = [
    Mistake("attention without the 1/sqrt(head_dim) scale", {1: 2, 3: 3},
            lambda q, k, v, c, t: _attention(q, k, v, c, scale_power=0)),
    Mistake("attention scaled by 1/head_dim (the 1/sqrt(head_dim) scale applied twice?)", {1: 2, 3: 3},
            lambda q, k, v, c, t: _attention(q, k, v, c, scale_power=2)),
    Mistake("attention with no causal mask at all", {1: 3, 3: 3},
            lambda q, k, v, c, t: _attention(q, k, v, c, mask="none"), {"causal"}),
    Mistake("a causal mask aligned to the first key instead of the last (triu's diagonal without seq_k - seq_q)",
            {1: 3, 3: 3}, lambda q, k, v, c, t: _attention(q, k, v, c, mask="start"), {"causal", "cross"}),
    Mistake("a causal mask that lets each query see one future key (triu's diagonal one too high)", {1: 3, 3: 3},
            lambda q, k, v, c, t: _attention(q, k, v, c, mask="late"), {"causal"}),
    Mistake("softmax over the queries (dim=-2) instead of the keys (dim=-1)", {1: 4},
            lambda q, k, v, c, t: _attention(q, k, v, c, softmax_dim=-2)),
    Mistake("acc not rescaled by exp(m_old - m_new) when the maximum grows", {3: 4},
            lambda q, k, v, c, t: _tiled_slip(q, k, v, c, t, "acc"), {"tiles"}),
    Mistake("l_i not rescaled by exp(m_old - m_new) when the maximum grows", {3: 4},
            lambda q, k, v, c, t: _tiled_slip(q, k, v, c, t, "l"), {"tiles"}),
    Mistake("the last, partial key tile left out", {3: 2},
            lambda q, k, v, c, t: _tiled_slip(q, k, v, c, t, "tail"), {"tiles", "partial"}),
]
LSE_MISTAKES = [
    Mistake("the log-sum-exp without m_i (log(l_i) alone)", {3: 5},
            lambda q, k, v, c, t: _tiled_slip(q, k, v, c, t, "lse"), {"tiles"}),
]


def diagnose(task: int, result: CheckResult, got, q, k, v, causal: bool, *, atol: float, rtol: float,
             tiles=None, of: str = "out") -> CheckResult:
    """`result`, a failed comparison of `got` (the output, or with of="lse" the log-sum-exp), with the
    first mistake it matches said in front."""
    if result.passed or result.untouched or not isinstance(got, torch.Tensor):
        return result
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    for mistake in LSE_MISTAKES if of == "lse" else MISTAKES:
        if task not in mistake.steps or not mistake.applies(causal, seq_q, seq_k, tiles):
            continue
        wrong = mistake.attend(q, k, v, causal, tiles)[1 if of == "lse" else 0]
        if compare(got, wrong, atol=atol, rtol=rtol).passed:
            result.message = (f"looks like {mistake.says}: see README, Task {task}, step {mistake.steps[task]}. "
                              f"{result.message}")
            break
    return result
