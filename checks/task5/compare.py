"""python -m task5.compare: task 5's 16-bit decode, yours beside SDPA's and FlashInfer's (task 4's kernels and the rest
of the course: python -m harness.compare).

The case Llama-style models are served with: grouped-query heads (32 query heads over 8 key/value heads), head_dim
128, from many short caches to one long one. Per case, in one run on one GPU:

- yours, in task 5's worker as its benchmarks time it (checks/task5/measure.py): step 6's decode with the
  launcher's splits (distinct queries every call, every output of a request checked against float64 on picked
  heads), and where step 7 is written the paged decode over pages of 16 and of 64 (every output bit for bit the
  contiguous decode's on the same rows);
- SDPA (enable_gqa), and FlashInfer's batch decode over pages of 16 where it is installed (harness/
  flashinfer_decode.py: its outputs checked as yours);
- the time (median of requests on the host clock), the GB/s of K and V as stored (each byte counted once for its
  group of query heads) and their share of the copy bandwidth measured in the same run: what a decode can reach.

Writes compare_decode.csv (--csv), and a bar chart beside it with matplotlib. Reported only: nothing is graded.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from common.impl import REPO, add_solution_flag, remaining_todos
from harness import bench, flashinfer_decode, sandbox
from harness.compare import write_csv
from harness.sandbox import WorkerDied, WorkerError
from checks.task5.measure import (FASTEST_VS_COPY, PAGE_SIZES, TimedDecode, time_decode_here, time_paged,
                                  time_student_decode)

CASES = ((16, 32, 8, 1024, 128), (16, 32, 8, 4096, 128), (16, 32, 8, 8192, 128), (1, 32, 8, 32768, 128),
         (1, 32, 8, 131072, 128))  # (batch, heads, kv_heads, cached tokens, head_dim); issue 59's are the 3rd and 5th
TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
MAX_HEAD_DIM = 128  # task 5's 16-bit kernels' (decode_half.cu)
COLUMNS = ("implementation", "batch", "heads", "kv_heads", "length", "head_dim", "dtype", "time_ms", "gbs",
           "of_copy", "copy_gbs", "of_contiguous", "problem")
YOURS, PAGED, SDPA, FLASHINFER = "yours (step 6)", "yours, pages of {} (step 7)", "SDPA", "FlashInfer, pages of 16"


def written(worker, dtype, paged: bool, student_file: Path | None) -> str | None:
    """Why your step 6 decode (paged: step 7's) is left out, or None: a step still marked TODO in `student_file`
    (None: the reference's), or a small call that raises, returns with its output unwritten as a skeleton does,
    or (paged) differs from step 6's decode on the same rows, which it must equal bit for bit."""
    step = 7 if paged else 6
    todo = [t for t in remaining_todos(student_file) if t.startswith(f"step {step}:")] if student_file else []
    if todo:
        return f"not written yet (see README, Task 5, {todo[0]})"
    q = torch.randn(1, 2, 1, 32, device="cuda", dtype=dtype)
    pools = [torch.randn(2, 2, 16, 32, device="cuda", dtype=dtype) for _ in range(2)]  # 2 pages of 16
    outs = [torch.full_like(q, math.nan) for _ in range(2)]
    try:  # rows 0 .. 15 in page 1, 16 .. 19 in page 0; contiguous, the same rows in order
        worker.call("decode_half", q, *(torch.cat([p[1], p[0]], dim=1)[None] for p in pools), outs[0], 20,
                    1.0 / math.sqrt(32), 0)
        if paged:
            worker.call("decode_paged_half", q, *pools, outs[1], torch.tensor([[1, 0]], dtype=torch.int32,
                        device="cuda"), torch.tensor([20], dtype=torch.int32, device="cuda"), 1.0 / math.sqrt(32), 0)
    except WorkerError as err:
        first = err.message.splitlines()[0][:300] if err.message else ""
        if err.kind == "NotImplementedError" or "not implemented yet" in first:
            return f"not written yet (see README, Task 5, step {step})"
        return f"{err.kind}: {first}"
    out = outs[1] if paged else outs[0]
    if out.isnan().all():
        return f"not written yet (its output stays as it started, every element NaN: see README, Task 5, step {step})"
    if paged and not torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)):
        return ("wrong on a small case (not bit for bit step 6's decode on the same rows): python -m task5.test "
                "--paged-half names the step")
    return None


def case_rows(worker, case, dtype, copy_gbs: float, paged: bool, flashinfer: bool) -> list[dict]:
    """One case's rows: yours, paged where written, SDPA, FlashInfer where installed. A row that fails says why in
    its `problem` (the worker's error, out of memory, outputs wrong); the worker's end (WorkerDied) ends the run."""
    batch, heads, kv_heads, length, d = case
    base = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "length": length, "head_dim": d,
            "dtype": str(dtype).removeprefix("torch."), "copy_gbs": copy_gbs}
    try:
        timed = TimedDecode(batch, heads, kv_heads, length, d, dtype)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return [base | {"implementation": YOURS, "problem": "out of memory (the caches of this case)"}]

    def row(label, timing):
        """timing: a Timing, its median in ms, or why there is none."""
        ms = getattr(timing, "median_ms", timing)
        if not isinstance(ms, float):
            return base | {"implementation": label, "problem": str(timing)}
        gbs = timed.bytes_read / (ms * 1e-3) / 1e9
        fast = (f"faster than {FASTEST_VS_COPY}x the copy bandwidth, more than the GPU can read: work was skipped"
                if label.startswith("yours") and gbs > FASTEST_VS_COPY * copy_gbs else "")  # the student's rows
        return base | {"implementation": label, "time_ms": ms, "gbs": gbs, "of_copy": gbs / copy_gbs, "problem": fast}

    def timing(measure):
        try:
            return measure()
        except WorkerError as err:
            return f"raised {err.kind}: {(err.message.splitlines() or [''])[0][:300]}"
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return "out of memory"

    scale = 1.0 / math.sqrt(d)
    yours = timing(lambda: time_student_decode(worker, timed, 0))
    rows = [row(YOURS, yours)]
    if paged:
        labels = [PAGED.format(p) for p in PAGE_SIZES]
        if isinstance(yours, str):
            rows += [row(label, "not timed: the contiguous decode they are compared with failed") for label in labels]
        elif length % max(PAGE_SIZES):
            rows += [row(label, f"not timed: {length} tokens are not whole pages of {max(PAGE_SIZES)} (every size "
                                "is timed on the same pool)") for label in labels]
        else:
            timings = timing(lambda: time_paged(worker, 0, dtype, case))
            for label, p in zip(labels, PAGE_SIZES):
                rows.append(row(label, timings if isinstance(timings, str) else timings[p]))
                if not isinstance(timings, str):  # against the contiguous decode timed beside it
                    rows[-1]["of_contiguous"] = timings[p].median_ms / timings[0].median_ms
    rows.append(row(SDPA, timing(lambda: time_decode_here(lambda q, k, v, o: F.scaled_dot_product_attention(
        q, k, v, scale=scale, enable_gqa=kv_heads != heads), timed))))
    if flashinfer:  # its time, else why there is none (its outputs wrong, its build or plan failed)
        words, metrics = flashinfer_decode.beside(timed, copy_gbs, time_decode_here)
        rows.append(row(FLASHINFER, metrics.get("flashinfer_paged_16_ms",
                                                words.removeprefix("FlashInfer over pages of 16: "))))
    return rows


def cases_arg(text: str) -> tuple[tuple[int, ...], ...]:
    """B,H,KVH,S,D;B,H,KVH,S,D;..."""
    try:
        cases = tuple(tuple(int(x) for x in part.split(",")) for part in text.split(";") if part.strip())
    except ValueError:
        cases = ()
    if not cases or any(len(c) != 5 or min(c) < 1 or c[1] % c[2] or c[4] > MAX_HEAD_DIM for c in cases):
        raise argparse.ArgumentTypeError(
            f"expected cases as batch,heads,kv_heads,tokens,head_dim separated by ';' (heads a multiple of kv_heads, "
            f"head_dim at most {MAX_HEAD_DIM}, every number at least 1), like 16,32,8,4096,128; got {text!r}")
    return cases


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m task5.compare", description=__doc__.split("\n\n")[0])
    add_solution_flag(p, 5, "compare the reference solution's decode", "python -m task5.compare compares your own")
    p.add_argument("--student-dir", type=Path, default=REPO, metavar="DIR", help="whose files (default: this checkout)")
    p.add_argument("--cases", type=cases_arg, default=CASES, metavar="B,H,KVH,S,D;...",
                   help="the caches (default: " + "; ".join(",".join(map(str, c)) for c in CASES) + ")")
    p.add_argument("--dtype", choices=sorted(TYPES), default="bf16", help="the cache's type (default bf16)")
    p.add_argument("--csv", type=Path, default=Path("compare_decode.csv"),
                   help="where to write the table (the plot goes beside it: the same name, .png)")
    p.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)  # the worker's folder (default build/)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("python -m task5.compare times task 5's kernels: it needs a CUDA GPU")
        return 1
    dtype = TYPES[args.dtype]
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability() < (8, 0):
        print("a bf16 cache needs compute capability 8.0 or newer: try --dtype fp16")
        return 1
    print(f"comparing the {args.dtype} decode on {torch.cuda.get_device_name()}: {len(args.cases)} caches "
          f"({'your code' if not args.solution else 'the reference solution'}, in task 5's worker)")
    copy_gbs = bench.copy_bandwidth_gbs()
    print(f"  copy bandwidth: {copy_gbs:.0f} GB/s (bytes read plus written), measured now")
    missing = flashinfer_decode.missing()
    if missing:
        print(f"  {missing}")
    rows, ended = [], None
    student_file = None if args.solution else args.student_dir / "task5/kernels/decode_half.cu"
    worker = sandbox.Worker(5, args.student_dir, solution=args.solution, scratch=args.scratch, purpose="compare",
                            watch_operators=False)
    try:
        worker.start()
        why = written(worker, dtype, False, student_file)
        if why:
            print(f"  left out: your decode: {why}; nothing to compare")
            return 1
        why_paged = written(worker, dtype, True, student_file)
        if why_paged:
            print(f"  left out: your paged decode: {why_paged}")
        for case in args.cases:
            batch, heads, kv_heads, length, d = case
            print(f"batch {batch} heads {heads} ({kv_heads} kv heads) cached tokens {length} head_dim {d}:", flush=True)
            for r in case_rows(worker, case, dtype, copy_gbs, why_paged is None, missing is None):
                rows.append(r)
                said = (f"{r['time_ms'] * 1e3:9.1f} us {r['gbs']:6.0f} GB/s {r['of_copy']:5.0%} of copy"
                        if "time_ms" in r else "")
                if "of_contiguous" in r:
                    said += f" ({r['of_contiguous']:.3f}x the contiguous decode's time beside it)"
                print(f"  {r['implementation']:28s} {'; '.join(x for x in (said, r['problem']) if x)}", flush=True)
            torch.cuda.empty_cache()  # the case's caches, before the next one's
    except (WorkerError, WorkerDied) as err:  # its start, or a crash or hang: the cases after it are not run
        ended = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        print(f"  your decode's worker ended: {ended}; the cases after it were not run")
    finally:
        worker.stop()
    if rows:
        write_csv(rows, args.csv, COLUMNS)
        plot(rows, args.csv.with_suffix(".png"), args.dtype)
    return 1 if ended or not rows else 0


def plot(rows, png: Path, dtype: str):
    """Each case's share of the copy bandwidth, a bar per implementation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot, only the CSV (pip install matplotlib for one)")
        return
    cases = list(dict.fromkeys((r["batch"], r["heads"], r["kv_heads"], r["length"], r["head_dim"]) for r in rows))
    labels = list(dict.fromkeys(r["implementation"] for r in rows))
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(max(8, 2 * len(cases)), 5))
    for i, label in enumerate(labels):
        shares = {(r["batch"], r["heads"], r["kv_heads"], r["length"], r["head_dim"]): r.get("of_copy", 0.0)
                  for r in rows if r["implementation"] == label}
        ax.bar([c + i * width for c in range(len(cases))], [100 * (shares.get(c) or 0.0) for c in cases], width,
               label=label)
    ax.axhline(100, color="black", linewidth=0.8)
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))],
                  [f"B{b} H{h}/{kv}\nS{s} D{d}" for b, h, kv, s, d in cases])
    ax.set_ylabel("% of the copy bandwidth (K and V read once)")
    ax.set_title(f"{dtype} decode on {torch.cuda.get_device_name()}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"wrote {png}")


if __name__ == "__main__":
    raise SystemExit(main())
