"""python -m task1.test [--solution] [--json PATH]

Checks Task 1's naive multi-head attention on the CPU (and on CUDA when present):
- the attention core against a float64 reference,
- the whole layer against torch.nn.MultiheadAttention (batch_first, bias=False,
  the same weights) run in float64,
causal and not, on shapes that include seq 1, lengths that are not powers of two,
cross-attention (seq_q != seq_k) and hidden 4096 with 32 heads.
Your code runs in a worker process (task1/entry.py); this file only checks what it returns.
"""

from __future__ import annotations

import torch
from torch import nn

from common import cli, impl
from common.checks import compare, exact_float32, random_tensor
from common.diagnose import diagnose
from common.layer import mha_weights
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


def describe(shape) -> str:
    return "batch {} seq {}x{} hidden {} heads {}".format(*shape)


def check_core(worker, case):
    batch, seq_q, seq_k, hidden, heads = case.shape
    d = hidden // heads
    q = random_tensor((batch, heads, seq_q, d), case.seed)
    k = random_tensor((batch, heads, seq_k, d), case.seed + 1)
    v = random_tensor((batch, heads, seq_k, d), case.seed + 2)
    on = lambda t: t.to(case.device)  # noqa: E731  the worker gets its copy; the reference uses ours
    out = worker.call("attention", on(q), on(k), on(v), case.causal)
    result = compare(out, attention_reference(q, k, v, case.causal)[0], atol=ATOL, rtol=RTOL,
                     name="attention(q, k, v)", device=case.device)
    return diagnose(1, result, out, q, k, v, case.causal, atol=ATOL, rtol=RTOL)


def check_layer(worker, case, core_fails: bool = False):
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
    if not result.passed and core_fails:
        result.message = f"the attention core fails on this case too: fix that first. {result.message}"
    return result


def main(argv=None) -> int:
    args = cli.parser(1, __doc__.splitlines()[2]).parse_args(argv)
    report = Report(1, args.solution, "naive multi-head attention", args.student_dir)
    with cli.worker(report, 1, args, cuda=torch.cuda.is_available()) as worker:
        if worker is None:
            return report.finish(args.json)
        for case in cli.cases(1, "attention", CASES, args.hidden, describe, devices=cli.devices(),
                              causal_ok=lambda shape: shape[1] <= shape[2]):
            core = report.run(f"{case.name}: attention core vs float64", lambda: check_core(worker, case))
            core_fails = core is None or not core.passed
            report.run(f"{case.name}: layer vs nn.MultiheadAttention", lambda: check_layer(worker, case, core_fails))
    report.run("own work: no PyTorch attention, no reference solution",
               lambda: impl.check_own_work(1, args.solution, args.student_dir, report.attention_ops), kind="rule")
    return report.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
