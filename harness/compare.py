"""python -m harness.compare: every attention you have written, side by side with PyTorch's, over a sweep.

The course in one picture. Each implementation you have written runs in its task's worker, as in its test:
task 1's naive attention, task 2's separate kernels, task 3's FlashAttention in PyTorch, task 4's fused kernel
and, where written, task 4's bf16 kernel. PyTorch's naive attention and SDPA run here. All get the same inputs
over a sweep of sequence lengths (and head sizes, --head-dims), full and causal. Per implementation and shape:

- time: the median of --reps requests on the host clock after a warm-up, a request being `count` calls, and
  its spread (the interquartile range over the median: a noisy row is said so, its comparisons unreliable);
- TFLOP/s (the attention's two matrix products, halved when causal), and GB/s (q, k, v and out moved once);
- the GPU memory the call allocated beyond its inputs and output, at its peak (on a GPU);
- the error against a float64 reference on CHECKED_HEADS heads: max and mean absolute, MSE, max relative.

Writes compare.csv, and compare.png when matplotlib is installed. Reported only: nothing here is graded. An
implementation still at its skeleton is left out and said so; one that fails on a shape gets its error there.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from common.impl import REPO, add_solution_flag
from harness.checks import exact_float32
from harness.attention_math import attention_flops, attention_float64, naive_attention
from common.impl import remaining_todos
from harness import bench, sandbox
from harness.sandbox import WorkerDied, WorkerError

CHECKED_HEADS = 2  # (batch, head) pairs compared with the float64 reference: its scores are seq x seq in float64
TASK3_TILES = (64, 64)  # block_rows, block_cols for task 3's flash_attention: its defaults, which its timing uses
MIN_REQUEST_MS = 20.0  # a request this long makes its own cost (about 0.1 ms) negligible
NOISY_PCT = 25.0  # requests whose middle half spans more than this % of their median: another program at work
GPU_SWEEP = dict(seqs=(256, 512, 1024, 2048, 4096, 8192), tokens=16384, heads=32, head_dims=(64,))
CPU_SWEEP = dict(seqs=(64, 128, 256, 512), tokens=512, heads=4, head_dims=(64,))


@dataclass(frozen=True)
class Implementation:
    label: str
    task: int | None  # the task whose worker runs it; None: PyTorch's, run here
    file: str = ""  # the student's file that holds it
    gpu_only: bool = False
    dtype: torch.dtype = torch.float32


IMPLEMENTATIONS = (
    Implementation("task 1: naive (PyTorch)", 1, "task1/attention.py"),
    Implementation("task 2: separate kernels", 2, "task2/kernels/attention.cu", gpu_only=True),
    Implementation("task 3: FlashAttention-2 (PyTorch)", 3, "task3/attention.py"),
    Implementation("task 4: fused kernel", 4, "task4/kernels/attention.cu", gpu_only=True),
    Implementation("task 4: fused kernel, bf16", 4, "task4/kernels/attention_half.cu", gpu_only=True,
                   dtype=torch.bfloat16),
    Implementation("PyTorch naive", None),
    Implementation("SDPA", None),
    Implementation("SDPA, bf16", None, gpu_only=True, dtype=torch.bfloat16),  # the yardstick of the bf16 kernel
)


@dataclass
class Shape:
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool

    def __str__(self):
        return (f"batch {self.batch} heads {self.heads} seq {self.seq} head_dim {self.head_dim}"
                f"{' causal' if self.causal else ''}")


# -- the calls: each implementation's one call and its timed request -------------------------------------------

def one_call(impl: Implementation, worker, q, k, v, causal):
    """The output of one call (a CPU or GPU tensor) and the memory it added on the GPU (bytes, or None)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    on_gpu = q.is_cuda
    if impl.task is None:
        return measured_here(lambda: pytorch(impl, q, k, v, causal), on_gpu)
    if impl.task in (1, 3):  # they return their output: its own bytes are not extra
        args = ("attention", q, k, v, causal) if impl.task == 1 else ("flash", q, k, v, causal, *TASK3_TILES, False)
        if not on_gpu:
            return worker.call(*args), None
        out, peak = worker.call_measuring_memory(*args)
        return out, None if peak is None else max(0, peak - q.numel() * q.element_size())
    out = torch.full_like(q, math.nan)  # poisoned: an element never written shows as an error
    name = "forward" if impl.dtype == torch.float32 else "forward_half"
    if impl.task == 2:
        name = "attention_forward"
    _, peak = worker.call_measuring_memory(name, q, k, v, out, causal, scale)
    return out, peak


def pytorch(impl: Implementation, q, k, v, causal):
    if impl.label.startswith("SDPA"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return naive_attention(q, k, v, causal)


def measured_here(fn, on_gpu):
    if not on_gpu:
        return fn(), None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    return out, max(0, torch.cuda.max_memory_allocated() - before - out.numel() * out.element_size())


def request(impl: Implementation, worker, q, k, v, causal, count):
    """A function that runs `count` calls and returns once they are done: the clock times it."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    sync = torch.cuda.synchronize if q.is_cuda else (lambda: None)
    if impl.task is None:
        def here():
            for _ in range(count):
                pytorch(impl, q, k, v, causal)
            sync()
        return here
    if impl.task in (1, 3):  # handed over once, not with every request
        kept = [worker.keep(f"compare {name}", t) for name, t in zip("qkv", (q, k, v))]
        which = ("flash",) if impl.task == 3 else ()  # task 3's repeat runs flash_attention with its default tiles
        return lambda: worker.call("repeat", count, *which, *kept, causal)
    outs = [torch.empty_like(q) for _ in range(min(count, 3))]  # a few, so a large shape still fits
    kept = worker.keep("compare sets", [(q, k, v, outs[i % len(outs)]) for i in range(count)])
    name = "run_batch_half" if impl.dtype != torch.float32 else "run_batch"
    return lambda: worker.call(name, kept, causal, scale)


# -- one shape ------------------------------------------------------------------------------------------------

def errors(out, q, k, v, causal) -> dict:
    """Max and mean absolute error, MSE and max relative error on CHECKED_HEADS heads against float64, and the
    elements of the whole output that are NaN or Inf (one never written keeps the NaN it started as)."""
    if not isinstance(out, torch.Tensor) or out.shape != q.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        raise ValueError(f"returned {type(out).__name__} of shape {shape}, expected {tuple(q.shape)}")
    non_finite = int((~torch.isfinite(out)).sum())
    if non_finite:  # no error figure can say it
        return {"max_abs_err": math.inf, "mean_abs_err": math.inf, "mse": math.inf, "max_rel_err": math.inf,
                "non_finite": non_finite}
    diffs, expected_all = [], []
    for b, h in heads_checked(q):
        expected = attention_float64(q[b, h].double(), k[b, h].double(), v[b, h].double(), causal)[0]
        diffs.append((out[b, h].double().cpu() - expected.cpu()).flatten())
        expected_all.append(expected.cpu().flatten())
    diff, expected = torch.cat(diffs), torch.cat(expected_all)
    scale = expected.abs().max().clamp_min(1e-30)
    return {"max_abs_err": diff.abs().max().item(), "mean_abs_err": diff.abs().mean().item(),
            "mse": diff.square().mean().item(),
            # relative to each element where it is not near zero, else to the output's scale
            "max_rel_err": (diff.abs() / expected.abs().clamp_min(1e-3 * scale.item())).max().item(),
            "non_finite": 0}


def heads_checked(q):
    batch, heads = q.shape[:2]
    picks = [(0, 0), (batch - 1, heads - 1)]
    return list(dict.fromkeys(picks))[:CHECKED_HEADS]


def inputs(shape: Shape, dtype, device, seed):
    generator = torch.Generator().manual_seed(seed)
    size = (shape.batch, shape.heads, shape.seq, shape.head_dim)
    return tuple(torch.randn(size, generator=generator).to(device=device, dtype=dtype) for _ in range(3))


def measure(impl: Implementation, worker, shape: Shape, device, reps: int, seed: int) -> dict:
    """One row of the CSV: the implementation on one shape."""
    q, k, v = inputs(shape, impl.dtype, device, seed)
    row = {"implementation": impl.label, "batch": shape.batch, "heads": shape.heads, "seq": shape.seq,
           "head_dim": shape.head_dim, "causal": shape.causal, "dtype": str(impl.dtype).replace("torch.", ""),
           "device": device}
    try:
        with torch.no_grad(), exact_float32():
            out, peak = one_call(impl, worker, q, k, v, shape.causal)
            row |= errors(out, q, k, v, shape.causal)
            row["peak_extra_mib"] = None if peak is None else peak / 2**20
            del out
            once = request(impl, worker, q, k, v, shape.causal, 1)
            once()  # warm-up
            start = time.perf_counter()
            once()  # how long a call takes, to size the timed requests
            once_ms = (time.perf_counter() - start) * 1e3
            count = max(1, min(64, int(MIN_REQUEST_MS / max(once_ms, 1e-3))))
            timed = request(impl, worker, q, k, v, shape.causal, count)
            timing = bench.host_clock(timed, reps=reps, per_request=count, device=q.device.type)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return row | {"problem": "out of memory"}
    except (WorkerError, ValueError) as err:  # the call raised, or returned something else than an output
        return row | {"problem": first_line(err)}
    except WorkerDied as err:  # a crash or a hang on this shape: the next shape starts the worker again
        return row | {"problem": f"the worker ended: {first_line(err)}"}
    finally:
        if worker is not None:
            for name in ("compare sets", "compare q", "compare k", "compare v"):
                worker.drop(name)
    if row["non_finite"]:  # timed all the same: a kernel that skips work is fast, and the table says why
        row["problem"] = f"{row['non_finite']} of {q.numel()} output elements are NaN or Inf"
    ms = timing.median_ms
    row["time_spread_pct"] = 100 * (timing.p75_ms - timing.p25_ms) / ms if ms > 0 else 0.0
    flops = attention_flops(shape.batch, shape.heads, shape.seq, shape.seq, shape.head_dim, shape.causal)
    moved = 4 * q.numel() * q.element_size()
    return {"problem": ""} | row | {"time_ms": ms, "tflops": flops / (ms * 1e-3) / 1e12,
                                    "gbs": moved / (ms * 1e-3) / 1e9}


def first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


# -- the command ----------------------------------------------------------------------------------------------

def written(impl: Implementation, worker, device, student_dir: Path, solution: bool) -> str | None:
    """Why the implementation is left out (its skeleton, or a call that fails on a small shape), or None."""
    shape = Shape(1, 2, 33, 32, False)
    q, k, v = inputs(shape, impl.dtype, device, 0)
    # the first step the file still marks TODO, as the task's test names it (the call may stop at a later one)
    todos = [] if solution else remaining_todos(student_dir / impl.file)
    step = f"see README, Task {impl.task}, {todos[0]}" if todos else ""
    try:
        out, _ = one_call(impl, worker, q, k, v, False)
    except WorkerError as err:
        first = err.message.splitlines()[0][:300] if err.message else ""
        if err.kind == "NotImplementedError" or "not implemented yet" in first:
            return f"not written yet ({step or first})"
        return f"{err.kind}: {first}"  # it does not run on a small shape: no sweep would say more
    if isinstance(out, torch.Tensor) and out.isnan().all():  # a kernel's skeleton returns, writing nothing
        return f"not written yet (its output stays as it started, every element NaN{f': {step}' if step else ''})"
    return None


def sweep_shapes(args, device) -> list[Shape]:
    sweep = GPU_SWEEP if device == "cuda" else CPU_SWEEP
    seqs = args.seqs or sweep["seqs"]
    head_dims = args.head_dims or sweep["head_dims"]
    heads, tokens = args.heads or sweep["heads"], args.tokens or sweep["tokens"]
    return [Shape(max(1, tokens // seq), heads, seq, d, causal) for d in head_dims for seq in seqs
            for causal in (False, True)]


def ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, like 256,1024; got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers of at least 1; got {text!r}")
    return values


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m harness.compare", description=__doc__.split("\n\n")[0],
                                epilog="Task 5's decode has a comparison of its own: python -m task5.compare.")
    add_solution_flag(p, 1, "compare the reference solution's implementations",
                      "python -m harness.compare compares your own")
    p.add_argument("--student-dir", type=Path, default=REPO, metavar="DIR", help="whose files (default: this checkout)")
    p.add_argument("--seqs", type=ints, metavar="N,N,...",
                   help=f"sequence lengths (default {','.join(map(str, GPU_SWEEP['seqs']))} on a GPU, "
                        f"{','.join(map(str, CPU_SWEEP['seqs']))} on a CPU)")
    p.add_argument("--head-dims", type=ints, metavar="D,D,...", help="head sizes (default 64)")
    p.add_argument("--heads", type=int, help="heads (default 32 on a GPU, 4 on a CPU)")
    p.add_argument("--tokens", type=int, help="batch x seq at every length (default 16384 on a GPU, 512 on a CPU)")
    p.add_argument("--tasks", type=ints, metavar="N,N,...",
                   help="only these tasks' implementations, beside PyTorch's (default: every one written)")
    p.add_argument("--reps", type=int, default=5, help="timed requests per measurement (default 5)")
    p.add_argument("--csv", type=Path, default=Path("compare.csv"),
                   help="where to write the table (the plot goes beside it: the same name, .png)")
    p.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)  # the workers' folders (default build/)
    args = p.parse_args(argv)
    for name in ("heads", "tokens", "reps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.tasks and not set(args.tasks) <= {i.task for i in IMPLEMENTATIONS}:
        p.error(f"--tasks: implementations are in tasks 1, 2, 3 and 4; got {','.join(map(str, args.tasks))}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = sweep_shapes(args, device)
    print(f"comparing on {torch.cuda.get_device_name() if device == 'cuda' else 'the CPU'}: {len(shapes)} shapes "
          f"({'your code' if not args.solution else 'the reference solution'}; each task's code in its worker)")
    rows, left_out = [], []
    for impl in IMPLEMENTATIONS:
        if args.tasks and impl.task is not None and impl.task not in args.tasks:
            continue
        if impl.gpu_only and device != "cuda":
            left_out.append(f"{impl.label}: needs a CUDA GPU")
            continue
        if impl.dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] < 8:
            left_out.append(f"{impl.label}: needs compute capability 8.0 or newer")
            continue
        worker = None
        try:
            if impl.task is not None:
                worker = sandbox.Worker(impl.task, args.student_dir, solution=args.solution, scratch=args.scratch,
                                        cuda=device == "cuda", purpose="compare", watch_operators=False)
                worker.start()
                why = written(impl, worker, device, args.student_dir, args.solution)
                if why:
                    left_out.append(f"{impl.label}: {why}")
                    continue
            for i, shape in enumerate(shapes):
                row = measure(impl, worker, shape, device, args.reps, seed=i)
                rows.append(row)
                timed = f"{row['time_ms']:.3f} ms, {row['tflops']:.3g} TFLOP/s" if "time_ms" in row else ""
                said = "; ".join(x for x in (timed, row["problem"]) if x) or ""
                if not row["problem"]:
                    said += f", max abs err {row['max_abs_err']:.1e}"
                if noisy(row):
                    said += f" (noisy: the requests' middle half spans {row['time_spread_pct']:.0f}% of the median)"
                print(f"  {impl.label:36s} {shape}: {said}", flush=True)
        except (WorkerError, WorkerDied) as err:
            left_out.append(f"{impl.label}: {first_line(err)}")
        finally:
            if worker is not None:
                worker.stop()
    for line in left_out:
        print(f"  left out: {line}")
    if not rows:
        print("nothing to compare")
        return 1
    if any(noisy(row) for row in rows):
        print(f"  {sum(map(noisy, rows))} of {len(rows)} timings are noisy (marked above and in the CSV's "
              "time_spread_pct): another program was using the machine, so their comparisons are unreliable. "
              "Run again when it is quiet, or with more --reps.")
    write_csv(rows, args.csv)
    plot(rows, args.csv.with_suffix(".png"))
    return 0


def noisy(row) -> bool:
    return row.get("time_spread_pct", 0.0) > NOISY_PCT


COLUMNS = ("implementation", "batch", "heads", "seq", "head_dim", "causal", "dtype", "device", "time_ms",
           "time_spread_pct", "tflops",
           "gbs", "peak_extra_mib", "max_abs_err", "mean_abs_err", "mse", "max_rel_err", "non_finite", "problem")


def write_csv(rows, path: Path, columns=COLUMNS):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


def plot(rows, png: Path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot, only the CSV (pip install matplotlib for one)")
        return
    panels = (("time_ms", "time (ms)", "log"), ("tflops", "TFLOP/s (causal: the products of the unmasked half)", "linear"),
              ("peak_extra_mib", "extra GPU memory at peak (MiB)", "symlog"), ("max_abs_err", "max abs error", "log"))
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(2, 2, figsize=(14, 8))
    labels = list(dict.fromkeys(r["implementation"] for r in rows))
    # an implementation keeps its colour from run to run, whichever others ran; PyTorch's are drawn thinner and on
    # top, so a student's curve that matches one exactly still shows beneath it
    colour = {impl.label: f"C{i}" for i, impl in enumerate(IMPLEMENTATIONS)}
    ours = {impl.label for impl in IMPLEMENTATIONS if impl.task is not None}
    head_dims = sorted({r["head_dim"] for r in rows})
    # colour: the implementation; line: causal or not; marker: head_dim
    markers = {d: "osD^vpP*hX"[i % 10] for i, d in enumerate(head_dims)}
    for ax, (key, title, yscale) in zip(axes.flat, panels):
        for label in labels:
            for causal, style in ((False, "-"), (True, "--")):
                for d in head_dims:
                    got = [r for r in rows if r["implementation"] == label and r["causal"] == causal
                           and r["head_dim"] == d and r.get(key) is not None and not r["problem"]
                           and math.isfinite(r[key])]
                    if got:
                        ax.plot([r["seq"] for r in got],
                                [max(r[key], 1e-12) if yscale == "log" else r[key] for r in got],
                                style, color=colour.get(label, "black"), marker=markers[d],
                                markersize=6 if label in ours else 3, linewidth=2.5 if label in ours else 1,
                                zorder=2 if label in ours else 3)
        ax.set_xscale("log", base=2)
        if key == "peak_extra_mib" and rows[0]["device"] != "cuda":
            ax.text(0.5, 0.5, "measured on a GPU only", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlim(min(r["seq"] for r in rows) / 1.2, max(r["seq"] for r in rows) * 1.2)  # as the others
        if yscale == "symlog":  # memory: 0 MiB (a kernel that allocates nothing) is a value to show, not a gap
            ax.set_yscale("symlog", linthresh=1)
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale(yscale)
        ax.set_xlabel("sequence length (batch x seq fixed)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    # one legend beside the panels (inside one it hid the curves): an entry per implementation, then the line
    # styles and markers
    handles = [Line2D([], [], color=colour.get(label, "black"), linewidth=2.5 if label in ours else 1, label=label)
               for label in labels]
    handles += [Line2D([], [], color="black", linestyle="-", label="full"),
                Line2D([], [], color="black", linestyle="--", label="causal")]
    if len(head_dims) > 1:
        handles += [Line2D([], [], color="black", linestyle="", marker=markers[d], label=f"head_dim {d}")
                    for d in head_dims]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.78, 0.5), fontsize=8, frameon=False)
    device = rows[0]["device"]
    fig.suptitle(f"every attention of the course ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU'})")
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"wrote {png}")


if __name__ == "__main__":
    raise SystemExit(main())
