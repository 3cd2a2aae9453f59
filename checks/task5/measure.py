"""Task 5's measuring: the decode kernel in GB/s against the copy bandwidth (the handout's generation, TTFT and TBT:
generation.py).

Used by the test (python -m task5.test), the tuner and the profiler, so none of them imports the
test command. Your kernels are timed in the worker first; with the worker ended, the copy
bandwidth, the reference, naive PyTorch and SDPA are timed here on the same clock (harness/bench.py).
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from harness import bench, flashinfer_decode, points
from harness.checks import GUARD_BITS, GUARD_BITS_16, bit_sum, compare, exact_float32, within
from harness.attention_math import attention_float64
from harness.sandbox import WorkerError
from checks.task5.cases import ATOL, REPS, RTOL
from checks.task5.generation import generation_result, time_student_generation

# (batch, heads, kv_heads, cached tokens, head_dim). The last has grouped-query attention: 4 query heads per
# key/value head (Llama 3's 32 and 8), each cached byte read once for its group; reported, not scored.
DECODE_BENCHMARKS = [(16, 32, 32, 4096, 128), (1, 32, 32, 32768, 128), (16, 32, 8, 4096, 128)]
# Shapes nobody tuned for, reported only: head_dims that are not powers of two, a few heads over a long
# cache, many short sequences, a group of 5. The hidden cases add more (grader/hidden.py, part "shapes").
SHAPE_BENCHMARKS = [(3, 5, 5, 7777, 80), (64, 8, 8, 1000, 64), (8, 40, 8, 2048, 128), (1, 8, 8, 8192, 64)]
LONG_CACHE_NEEDS_SPLITS_BELOW = 128  # batch x heads under which one block per head leaves most SMs idle
FASTEST_VS_COPY = 1.25  # a decode reading K and V faster than this times the copy bandwidth skipped work


class TimedDecode:
    """The inputs of one decode benchmark: a few caches, many distinct queries, every output checked.

    Caches are large (gigabytes), so a request cycles through a few of them, while every
    call gets a query of its own: each output is new, and none can be computed ahead.
    Before each request the queries get fresh values and the outputs the poison pattern;
    one head of each query is copied here first. After it, the caches must be unchanged
    (bit sums), every output written, and the copied heads right (float64).
    """

    def __init__(self, batch, heads, kv_heads, length, head_dim, dtype=torch.float32):
        self.shape, self.kv_heads, self.length, self.dtype = (batch, heads, length, head_dim), kv_heads, length, dtype
        cache_bytes = 2 * batch * kv_heads * length * head_dim * dtype.itemsize
        self.caches = [tuple(torch.randn(batch, kv_heads, length, head_dim, device="cuda", dtype=dtype)
                             for _ in range(2))
                       for _ in range(max(1, min(4, bench.SET_MEMORY_BUDGET // cache_bytes)))]
        estimate_ms = cache_bytes / 3e12 * 1e3  # at about 3 TB/s: sizes a request, nothing else
        self.count = bench.sets_for(batch * heads * head_dim * 2 * dtype.itemsize, estimate_ms, most=128)
        self.sets = [(torch.empty(batch, heads, 1, head_dim, device="cuda", dtype=dtype),
                      torch.empty(batch, heads, 1, head_dim, device="cuda", dtype=dtype), i % len(self.caches))
                     for i in range(self.count)]
        self.prints = [[bit_sum(t) for t in pair] for pair in self.caches]
        self.picked: list = []
        self.rng = random.Random()

    @property
    def bytes_read(self) -> int:
        """K and V as stored: with grouped-query attention, each key/value head once, not once per query head."""
        batch, _, length, head_dim = self.shape
        return 2 * batch * self.kv_heads * length * head_dim * self.dtype.itemsize

    def refresh(self):
        self.picked = []
        for q, out, _ in self.sets:
            q.normal_()
            if self.dtype == torch.float32:
                out.view(torch.int32).fill_(GUARD_BITS)
            else:
                out.view(torch.int16).fill_(GUARD_BITS_16)
            b, h = self.rng.randrange(q.shape[0]), self.rng.randrange(q.shape[1])
            self.picked.append((b, h, q[b, h].cpu()))
        torch.cuda.synchronize()

    def check(self, scale):
        """Every output of the request just timed. The picked heads are compared on the GPU all at once, one
        answer back (a request has up to 128 calls and runs 6 times per benchmark); compare on the CPU names
        the first wrong one."""
        for i, (pair, prints) in enumerate(zip(self.caches, self.prints)):
            if [bit_sum(t) for t in pair] != prints:
                raise AssertionError(f"changed the cache it reads (cache {i + 1}); the decode must only read it")
        written = torch.stack([torch.isfinite(out).all() for _, out, _ in self.sets]).tolist()
        if not all(written):
            raise AssertionError(f"output of timed call {written.index(False) + 1} of {self.count}: not every "
                                 "element was written (or NaN was computed)")
        got, expected, atol = [], [], []
        for (q, out, c), (b, h, q_bh) in zip(self.sets, self.picked):
            k, v = self.caches[c]
            kv = h // (q.shape[1] // self.kv_heads)  # the key/value head query head h reads
            expected.append(attention_float64(q_bh.to(k.device), k[b, kv], v[b, kv], False, scale)[0])
            got.append(out[b, h])
            atol.append(ATOL if self.dtype == torch.float32 else self.half_atol(q_bh, k[b, kv], v[b, kv], scale,
                                                                                  expected[-1]))
        rtol = RTOL if self.dtype == torch.float32 else 0.0
        rows = torch.tensor(atol, dtype=torch.float64, device=expected[0].device)[:, None, None]
        if within(torch.stack(got), torch.stack(expected), atol=rows, rtol=rtol):
            return
        for i, (b, h, _) in enumerate(self.picked):
            result = compare(got[i], expected[i], atol=atol[i], rtol=rtol,
                             name=f"output of timed call {i + 1} of {self.count}, head ({b}, {h})")
            if not result.passed:
                raise AssertionError(result.message)

    @staticmethod
    def half_atol(q_bh, k, v, scale, expected) -> float:
        """What a 16-bit output of these inputs may be off by (checks/task4/measure.py): from SDPA's error here."""
        from checks.task4.measure import half_allowance

        return half_allowance(q_bh[None, None].to(k.device), k[None, None], v[None, None], False, scale, None,
                              expected[None, None])[0]


def time_student_decode(worker, timed: TimedDecode, splits: int):
    scale = 1.0 / math.sqrt(timed.shape[-1])
    kept_sets, kept_caches = worker.keep("decode sets", timed.sets), worker.keep("decode caches", timed.caches)
    batch_call = "decode_batch" if timed.dtype == torch.float32 else "decode_half_batch"
    try:
        timed.refresh()
        worker.call(batch_call, kept_sets, kept_caches, timed.length, scale, splits)  # warm-up
        return bench.host_clock(
            lambda: worker.call(batch_call, kept_sets, kept_caches, timed.length, scale, splits),
            reps=REPS, per_request=timed.count, before=timed.refresh, after=lambda: timed.check(scale))
    except AssertionError as err:
        return str(err)
    finally:
        worker.drop("decode sets")
        worker.drop("decode caches")


def time_decode_here(fn, timed: TimedDecode):
    """A trusted decode (reference kernel, naive PyTorch, SDPA) over the same sets, the same clock."""
    def request():
        for q, out, c in timed.sets:
            fn(q, *timed.caches[c], out)
        torch.cuda.synchronize()

    def measure():
        with torch.no_grad(), exact_float32():
            request()
            return bench.host_clock(request, reps=REPS, per_request=timed.count)
    result = bench.or_out_of_memory(measure)
    torch.cuda.empty_cache()
    return result


def decode_result(timing, timed: TimedDecode, reference, copy_gbs, splits: int, how: str, scored: bool = True,
                  optional: bool = False):
    """One decode benchmark's verdict. scored=False: reported only; optional: run by split-KV, the optional
    part (harness/points.py counts it only where it raises the share)."""
    if isinstance(timing, str):
        return False, timing, {}
    scale = 1.0 / math.sqrt(timed.shape[-1])
    gbs = timed.bytes_read / (timing.median_ms * 1e-3) / 1e9
    metrics = {"kernel_ms": timing.median_ms, "gbs": gbs, "copy_gbs": copy_gbs, "of_copy": gbs / copy_gbs,
               "copy_ms": timed.bytes_read / (copy_gbs * 1e9) * 1e3, "splits": splits,
               "calls_per_request": timed.count}
    heads = timed.shape[1]
    counted = ("" if timed.kv_heads == heads else
               f", each byte once for its {heads // timed.kv_heads} query heads: {timed.kv_heads} key/value heads")
    message = (f"kernel {timing.median_ms:.3f} ms, {gbs:.0f} GB/s of K and V{counted} ({gbs / copy_gbs:.0%} of the "
               f"{copy_gbs:.0f} GB/s copy bandwidth; {how})")
    if reference is not None:
        t_ref = time_decode_here(lambda q, k, v, o: reference.decode(q, k, v, o, timed.length, scale, 0), timed)
        if not isinstance(t_ref, str):
            ref_gbs = timed.bytes_read / (t_ref.median_ms * 1e-3) / 1e9
            metrics |= {"reference_ms": t_ref.median_ms, "reference_gbs": ref_gbs,
                        bench.VS_REFERENCE: t_ref.median_ms / timing.median_ms}
            message += (f", reference kernel {t_ref.median_ms:.3f} ms ({ref_gbs:.0f} GB/s; "
                        f"{metrics[bench.VS_REFERENCE]:.2f}x its speed)")
    t_naive = time_decode_here(lambda q, k, v, o: naive_decode(q, k, v, scale), timed)
    t_sdpa = time_decode_here(lambda q, k, v, o: F.scaled_dot_product_attention(
        q, k, v, scale=scale, enable_gqa=k.shape[1] != q.shape[1]), timed)
    for key, label, t in (("naive", "naive PyTorch", t_naive), ("sdpa", "SDPA", t_sdpa)):
        if not isinstance(t, str):
            metrics[f"{key}_gbs"] = timed.bytes_read / (t.median_ms * 1e-3) / 1e9
            metrics[f"speedup_vs_{key}"] = bench.ratio(t, timing)
            message += f"; {label} {t.median_ms:.3f} ms ({metrics[f'{key}_gbs']:.0f} GB/s)"
    if not scored:
        metrics[points.NOT_SCORED] = ("one block per head: this case counts once split-KV (step 3) runs it"
                                      if timed.kv_heads == heads else "grouped-query attention is reported only")
        message += f"; not scored: {metrics[points.NOT_SCORED]}"
    elif optional:
        metrics[points.OPTIONAL_PART] = "split-KV"
    if gbs > FASTEST_VS_COPY * copy_gbs:
        return False, message + (f": faster than {FASTEST_VS_COPY}x the copy bandwidth, more than the GPU can "
                                 "read, so work was skipped"), metrics
    return True, message, metrics


def time_shape(worker, shape, splits: int):
    """One shape nobody tuned for: the student's decode over its cache, and over a cache of one position at
    the same batch and heads (the call's fixed cost: launches and one trip to memory)."""
    batch, heads, kv_heads, length, d = shape
    timed, floor = TimedDecode(*shape), TimedDecode(batch, heads, kv_heads, 1, d)
    chosen = worker.call("splits_for", batch, heads, kv_heads, length, d) if splits == 0 else 1
    timing = time_student_decode(worker, timed, splits)
    floor_timing = time_student_decode(worker, floor, splits)
    return timed, timing, floor_timing, chosen


def shape_result(timed: TimedDecode, timing, floor_timing, copy_gbs, reference, chosen: int):
    """Which bound a shape meets: memory where its bytes take longer at the copy bandwidth than a call over
    one cached position does, else the call's fixed cost (launches, latency): a share of the copy bandwidth
    says little there."""
    for t in (timing, floor_timing):
        if isinstance(t, str):
            return False, t, {}
    _, heads, _, d = timed.shape
    ms, floor_ms = timing.median_ms, floor_timing.median_ms
    copy_ms = timed.bytes_read / (copy_gbs * 1e9) * 1e3
    gbs = timed.bytes_read / (ms * 1e-3) / 1e9
    bound = "memory" if copy_ms > floor_ms else "launch"
    metrics = {"kernel_ms": ms, "gbs": gbs, "of_copy": gbs / copy_gbs, "copy_ms": copy_ms, "floor_ms": floor_ms,
               "bound": bound, "splits": chosen, "megabytes": timed.bytes_read / 1e6,
               points.NOT_SCORED: "the shapes nobody tuned for are reported only"}
    group = heads // timed.kv_heads
    counted = f" (each byte once for its group of {group})" if group > 1 else ""
    message = (f"{timed.bytes_read / 1e6:.1f} MB of K and V{counted}: kernel {ms * 1e3:.1f} us, {gbs:.0f} GB/s, "
               f"{gbs / copy_gbs:.0%} of the copy bandwidth ({chosen} split{'s' if chosen > 1 else ''} per head); "
               f"{bound}-bound: the bytes take {copy_ms * 1e3:.1f} us at the copy bandwidth, a call over one cached "
               f"position {floor_ms * 1e3:.1f} us")
    if reference is not None:
        scale = 1.0 / math.sqrt(d)
        t_ref = time_decode_here(lambda q, k, v, o: reference.decode(q, k, v, o, timed.length, scale, 0), timed)
        if not isinstance(t_ref, str):
            metrics["reference_ms"] = t_ref.median_ms
            message += (f"; reference kernel {t_ref.median_ms * 1e3:.1f} us "
                        f"({timed.bytes_read / (t_ref.median_ms * 1e-3) / 1e9 / copy_gbs:.0%} of copy)")
    message += "; not scored"
    if gbs > FASTEST_VS_COPY * copy_gbs:
        return False, message + (f": faster than {FASTEST_VS_COPY}x the copy bandwidth, more than the GPU can "
                                 "read, so work was skipped"), metrics
    return True, message, metrics


def naive_decode(q, k, v, scale):
    """Matmul, softmax, matmul, with each group's query heads as rows against their one key/value head."""
    batch, heads, _, head_dim = q.shape
    q = q.view(batch, k.shape[1], heads // k.shape[1], head_dim)  # (batch, kv_heads, group, head_dim)
    out = torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v
    return out.view(batch, heads, 1, head_dim)


PAGED_BENCHMARK = (16, 32, 32, 4096, 128)  # (batch, heads, kv_heads, cached tokens, head_dim)
PAGED_HALF_BENCHMARK = (16, 32, 8, 4096, 128)  # step 7's, in bf16: the grouped heads of Llama-3-style models
PAGE_SIZES = (16, 64)


def time_paged(worker, splits: int, dtype=torch.float32, shape=None):
    """Step 5 (step 7 for a 16-bit dtype): your paged decode against your contiguous decode on the same rows, both
    with the lengths in GPU memory, in the same run (host clock around requests of many calls, as the decode
    benchmarks): {page size or 0 for contiguous: Timing}, or a message. Every paged output must be the contiguous
    one, bit for bit, and the contiguous one is trusted here: its checks passed first. shape: (batch, heads,
    kv_heads, length, head_dim), length a multiple of every page size (default: the part's benchmark,
    PAGED_BENCHMARK or PAGED_HALF_BENCHMARK)."""
    batch, heads, kv_heads, length, d = shape or (PAGED_BENCHMARK if dtype == torch.float32 else PAGED_HALF_BENCHMARK)
    contiguous_call = "decode_batch" if dtype == torch.float32 else "decode_half_batch"
    scale = 1.0 / math.sqrt(d)
    k, v = (torch.randn(batch, kv_heads, length, d, device="cuda", dtype=dtype) for _ in range(2))
    count = bench.sets_for(2 * batch * heads * d * dtype.itemsize, k.nbytes * 2 / 3e12 * 1e3, most=128)
    sets = [(torch.randn(batch, heads, 1, d, device="cuda", dtype=dtype),
             torch.empty(batch, heads, 1, d, device="cuda", dtype=dtype), 0) for _ in range(count)]
    lengths = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    kept_sets = worker.keep("paged sets", sets)
    timings, expected = {}, None
    try:
        for page_size in (0, *PAGE_SIZES):
            if page_size:
                pages_per_seq = length // page_size
                order = torch.randperm(batch * pages_per_seq, device="cuda")
                table = order.view(batch, pages_per_seq).to(torch.int32)
                pools = [torch.empty(batch * pages_per_seq, kv_heads, page_size, d, device="cuda", dtype=dtype)
                         for _ in range(2)]
                for pool, cache in zip(pools, (k, v)):  # page table[b, i] holds rows i * page_size .. of sequence b
                    pool[order] = cache.view(batch, kv_heads, pages_per_seq, page_size, d).transpose(1, 2).reshape(
                        -1, kv_heads, page_size, d)
                kept = worker.keep("paged caches", [(*pools, table)])
                request = lambda: worker.call("decode_paged_batch", kept_sets, kept, lengths, scale, splits)  # noqa: E731
            else:
                kept = worker.keep("paged caches", [(k, v)])
                request = lambda: worker.call(contiguous_call, kept_sets, kept, lengths, scale, splits)  # noqa: E731
            for _, out, _ in sets:  # poisoned: an output this decode leaves unwritten shows
                out.view(torch.int32 if dtype == torch.float32 else torch.int16).fill_(
                    GUARD_BITS if dtype == torch.float32 else GUARD_BITS_16)
            request()  # warm-up
            timings[page_size] = bench.host_clock(request, reps=REPS, per_request=count)
            outs = torch.stack([out for _, out, _ in sets])
            if not outs.isfinite().all():
                return (f"{f'pages of {page_size}' if page_size else 'contiguous'}: not every output element was "
                        "written (or NaN was computed)")
            outs = outs.view(torch.int16 if dtype != torch.float32 else torch.int32)
            if expected is None:
                expected = outs.clone()
            elif not torch.equal(outs, expected):
                return f"pages of {page_size}: the paged decode's outputs differ from the contiguous decode's"
            worker.drop("paged caches")
            torch.cuda.empty_cache()
    except WorkerError as err:
        return f"raised {err.kind}: {err.message.splitlines()[0]}"
    finally:
        worker.drop("paged caches")  # what a failed comparison left kept
        worker.drop("paged sets")
    return timings


def paged_result(timings, dtype=torch.float32):
    if isinstance(timings, str):
        return False, timings, {}
    contiguous = timings[0].median_ms
    metrics, said = {"contiguous_ms": contiguous}, []
    for page_size in PAGE_SIZES:
        ms = timings[page_size].median_ms
        metrics |= {f"paged_{page_size}_ms": ms, f"paged_{page_size}_over_contiguous": ms / contiguous}
        said.append(f"pages of {page_size}: {ms:.3f} ms ({ms / contiguous:.3f}x)")
    batch, heads, kv_heads, length, d = PAGED_BENCHMARK if dtype == torch.float32 else PAGED_HALF_BENCHMARK
    step = 5 if dtype == torch.float32 else 7
    metrics[points.NOT_SCORED] = f"the paged cache (step {step}) is reported only"
    if dtype != torch.float32:  # an optional part's timing: kernel_ms marks it one (the pages of 16's)
        metrics["kernel_ms"] = timings[PAGE_SIZES[0]].median_ms
    grouped = f" ({kv_heads} kv heads)" if kv_heads != heads else ""
    return True, (f"batch {batch} heads {heads}{grouped} cached tokens {length} head_dim {d}: contiguous "
                  f"{contiguous:.3f} ms; "
                  f"{'; '.join(said)}; outputs bit for bit the contiguous decode's; not scored"), metrics


def run_benchmarks(report, worker, split_passed: bool, prefill: str = "task4", paged_passed: bool = False,
                   shapes=()):
    """Your kernels in the worker first, then, with the worker ended, everything else here. prefill: what
    the generation's prompt runs ("task4": your Task 4 kernel; "pytorch": plain PyTorch, when it failed).
    paged_passed: also time the paged decode (step 5) against the contiguous one. shapes: the shapes nobody
    tuned for (SHAPE_BENCHMARKS and the hidden ones), reported only."""
    splits = 0 if split_passed else 1
    paged = time_paged(worker, splits) if paged_passed else None
    timed_shapes = [(shape, *time_shape(worker, shape, splits)) for shape in shapes]
    student, timed_sets = {}, {}
    for case in DECODE_BENCHMARKS:
        batch, heads, kv_heads, length, d = case
        timed = TimedDecode(batch, heads, kv_heads, length, d)
        chosen = worker.call("splits_for", batch, heads, kv_heads, length, d) if splits == 0 else 1
        student[case] = time_student_decode(worker, timed, splits), chosen
        timed_sets[case] = timed
    generation = time_student_generation(worker, prefill)
    worker.stop()  # its context is gone, and any work it had queued with it: the GPU is ours alone now

    copy_gbs = bench.copy_bandwidth_gbs()
    reference = bench.load_reference(report, 5)
    for case in DECODE_BENCHMARKS:
        batch, heads, kv_heads, length, d = case
        timing, chosen = student[case]
        how = (f"{chosen} split{'s' if chosen > 1 else ''} per head, the launcher's choice" if splits == 0 else
               "one block per head: split-KV is used once its checks pass")
        grouped = kv_heads != heads
        name = (f"decode batch {batch} heads {heads}{f' ({kv_heads} kv heads)' if grouped else ''} cached tokens "
                f"{length} head_dim {d}")
        # one block per (batch, head) fills the GPU only with many heads: the long cache of one
        # sequence counts when split-KV runs it (harness/points.py)
        long_cache = batch * heads < LONG_CACHE_NEEDS_SPLITS_BELOW
        report.run(name, lambda: decode_result(timing, timed_sets[case], reference, copy_gbs, chosen, how,
                                               scored=not grouped and (splits == 0 or not long_cache),
                                               optional=long_cache and not grouped),
                   kind="benchmark")
        del timed_sets[case]
        torch.cuda.empty_cache()
    for shape, timed, timing, floor_timing, chosen in timed_shapes:
        batch, heads, kv_heads, length, d = shape
        name = (f"decode, a shape nobody tuned for: batch {batch} heads {heads}"
                f"{f' ({kv_heads} kv heads)' if kv_heads != heads else ''} cached tokens {length} head_dim {d}")
        report.run(name, lambda: shape_result(timed, timing, floor_timing, copy_gbs, reference, chosen),
                   kind="benchmark")
    timed_shapes.clear()
    torch.cuda.empty_cache()
    report.run("generation: time to first token and between tokens", lambda: generation_result(generation),
               kind="benchmark")
    if paged is not None:
        report.run("paged decode (step 5) against the contiguous decode", lambda: paged_result(paged),
                   kind="benchmark")


# Step 6 (optional): the decode over a 16-bit cache, at the scored shape and the long one, bf16 and fp16, then the
# grouped one in bf16: GB/s of K and V as stored (half the bytes of float32) against the copy bandwidth.
HALF_BENCHMARKS = [(16, 32, 32, 4096, 128, torch.bfloat16), (16, 32, 32, 4096, 128, torch.float16),
                   (1, 32, 32, 32768, 128, torch.bfloat16), (16, 32, 8, 4096, 128, torch.bfloat16)]


def run_half_benchmarks(report, worker, paged_passed: bool = False):
    """The 16-bit cache's decode timed in the worker (the launcher's splits), and with paged_passed step 7's paged
    decode in bf16 against it, the worker ended, then the copy bandwidth and the reference here; each line an
    optional case: reported, never scored."""
    if paged_passed:
        paged = time_paged(worker, 0, torch.bfloat16)
        report.run("bf16 paged decode (step 7) against the contiguous decode",
                   lambda: paged_result(paged, torch.bfloat16), kind="optional")
    flashinfer_missing = flashinfer_decode.missing()
    if flashinfer_missing:
        report.note(flashinfer_missing)
    timed_sets, student = {}, {}
    for case in HALF_BENCHMARKS:
        batch, heads, kv_heads, length, d, dtype = case
        timed_sets[case] = TimedDecode(batch, heads, kv_heads, length, d, dtype)
        student[case] = time_student_decode(worker, timed_sets[case], 0)
    worker.stop()
    copy_gbs = bench.copy_bandwidth_gbs()
    reference = bench.load_reference(report, 5)
    for case in HALF_BENCHMARKS:
        batch, heads, kv_heads, length, d, dtype = case
        short = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
        name = (f"{short} decode batch {batch} heads {heads}"
                f"{f' ({kv_heads} kv heads)' if kv_heads != heads else ''} cached tokens {length} head_dim {d}")
        report.run(name, lambda: half_result(student[case], timed_sets[case], reference, copy_gbs,
                                             flashinfer=flashinfer_missing is None), kind="optional")
        del timed_sets[case]
        torch.cuda.empty_cache()


def half_result(timing, timed: TimedDecode, reference, copy_gbs, flashinfer: bool = False):
    if isinstance(timing, str):
        return False, timing, {}
    gbs = timed.bytes_read / (timing.median_ms * 1e-3) / 1e9
    metrics = {"kernel_ms": timing.median_ms, "gbs": gbs, "copy_gbs": copy_gbs, "of_copy": gbs / copy_gbs,
               points.NOT_SCORED: "the bf16/fp16 cache (step 6) is optional"}
    message = (f"kernel {timing.median_ms:.3f} ms, {gbs:.0f} GB/s of K and V as stored, {timed.bytes_read / 1e9:.2f} "
               f"GB ({gbs / copy_gbs:.0%} of the {copy_gbs:.0f} GB/s copy bandwidth)")
    if reference is not None and hasattr(reference, "decode_half"):
        scale = 1.0 / math.sqrt(timed.shape[-1])
        t_ref = time_decode_here(lambda q, k, v, o: reference.decode_half(q, k, v, o, timed.length, scale, 0), timed)
        if not isinstance(t_ref, str):
            metrics["reference_ms"] = t_ref.median_ms
            message += (f", reference kernel {t_ref.median_ms:.3f} ms "
                        f"({timed.bytes_read / (t_ref.median_ms * 1e-3) / 1e9 / copy_gbs:.0%} of copy)")
    if flashinfer:
        words, beside = flashinfer_decode.beside(timed, copy_gbs, time_decode_here)
        message += f", {words}"
        metrics |= beside
    message += "; not scored"
    if gbs > FASTEST_VS_COPY * copy_gbs:
        return False, message + (f": faster than {FASTEST_VS_COPY}x the copy bandwidth, more than the GPU can "
                                 "read, so work was skipped"), metrics
    return True, message, metrics
