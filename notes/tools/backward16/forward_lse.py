"""Step 23 of notes/backward16-plan.md as a patch (issue 58): the reference's 16-bit forward
(task4/solution/kernels/attention_half.cu) also writes each row's log-sum-exp L = (m + log2 l) ln 2 when
p.lse is given, as steps 12's float32 forward does; written to a copy that bwd16.py builds beside bwd16.cu
(the kit's file is not touched)."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from patch_experiment import ROOT, patched  # noqa: E402  (notes/tools)

REFERENCE = ROOT / "task4/solution/kernels/attention_half.cu"
SWAPS = [
    ("                                T* __restrict__ out, int heads, int kv_heads, const int* __restrict__ key_start,",
     "                                T* __restrict__ out, float* __restrict__ lse, int heads, int kv_heads,\n"
     "                                const int* __restrict__ key_start,"),
    ("  out += (size_t)blockIdx.x * seq_q * head_dim;\n",
     "  out += (size_t)blockIdx.x * seq_q * head_dim;\n  if (lse != nullptr) lse += (size_t)blockIdx.x * seq_q;\n"),
    ("    out += (size_t)skip * head_dim;\n",
     "    out += (size_t)skip * head_dim;\n    if (lse != nullptr) lse += skip;\n"),
    ("      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row that saw no key: zeros\n",
     "      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row that saw no key: zeros\n"
     "      // L in natural-log units: row_max is in scaled log2 units (the 4 lanes of the row hold the same)\n"
     "      if (lse != nullptr && lane % 4 == 0)\n"
     "        lse[row] = sum > 0.0f ? (row_max[mt][r] + log2f(sum)) * LN2 : -INFINITY;\n"),
    ("static_cast<T*>(p.out), p.heads, p.kv_heads,", "static_cast<T*>(p.out), p.lse, p.heads, p.kv_heads,"),
    ("(p.causal && p.seq_q > p.seq_k) || p.lse != nullptr ||", "(p.causal && p.seq_q > p.seq_k) ||"),
]


def write(dest: Path) -> Path:
    """The patched copy at dest (its includes are device/..., found through common/csrc)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(patched(REFERENCE.read_text(), SWAPS))
    return dest


if __name__ == "__main__":
    print(write(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/backward16/attention_half_lse.cu")))
