"""python -m task1.test [--solution] [--json PATH]

Checks Task 1's naive multi-head attention on the CPU (and on CUDA when present), step by step:
- each of steps 1, 2, 3 and 5 on its own (split_heads, attention_scores, apply_causal_mask,
  merge_heads), so a failure names its step,
- the attention core (steps 2-4 together) against a float64 reference,
- the whole layer against torch.nn.MultiheadAttention (batch_first, bias=False,
  the same weights) run in float64,
causal and not, on shapes that include seq 1, lengths that are not powers of two,
cross-attention (seq_q != seq_k) and hidden 4096 with 32 heads.
Your code runs in a worker process (task1/entry.py); this file only checks what it returns.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from common import impl

from harness import cli
from harness.checks import SHOW_FIRST, CheckResult, compare, exact_float32, random_tensor, wrong_kind
from harness.diagnose import diagnose, diagnose_layout, diagnose_mask, diagnose_scores
from common.layer import mha_weights
from harness.records import Report
from harness.attention_math import attention_float64, causal_mask

# (batch, seq_q, seq_k, hidden, heads)
CASES = [
    (2, 1, 1, 64, 4),
    (3, 17, 17, 96, 6),
    (2, 100, 100, 128, 8),
    (2, 5, 33, 64, 4),
    (1, 128, 128, 4096, 32),
]
# The steps on their own: square, and cross-attention, where a mask aligned to the wrong end shows.
STEP_CASES = [(2, 7, 7, 48, 4), (1, 5, 12, 64, 2)]
ATOL, RTOL = 2e-5, 1e-4  # float32 against float64: rounding stays far below these
MASKED = -1e4  # a score at most this counts as masked: next to the others, softmax gives it weight 0


def shape_text(shape) -> str:
    return "batch {} seq {}x{} hidden {} heads {}".format(*shape)


def check_split(worker, case, failing):
    batch, seq, _, hidden, heads = case.shape
    x = random_tensor((batch, seq, hidden), case.seed)
    out = worker.call("split_heads", x.to(case.device), heads)
    d = hidden // heads
    expected = torch.stack([x[..., h * d:(h + 1) * d] for h in range(heads)], dim=1)  # head h: its d columns
    result = compare(out, expected, atol=0, rtol=0, name="split_heads(x, num_heads)", device=case.device)
    return diagnose_layout(1, result, out, x, heads, "split")


def check_scores(worker, case, failing):
    batch, seq_q, seq_k, hidden, heads = case.shape
    q = random_tensor((batch, heads, seq_q, hidden // heads), case.seed)
    k = random_tensor((batch, heads, seq_k, hidden // heads), case.seed + 1)
    out = worker.call("attention_scores", q.to(case.device), k.to(case.device))
    expected = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(hidden // heads)
    result = compare(out, expected, atol=ATOL, rtol=RTOL, name="attention_scores(q, k)", device=case.device)
    return diagnose_scores(1, result, out, q, k, atol=ATOL, rtol=RTOL)


def check_mask(worker, case, failing):
    batch, seq_q, seq_k, _, heads = case.shape
    scores = random_tensor((batch, heads, seq_q, seq_k), case.seed)
    out = worker.call("apply_causal_mask", scores.to(case.device))
    name = "apply_causal_mask(scores)"
    wrong = wrong_kind(out, scores.shape, name, case.device)
    if wrong:
        return wrong
    future = causal_mask(seq_q, seq_k)
    hidden = out.double() <= MASKED
    misplaced = hidden ^ future
    too_high = future & ~hidden & (out != scores)  # changed, but not enough to hide them
    if too_high.any():
        value = float(out[too_high][0])
        return CheckResult(False, f"{name}: the future pairs hold values such as {value:g} instead of -inf; a "
                           f"finite value hides a pair only while the other scores stay far above it (the check "
                           f"takes at most {MASKED:g}): fill them with float('-inf') (README, Task 1, step 3)",
                           mismatches=int(too_high.sum()))
    if misplaced.any():
        shown = [f"{tuple(i)}: {'hidden, should be visible' if hidden[tuple(i)] else 'visible, should be hidden'}"
                 for i in misplaced.nonzero()[:SHOW_FIRST].tolist()]
        result = CheckResult(False, f"{name}: {int(misplaced.sum())} of {misplaced.numel()} (query i, key j) pairs "
                             f"masked wrong (query i may see keys 0 to i{see_more(seq_q, seq_k)}, no later ones); "
                             f"first: {'; '.join(shown)}", mismatches=int(misplaced.sum()))
        return diagnose_mask(1, result, hidden)
    return compare(out.masked_fill(future, 0.0), scores.masked_fill(future, 0.0), atol=0, rtol=0,
                   name=f"{name}, the scores it must keep")


def see_more(seq_q: int, seq_k: int) -> str:
    return f" + seq_k - seq_q = i + {seq_k - seq_q}" if seq_k != seq_q else ""


def check_merge(worker, case, failing):
    batch, seq, _, hidden, heads = case.shape
    x = random_tensor((batch, heads, seq, hidden // heads), case.seed)
    out = worker.call("merge_heads", x.to(case.device))
    expected = torch.cat(x.unbind(1), dim=-1)  # head h's values in columns h * head_dim onwards
    result = compare(out, expected, atol=0, rtol=0, name="merge_heads(x)", device=case.device)
    return diagnose_layout(1, result, out, x, heads, "merge")


def check_core(worker, case, failing):
    batch, seq_q, seq_k, hidden, heads = case.shape
    d = hidden // heads
    q = random_tensor((batch, heads, seq_q, d), case.seed)
    k = random_tensor((batch, heads, seq_k, d), case.seed + 1)
    v = random_tensor((batch, heads, seq_k, d), case.seed + 2)
    on = lambda t: t.to(case.device)  # noqa: E731  the worker gets its copy; the reference uses ours
    out = worker.call("attention", on(q), on(k), on(v), case.causal)
    result = compare(out, attention_float64(q, k, v, case.causal)[0], atol=ATOL, rtol=RTOL,
                     name="attention(q, k, v)", device=case.device)
    return diagnose(1, result, out, q, k, v, case.causal, atol=ATOL, rtol=RTOL)


def check_layer(worker, case, failing):
    batch, seq_q, seq_k, hidden, heads = case.shape
    torch.manual_seed(case.seed)
    reference = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True)
    query = random_tensor((batch, seq_q, hidden), case.seed + 1)
    key = random_tensor((batch, seq_k, hidden), case.seed + 2)
    value = random_tensor((batch, seq_k, hidden), case.seed + 3)
    on = lambda t: t.to(case.device)  # noqa: E731
    out = worker.call("layer", hidden, heads, [on(w) for w in mha_weights(reference)],
                      on(query), on(key), on(value), case.causal)
    with torch.no_grad(), exact_float32():
        mask = causal_mask(seq_q, seq_k) if case.causal else None
        expected, _ = reference.double()(query.double(), key.double(), value.double(), attn_mask=mask,
                                         need_weights=False)
    # The layer's outputs are small (about 0.05), so the tolerance follows their scale.
    result = compare(out, expected, atol=ATOL * float(expected.abs().max()), rtol=RTOL, name="layer output",
                     device=case.device)
    failing = [step for step in failing if case.causal or step != 3]  # only causal cases use the mask
    if not result.passed and failing:
        steps = f"step{'s' if len(failing) > 1 else ''} {', '.join(map(str, failing))}"
        result.message = f"an earlier step fails its own checks ({steps}): fix that first. {result.message}"
    return result


# (title, README steps it runs, what its cases are called, check, cases, causal)
PARTS = [
    ("step 1, split_heads", (1,), "split_heads", check_split, STEP_CASES, (False,)),
    ("step 2, attention_scores", (2,), "scores", check_scores, STEP_CASES, (False,)),
    ("step 3, apply_causal_mask", (3,), "mask", check_mask, STEP_CASES, (True,)),
    ("step 4, attention: steps 2-4 against a float64 reference", (2, 3, 4), "attention core vs float64",
     check_core, CASES, (False, True)),
    ("step 5, merge_heads", (5,), "merge_heads", check_merge, STEP_CASES, (False,)),
    ("the layer: steps 1-5 against nn.MultiheadAttention", (1, 2, 3, 4, 5), "layer vs nn.MultiheadAttention",
     check_layer, CASES, (False, True)),
]


def main(argv=None) -> int:
    args = cli.parser(1, __doc__.splitlines()[2]).parse_args(argv)
    report = Report(1, args.solution, "naive multi-head attention", args.student_dir)
    with cli.worker(report, 1, args, cuda=torch.cuda.is_available()) as worker:
        if worker is None:
            return report.finish(args.json)
        failing = []  # the steps whose own checks failed, for the layer's message
        for title, steps, called, check, shapes, causal in PARTS:
            report.begin_part(title, steps)
            for case in cli.cases(1, "steps" if shapes is STEP_CASES else "attention", shapes, args.hidden,
                                  shape_text, devices=cli.devices(), causal=causal,
                                  causal_ok=lambda shape: shape[1] <= shape[2]):
                report.run(f"{case.name}: {called}", lambda: check(worker, case, failing))
            if not report.end_part(called) and not set(failing) & set(steps):
                failing.append(steps[-1])  # step 4's part runs steps 2-4: named only if 2 and 3 pass
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(1, args.solution, args.student_dir, report.attention_ops), kind="rule")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
