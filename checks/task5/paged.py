"""Task 5's steps 5 and 7 (optional): the paged cache's update, and its decode bit for bit against the contiguous
one, in float32 (step 5) or in bf16 and fp16 (step 7: against step 6's contiguous decode).
"""

from __future__ import annotations

import math

import torch

from harness import cli
from harness.checks import CheckResult, guard_damage, guarded_output, random_tensor
from checks.task4 import measure as task4_measure
from checks.task5.cases import PAGED_DECODE_CASES, PAGED_UPDATE_CASES
from checks.task5.cache_decode import (HALF_CALL_LIMIT, check_decode_per_sequence, decode_inputs, on_gpu,
                                       page_pool)
from checks.task5.half import check_half_decode


def to_pages(cache, pages, table):
    """Copy a contiguous cache (batch, kv_heads, max_pages * page_size, head_dim) into the pool's pages."""
    batch, _, _, head_dim = cache.shape
    page_size = pages.shape[2]
    for b in range(batch):
        for i, page in enumerate(table[b].tolist()):
            pages[page] = cache[b, :, i * page_size:(i + 1) * page_size]


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's values as integers of their width: equal bits, equal values (NaN included)."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def paged_call(name: str, dtype) -> tuple[str, str, dict]:
    """The worker's names for a check's paged call and the contiguous one it is compared with, in float32 (step 5)
    or 16 bits (step 7), and the 16-bit calls' time limit; e.g. ("decode_paged_half", "decode_half", {...})."""
    if dtype == torch.float32:
        return f"{name}_paged", name, {}
    return f"{name}_paged_half", f"{name}_half", HALF_CALL_LIMIT


def check_update_paged(worker, case, dtype=torch.float32):
    """update_cache_paged (or step 7's, for a 16-bit dtype): each new row in the page the block table names,
    nothing else of the pool changed. The last sequence's table names a page outside the pool (-1) where its last
    new row goes: that row is not written."""
    b, kvh, page_size, max_pages, pos, n, d = case.shape
    step = 5 if dtype == torch.float32 else 7
    k_new, v_new = (random_tensor((b, kvh, n, d), case.seed + i, dtype=dtype) for i in range(2))
    k_pages, v_pages, table = page_pool(b, kvh, page_size, max_pages, d, case.seed)
    if 0 <= pos[-1] <= max_pages * page_size - n:
        table[-1, (pos[-1] + n - 1) // page_size] = -1
    before = [random_tensor(k_pages.shape, case.seed + 2 + i, dtype=dtype) for i in range(2)]
    pools = [guarded_output(name, k_pages.shape, dtype=dtype) for name in ("k_pages", "v_pages")]
    for pool, values in zip(pools, before):
        pool.tensor.copy_(values)
    call, _, limit = paged_call("update_cache", dtype)
    worker.call(call, k_new.cuda(), v_new.cuda(), *(p.tensor for p in pools), table.cuda(), on_gpu(pos), **limit)
    damage = guard_damage(*pools)
    if damage:
        return damage
    for pool, values, new in zip(pools, before, (k_new, v_new)):
        expected = values.clone()
        for seq, p in enumerate(pos):
            if 0 <= p <= max_pages * page_size - n:
                for t in range(n):
                    page = int(table[seq, (p + t) // page_size])
                    if page >= 0:
                        expected[page, :, (p + t) % page_size] = new[seq, :, t]
        got = pool.tensor.cpu()
        wrong = (bits(got) != bits(expected)).any(dim=-1).nonzero()
        if len(wrong):
            page, head, row = wrong[0].tolist()
            owner = (table == page).nonzero()
            where = (f"page {page} (sequence {owner[0, 0]}'s page {owner[0, 1]}, positions "
                     f"{owner[0, 1] * page_size} ..)" if len(owner) else f"page {page} (no sequence's)")
            return False, (f"`{pool.name}`: {where}, head {head}, row {row} is wrong: position p of sequence b goes to "
                           f"page block_table[b, p / page_size], row p % page_size, and nowhere when that entry is "
                           f"outside the pool (README, Task 5, step {step})"), {}
    return True, "each new row in the page its block table names, the rest of the pool untouched", {}


def check_decode_paged(worker, case, dtype=torch.float32):
    """decode_paged against the contiguous decode on the same rows (the student's, same splits): bit for bit. For a
    16-bit dtype, step 7's against step 6's."""
    b, h, kvh, page_size, max_pages, lengths, d, starts, splits = case.shape
    shape = (b, h, kvh, max_pages * page_size, lengths, d, starts)
    step = 5 if dtype == torch.float32 else 7
    contiguous = (check_decode_per_sequence(worker, shape, case.seed, splits) if dtype == torch.float32 else
                  check_half_decode(worker, shape, case.seed, splits, dtype))
    passed = contiguous.passed if isinstance(contiguous, CheckResult) else contiguous[0]
    if not passed:
        message = contiguous.message if isinstance(contiguous, CheckResult) else contiguous[1]
        return False, f"the contiguous decode these rows are compared with is wrong: {message}", {}
    q, k_cache, v_cache = (t.to(dtype) for t in decode_inputs(shape, case.seed))
    scale = 1.0 / math.sqrt(d)
    k_pages, v_pages, table = (t.to(dtype) if t.is_floating_point() else t
                               for t in page_pool(b, kvh, page_size, max_pages, d, case.seed))
    to_pages(k_cache, k_pages, table)
    to_pages(v_cache, v_pages, table)
    for seq, end in enumerate(lengths):  # the table past a sequence's pages is not to be read
        table[seq, -(-max(end, 0) // page_size):] = -1
    outs = [guarded_output(name, q.shape, dtype=dtype) for name in ("out (contiguous)", "out (paged)")]
    key_start = None if starts is None else on_gpu(starts)
    paged_name, flat_name, limit = paged_call("decode", dtype)
    worker.call(flat_name, q.cuda(), k_cache.cuda(), v_cache.cuda(), outs[0].tensor, on_gpu(lengths), scale, splits,
                key_start, **limit)
    worker.call(paged_name, q.cuda(), k_pages.cuda(), v_pages.cuda(), outs[1].tensor, table.cuda(),
                on_gpu(lengths), scale, splits, key_start, **limit)
    damage = guard_damage(*outs)
    if damage:
        return damage
    paged, flat = (bits(o.tensor.cpu()) for o in outs[::-1])
    if not torch.equal(paged, flat):
        seq, head = (paged != flat).any(dim=-1).nonzero()[0, :2].tolist()
        nan = bool(torch.isnan(outs[1].tensor.cpu()[seq, head]).any())
        return False, (f"sequence {seq}, head {head}: the paged decode differs from the contiguous one on the same rows"
                       f"{' (NaN: a row read from a page the sequence does not own, or a table entry past its pages)' if nan else ''}; "
                       f"offset(row) must find row p in page block_table[b, p / page_size] (README, Task 5, step "
                       f"{step})"), {}
    return True, f"bit for bit the contiguous decode's output over pages of {page_size}", {}


def paged_half_part(report, worker, hidden_cases) -> bool:
    """Step 7 (optional): the paged cache in both 16-bit types, step 5's cases: the update exact, the decode bit for
    bit step 6's contiguous decode on the same rows; whether every case passed. As half_part, the first case whose
    process crashed or hung ends the part."""
    report.begin_part("paged half", (7,), optional=True)
    runs = [(case, lambda c=case, t=dtype: check_update_paged(worker, c, t))
            for name, dtype in task4_measure.HALF_TYPES.items()
            for case in cli.cases(5, "paged update", PAGED_UPDATE_CASES, hidden_cases, causal=(False,),
                                  shape_text=lambda s, n=name: f"{n} paged update batch {s[0]} kv heads {s[1]} pages "
                                                               f"of {s[2]} ({s[3]} a sequence) pos {s[4]} n_new {s[5]} "
                                                               f"head_dim {s[6]}")]
    runs += [(case, lambda c=case, t=dtype: check_decode_paged(worker, c, t))
             for name, dtype in task4_measure.HALF_TYPES.items()
             for case in cli.cases(5, "paged decode", PAGED_DECODE_CASES, hidden_cases, causal=(False,),
                                   shape_text=lambda s, n=name: (
                                       f"{n} paged decode batch {s[0]} heads {s[1]} kv heads {s[2]} pages of {s[3]} "
                                       f"({s[4]} a sequence) lengths {s[5]} head_dim {s[6]} key_start {s[7]} splits "
                                       f"{s[8]}"))]
    for case, check in runs:
        before = len(report.cases)
        report.run(case.name, check)
        if report.process_died_since(before, "the bf16/fp16 paged part"):
            break
    return report.end_part("paged half")
