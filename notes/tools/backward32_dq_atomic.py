"""Experiment (issue 58, the float32 backward at 0.61-0.68x SDPA's memory-efficient one): dQ added by the dK/dV
kernel with float32 atomics (FlashAttention-2's way) instead of the dQ kernel, which recomputes S and dP: 5 tile
products a pair of tiles instead of 7. A knob DQ_ATOMIC in the reference's kernels/attention_backward.cu (this copy
patched once), then task4.tune --backward times DQ_ATOMIC 0 and 1 side by side, each checked first.

Here (no GPU): python notes/tools/backward32_dq_atomic.py --compile  (patches a copy in /tmp, nvcc, spills)
On the device: PYTHONPATH=. python notes/tools/backward32_dq_atomic.py"""
import sys
from pathlib import Path

from patch_experiment import run  # notes/tools, this script's folder

REFERENCE = Path("task4/solution/kernels/attention_backward.cu")
SWAPS = [
    ("constexpr int MAX_HEAD_DIM = 128;\n",
     "constexpr int MAX_HEAD_DIM = 128;\n"
     "// 1: the dK/dV kernel also adds each walked tile's scale dS K to dQ (float32 atomics; dq zeroed first) and the\n"
     "// dQ kernel is not launched; 0: the dQ kernel, which recomputes S and dP\n"
     "constexpr int DQ_ATOMIC = 1;\n"
     "static_assert(!DQ_ATOMIC || BLOCK_ROWS == BLOCK_COLS, \"dS^T's keys become dQ's rows\");\n"),
    ("// Writes scale * acc to the thread's rows of dst",
     "// acc[i][c] += sum over keys r < BLOCK_ROWS of pt[r][query ty + i ROW_THREADS] * b[r][columns of vector c]: as\n"
     "// tile_accumulate with p read transposed (pt is dS^T, keys by queries; dQ = dS K).\n"
     "template <int D>\n"
     "__device__ __forceinline__ void tile_accumulate_t(const float* pt, const float* b,\n"
     "                                                  acc_vec<D> (&acc)[THREAD_ROWS][ACC_VECS<D>], int ty, int tx) {\n"
     "  using vec = acc_vec<D>;\n"
     "  constexpr int VEC = sizeof(vec) / sizeof(float);\n"
     "  constexpr int LD = D + PAD, LDP = BLOCK_COLS + P_PAD;\n"
     "#pragma unroll 4\n"
     "  for (int r = 0; r < BLOCK_ROWS; ++r) {\n"
     "    float p_r[THREAD_ROWS];\n"
     "#pragma unroll\n"
     "    for (int i = 0; i < THREAD_ROWS; ++i) p_r[i] = pt[r * LDP + ty + i * ROW_THREADS];\n"
     "#pragma unroll\n"
     "    for (int c = 0; c < ACC_VECS<D>; ++c) {\n"
     "      const vec b_vec = *reinterpret_cast<const vec*>(&b[r * LD + VEC * (tx + c * COL_THREADS)]);\n"
     "#pragma unroll\n"
     "      for (int i = 0; i < THREAD_ROWS; ++i) fma_vec(acc[i][c], p_r[i], b_vec);\n"
     "    }\n"
     "  }\n"
     "}\n\n"
     "// dst[row][col] += scale * acc, atomically, for the thread's rows below n_rows and columns below head_dim.\n"
     "template <int D>\n"
     "__device__ __forceinline__ void add_rows(float* dst, const acc_vec<D> (&acc)[THREAD_ROWS][ACC_VECS<D>],\n"
     "                                         float scale, int row0, int n_rows, int head_dim, int ty, int tx) {\n"
     "  constexpr int VEC = sizeof(acc_vec<D>) / sizeof(float);\n"
     "#pragma unroll\n"
     "  for (int i = 0; i < THREAD_ROWS; ++i) {\n"
     "    const int row = row0 + ty + i * ROW_THREADS;\n"
     "    if (row >= n_rows) continue;\n"
     "#pragma unroll\n"
     "    for (int c = 0; c < ACC_VECS<D>; ++c) {\n"
     "      const int col = VEC * (tx + c * COL_THREADS);\n"
     "      const float* x = reinterpret_cast<const float*>(&acc[i][c]);\n"
     "#pragma unroll\n"
     "      for (int e = 0; e < VEC; ++e)\n"
     "        if (col + e < head_dim) atomicAdd(&dst[(size_t)row * head_dim + col + e], scale * x[e]);\n"
     "    }\n"
     "  }\n"
     "}\n\n"
     "// Writes scale * acc to the thread's rows of dst"),
    ("                                float* __restrict__ dk, float* __restrict__ dv, int heads, int kv_heads, int seq_q,",
     "                                float* __restrict__ dk, float* __restrict__ dv, float* __restrict__ dq, int heads,\n"
     "                                int kv_heads, int seq_q,"),
    # keys past seq_k masked too: their P would be exp(0 - L), which dQ (unlike dK and dV) would add in
    ("      const bool needs_mask = causal && kv_start + BLOCK_ROWS - 1 > q_start + causal_offset;\n",
     "      const bool needs_mask = (DQ_ATOMIC && kv_start + BLOCK_ROWS > seq_k) ||\n"
     "                              (causal && kv_start + BLOCK_ROWS - 1 > q_start + causal_offset);\n"),
    ("          if (needs_mask && key > query + causal_offset) st[i][j] = 0.0f;\n",
     "          if (needs_mask && ((DQ_ATOMIC && key >= seq_k) || (causal && key > query + causal_offset))) st[i][j] = 0.0f;\n"),
    ("      tile_accumulate<D>(ds_tile, q_tile, dk_acc, ty, tx);\n      // END SOLUTION\n",
     "      tile_accumulate<D>(ds_tile, q_tile, dk_acc, ty, tx);\n"
     "      if constexpr (DQ_ATOMIC) {\n"
     "        vec dq_acc[THREAD_ROWS][ACC_VECS<D>];\n"
     "#pragma unroll\n"
     "        for (int i = 0; i < THREAD_ROWS; ++i)\n"
     "#pragma unroll\n"
     "          for (int c = 0; c < ACC_VECS<D>; ++c) dq_acc[i][c] = vec{};\n"
     "        tile_accumulate_t<D>(ds_tile, k_tile, dq_acc, ty, tx);\n"
     "        add_rows<D>(dq + head * seq_q * head_dim, dq_acc, scale, q_start, seq_q, head_dim, ty, tx);\n"
     "      }\n"
     "      // END SOLUTION\n"),
    ("p.delta, p.dk, p.dv, p.heads,\n", "p.delta, p.dk, p.dv, p.dq, p.heads,\n"),
    ("  err = cudaGetLastError();\n  if (err != cudaSuccess) return err;\n  flash_attention_dq_kernel<D, MASKS>",
     "  err = cudaGetLastError();\n  if (err != cudaSuccess || DQ_ATOMIC) return err;\n  flash_attention_dq_kernel<D, MASKS>"),
    ("  const float scale_log2 = p.scale * LOG2E;\n",
     "  const float scale_log2 = p.scale * LOG2E;\n"
     "  if (DQ_ATOMIC) {  // the dK/dV kernel adds to it\n"
     "    err = cudaMemsetAsync(p.dq, 0, sizeof(float) * p.batch * p.heads * p.seq_q * p.head_dim, stream);\n"
     "    if (err != cudaSuccess) return err;\n"
     "  }\n"),
]


sys.exit(run(REFERENCE, SWAPS, "DQ_ATOMIC", "DQ_ATOMIC", (1, 0), "90",
             lambda: [sys.executable, "-m", "task4.tune", "--backward", "--solution", "--configs", "DQ_ATOMIC=0",
                      *sys.argv[1:]]))
