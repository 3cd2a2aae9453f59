"""Task 4's steps 1-6: the float32 kernel against float64 (plain, grouped-query and padded cases), the layer against
nn.MultiheadAttention, and the given binding's errors; run by checks/task4/test.py. The shapes' names and inputs
here serve the optional parts too (half.py, backward.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from harness import cli
from harness.diagnose import diagnose, diagnose_sequences, tile_schedules
from harness.checks import builds_on, compare, exact_float32, expect_errors, guard_damage, guarded_input, guarded_output, random_tensor
from common.layer import mha_weights
from harness.attention_math import attention_float64, causal_mask, expand_kv_heads
from checks.task4.measure import ATOL, RTOL
from checks.task4.cases import CASES, GROUPED_CASES


def shape_text(shape) -> str:
    return "batch {} heads {} seq {}x{} head_dim {}".format(*shape)


def grouped_text(shape) -> str:
    b, h, kvh, sq, sk, d, starts = shape
    group = "MQA" if kvh == 1 else f"{kvh} kv heads"
    padding = f" key_start {','.join(map(str, starts))}" if starts is not None else ""
    return f"batch {b} heads {h} ({group}) seq {sq}x{sk} head_dim {d}{padding}"


def grouped(shape):
    """A case as (batch, heads, kv_heads, seq_q, seq_k, head_dim, key_start): a CASES shape has
    kv_heads == heads and no padding."""
    return shape if len(shape) == 7 else (shape[0], shape[1], shape[1], *shape[2:5], None)


def make_inputs(shape, seed, magnitude=1.0):
    b, h, kvh, sq, sk, d, _ = grouped(shape)
    return (random_tensor((b, h, sq, d), seed) * magnitude, random_tensor((b, kvh, sk, d), seed + 1),
            random_tensor((b, kvh, sk, d), seed + 2))


def check_case(worker, shape, causal, seed, scale=None, magnitude=1.0, constants=None):
    """One case, plain or grouped-query and padded (`grouped`); a wrong output is compared with the common
    mistakes (harness/diagnose.py), the online softmax's slips under the student's BLOCK_COLS (`constants`,
    read from their file) and other widths; with padding, in the first sequence that fails, over its own keys."""
    heads, starts = grouped(shape)[1], grouped(shape)[6]
    q, k, v = make_inputs(shape, seed, magnitude)
    key_start = None if starts is None else torch.tensor(starts, dtype=torch.int32)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    inputs = [guarded_input(name, t) for name, t in zip("qkv", (q, k, v))]
    out = guarded_output("out", q.shape)
    worker.call("forward", *(t.tensor for t in inputs), out.tensor, causal, scale,
                None if key_start is None else key_start.cuda())
    result = compare(out.tensor, attention_float64(q, k, v, causal, scale, key_start)[0], atol=ATOL, rtol=RTOL,
                     poisoned=True)
    damage = guard_damage(*inputs, out)
    if damage:
        return damage
    k, v = expand_kv_heads(k, heads), expand_kv_heads(v, heads)  # the float64 side only
    widths = (constants or {}).get("BLOCK_COLS")
    if key_start is not None:
        spans = padded_spans(starts, q.shape[-2], k.shape[-2])
        return diagnose_sequences(4, result, out.tensor, q, k, v, causal, spans, atol=ATOL, rtol=RTOL, scale=scale,
                                  schedules_for=lambda keys: tile_schedules(widths))
    return diagnose(4, result, out.tensor, q, k, v, causal, atol=ATOL, rtol=RTOL, scale=scale,
                    schedules=tile_schedules(widths))


def padded_spans(starts, seq_q: int, seq_k: int) -> list[tuple[int, int, int]]:
    """Each sequence's (first query row, first key, end of keys) under left padding: its first starts[b] keys are
    padding, and the queries that would see only those (the first starts[b] - (seq_k - seq_q)) get zeros."""
    return [(min(seq_q, max(0, padding - (seq_k - seq_q))), padding, seq_k) for padding in starts]


def check_layer(worker, hidden, heads, seq, causal, seed):
    torch.manual_seed(seed)
    reference = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True)
    worker.call("make_layer", hidden, heads, [w.cuda() for w in mha_weights(reference)])
    x = random_tensor((2, seq, hidden), seed + 1)
    out = worker.call("layer", x.cuda(), causal)
    with torch.no_grad(), exact_float32():
        mask = causal_mask(seq, seq) if causal else None
        expected, _ = reference.double()(x.double(), x.double(), x.double(), attn_mask=mask, need_weights=False)
    return compare(out, expected, atol=ATOL * float(expected.abs().max()), rtol=RTOL, name="layer output",
                   device="cuda")


def check_errors(worker):
    """The given binding's errors (not the student's work: reported, not scored)."""
    q = torch.randn(1, 2, 8, 64, device="cuda")
    bad = {
        "CPU tensor": ((q.cpu(), q, q, q), "must be a CUDA tensor"),
        "float64": ((q.double(), q, q, q), "float32"),
        "half": ((q, q.half(), q, q), "float32"),
        "non-contiguous": ((q.transpose(2, 3), q, q, q), "contiguous"),
        "3 dimensions": ((q[0], q[0], q[0], q[0]), "4 dimensions"),
        "k/v mismatch": ((q, q, q[:, :, :4], q), "shape"),
        "head_dim 256": ((torch.randn(1, 1, 4, 256, device="cuda"),) * 4, "head_dim must be at most 128"),
        "wrong out shape": ((q, q, q, q[:, :1]), "out"),
        "out is q": ((q, q.clone(), q.clone(), q), "must not share memory"),
        "causal with seq_q > seq_k": ((q, q[:, :, :4], q[:, :, :4], q.clone()), "seq_q <= seq_k"),
        "kv_heads not dividing heads": ((torch.randn(1, 3, 8, 64, device="cuda"), q, q, torch.empty(1, 3, 8, 64,
                                                                                                  device="cuda")),
                                        "must divide q's heads"),
    }
    calls = [(what, (*args, what.startswith("causal"), 0.125), words) for what, (args, words) in bad.items()]
    two = (q, q.clone(), q.clone(), torch.empty_like(q), True, 0.125)
    calls += [(f"key_start {what}", (*two, key_start), words) for what, key_start, words in [
        ("int64", torch.zeros(1, dtype=torch.int64, device="cuda"), "must be int32"),
        ("on the CPU", torch.zeros(1, dtype=torch.int32), "must be a CUDA tensor"),
        ("of two values for a batch of one", torch.zeros(2, dtype=torch.int32, device="cuda"), "must have shape [1]"),
        ("past seq_k", torch.tensor([9], dtype=torch.int32, device="cuda"), "between 0 and seq_k = 8"),
        ("negative", torch.tensor([-1], dtype=torch.int32, device="cuda"), "between 0 and seq_k = 8"),
    ]]
    more_queries = (q, q[:, :, :4].contiguous(), q[:, :, :4].contiguous(), torch.empty_like(q), False, 0.125,
                    torch.zeros(1, dtype=torch.int32, device="cuda"))
    calls.append(("key_start with more queries than keys", more_queries, "key_start needs seq_q <= seq_k"))
    calls += [(f"scale {scale}", (q, q.clone(), q.clone(), torch.empty_like(q), False, scale), "scale must be finite")
              for scale in (math.nan, math.inf)]
    return expect_errors(lambda *args: worker.call("forward", *args), calls)


def attention_part(report, worker, hidden_cases, constants):
    """Steps 1-6: the float32 kernel against float64, and the layer against nn.MultiheadAttention."""
    report.begin_part("attention", (1, 2, 3, 4, 5, 6))
    for case in cli.cases(4, "attention", CASES, hidden_cases, shape_text, causal_ok=lambda s: s[2] <= s[3]):
        report.run(case.name, lambda: check_case(worker, case.shape, case.causal, case.seed, constants=constants))
    for case in cli.cases(4, "grouped", GROUPED_CASES, hidden_cases, grouped_text, causal_ok=lambda s: s[3] <= s[4]):
        report.run(case.name, lambda: check_case(worker, case.shape, case.causal, case.seed, constants=constants))
    seed = cli.seed(7, hidden_cases)
    report.run("scale 0.3 and large scores (q x 4)",
               lambda: check_case(worker, (2, 2, 150, 150, 64), True, seed, scale=0.3, magnitude=4.0,
                                  constants=constants))
    failed = sum(not c.passed for c in report.cases[report.part_start:])  # the layer runs the kernel checked above
    for hidden, heads, seq in ((256, 4, 100), (4096, 32, 65)):
        for causal in (False, True):
            report.run(f"layer hidden {hidden} heads {heads} seq {seq}{' causal' if causal else ''} "
                       "vs nn.MultiheadAttention",
                       lambda: builds_on(check_layer(worker, hidden, heads, seq, causal, cli.seed(11, hidden_cases)),
                                         failed, "the kernel's own cases"))
    report.end_part("attention")
