"""python -m task1.test [--solution] [--json PATH]

Checks Task 1's naive multi-head attention on the CPU (and on CUDA when present):
- the attention core against a float64 reference,
- the whole layer against torch.nn.MultiheadAttention (batch_first, bias=False,
  the same weights) run in float64,
causal and not, on shapes that include seq 1, lengths that are not powers of two,
cross-attention (seq_q != seq_k) and hidden 4096 with 32 heads.
"""

from __future__ import annotations

import torch
from torch import nn

from common import cli, impl
from common.checks import compare, exact_float32, random_tensor
from common.records import Report
from common.reference import attention_reference, causal_mask

# (batch, seq_q, seq_k, hidden, heads)
CASES = [
    (2, 1, 1, 64, 4),
    (3, 17, 17, 96, 6),
    (2, 100, 100, 128, 8),
    (2, 5, 33, 64, 4),
    (1, 128, 128, 4096, 32),
]
ATOL, RTOL = 2e-5, 1e-4  # float32 against float64: rounding stays far below these


WATCH = impl.AttentionOpWatch()  # every call into the student's code runs under it


def check_core(mod, shape, causal, device, seed):
    batch, seq_q, seq_k, hidden, heads = shape
    d = hidden // heads
    q = random_tensor((batch, heads, seq_q, d), seed, device)
    k = random_tensor((batch, heads, seq_k, d), seed + 1, device)
    v = random_tensor((batch, heads, seq_k, d), seed + 2, device)
    with exact_float32(), WATCH:
        out = mod.attention(q, k, v, causal=causal)
    return compare(out, attention_reference(q, k, v, causal)[0], atol=ATOL, rtol=RTOL, name="attention(q, k, v)")


def check_layer(mod, shape, causal, device, seed):
    batch, seq_q, seq_k, hidden, heads = shape
    torch.manual_seed(seed)
    reference = nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True, device=device)
    layer = mod.MultiHeadAttention(hidden, heads, device=device).load_from_torch(reference)
    query = random_tensor((batch, seq_q, hidden), seed + 1, device)
    key = random_tensor((batch, seq_k, hidden), seed + 2, device)
    value = random_tensor((batch, seq_k, hidden), seed + 3, device)
    with torch.no_grad(), exact_float32():
        with WATCH:
            out = layer(query, key, value, causal=causal)
        mask = causal_mask(seq_q, seq_k, device) if causal else None
        expected, _ = reference.double()(
            query.double(), key.double(), value.double(), attn_mask=mask, need_weights=False
        )
    # The layer's outputs are small (about 0.05), so the tolerance follows their scale.
    return compare(out, expected, atol=ATOL * float(expected.abs().max()), rtol=RTOL, name="layer output")


def main(argv=None) -> int:
    args = cli.parser(1, __doc__.splitlines()[2]).parse_args(argv)
    report = Report(1, args.solution, "naive multi-head attention")
    mod = cli.student_module(report, 1, "attention", args.solution)
    if mod is None:
        return report.finish(args.json)
    cases = CASES + cli.extra_cases(1, args.hidden)
    for device in cli.devices():
        for i, shape in enumerate(cases):
            for causal in (False, True):
                if causal and shape[1] > shape[2]:
                    continue
                name = f"{device} batch {shape[0]} seq {shape[1]}x{shape[2]} hidden {shape[3]} heads {shape[4]}"
                name += " causal" if causal else ""
                seed = cli.seed(100 * i + 10 * causal, args.hidden)
                report.run(f"{name}: attention core vs float64",
                           lambda: check_core(mod, shape, causal, device, seed))
                report.run(f"{name}: layer vs nn.MultiheadAttention",
                           lambda: check_layer(mod, shape, causal, device, seed))
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(1, args.solution, WATCH.seen), kind="rule")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
