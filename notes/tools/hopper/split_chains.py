"""Experiment (issue 57, head_dim 64 at 1.24-1.39x SDPA's flash backend, 1.5x asked): the softmax's row maximum and
row sum in CHAINS independent accumulators instead of one.

online_softmax folds a row's N / 4 values of a lane (48 at head_dim 64's 192-key tiles) into one running maximum and
one running sum: a chain of 24 dependent FMNMX and 48 dependent FADDs a row half, each waiting for the one before
(about 4 cycles apiece). The compiler may not reorder float additions, so the chain stays as written. While one
consumer runs its softmax the other's products hold the tensor cores (step 22), so those latencies are exposed rather
than hidden behind other warps. With CHAINS accumulators (values n, n + CHAINS, ... in each), the chains are CHAINS
times shorter, folded at the end. The sum's order changes (a different float32 rounding, well inside the allowance).

Here (no GPU): python notes/tools/hopper/split_chains.py --compile  (patches a copy in /tmp, nvcc, spills)
On the device: PYTHONPATH=. python notes/tools/hopper/split_chains.py 64 CAUSAL [--shape B,H,S]  (patches this
copy's reference once, then task4.tune at that head_dim with CHAINS 4 and 1 side by side, every timed output
checked)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from patch_experiment import run  # noqa: E402  (notes/tools)

REFERENCE = Path("task4/solution/kernels/attention_hopper.cu")
SWAPS = [  # (old, new, count): patch_experiment.patched
    ("constexpr int MAX_HEAD_DIM = 128;\n",
     "constexpr int MAX_HEAD_DIM = 128;\n"
     "constexpr int CHAINS = 4;  // the experiment: independent accumulators of a row's maximum and sum\n", 1),
    ("    float row_max = m[h];\n"
     "#pragma unroll\n"
     "    for (int n = 0; n < N / 8; ++n) row_max = fmaxf(row_max, fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));\n",
     "    float maxes[CHAINS];\n"
     "#pragma unroll\n"
     "    for (int c = 0; c < CHAINS; ++c) maxes[c] = m[h];\n"
     "#pragma unroll\n"
     "    for (int n = 0; n < N / 8; ++n)\n"
     "      maxes[n % CHAINS] = fmaxf(maxes[n % CHAINS], fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));\n"
     "    float row_max = maxes[0];\n"
     "#pragma unroll\n"
     "    for (int c = 1; c < CHAINS; ++c) row_max = fmaxf(row_max, maxes[c]);\n", 1),
    ("    float sum = 0.0f;\n"
     "#pragma unroll\n"
     "    for (int n = 0; n < N / 8; ++n) {\n"
     "      s[4 * n + 2 * h] = fast_exp2(s[4 * n + 2 * h] - shift);\n"
     "      s[4 * n + 2 * h + 1] = fast_exp2(s[4 * n + 2 * h + 1] - shift);\n"
     "      sum += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];\n"
     "    }\n",
     "    float sums[CHAINS];\n"
     "#pragma unroll\n"
     "    for (int c = 0; c < CHAINS; ++c) sums[c] = 0.0f;\n"
     "#pragma unroll\n"
     "    for (int n = 0; n < N / 8; ++n) {\n"
     "      s[4 * n + 2 * h] = fast_exp2(s[4 * n + 2 * h] - shift);\n"
     "      s[4 * n + 2 * h + 1] = fast_exp2(s[4 * n + 2 * h + 1] - shift);\n"
     "      sums[n % CHAINS] += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];\n"
     "    }\n"
     "    float sum = sums[0];\n"
     "#pragma unroll\n"
     "    for (int c = 1; c < CHAINS; ++c) sum += sums[c];\n", 1),
]

tune_at = Path(__file__).with_name("tune_at.py")  # HEAD_DIM CAUSAL [--shape ...], against CHAINS=1
sys.exit(run(REFERENCE, SWAPS, "CHAINS", "CHAINS", (4, 1), "90a",
             lambda: [sys.executable, str(tune_at), *sys.argv[1:], "CHAINS=1"]))
