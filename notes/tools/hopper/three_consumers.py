"""Patches d90da69's reference (before the 192-key tiles of 2026-12-04): check that commit's file out first.

Experiment (issue 57, head_dim 64 at 0.83x cuDNN): three consumer warpgroups, 192 query rows a block, as
FlashAttention-3 sizes its head_dim-64 tiles (192 query rows; its tile_size_fwd_sm90). Each K/V tile then serves
1.5x the rows, and the softmax of three consumers hides behind the others' products. The cost: 512 threads, so the
consumers get 160 registers (S, P and O of 64 x 128, 64 x 128 and 64 x 64 are 128 of them), and no ping-pong
(step 22 turns two consumers). Q is loaded as two 128-row boxes (the binding's map), 256 rows of which 192 are used.
Only head_dim <= 64 is built (three consumers and Q's two boxes do not fit beside three stages at head_dim 128).

Here (no GPU): python notes/tools/hopper/three_consumers.py --compile  (patches a copy in /tmp, nvcc, spills)
On the device: PYTHONPATH=. python notes/tools/hopper/three_consumers.py 64 CAUSAL  (patches this copy's reference
once, then task4.tune at head_dim 64 with CONSUMERS 3 and 2 side by side, every timed output checked)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from patch_experiment import run  # noqa: E402  (notes/tools)

REFERENCE = Path("task4/solution/kernels/attention_hopper.cu")
SWAPS = [
    ("constexpr int BLOCK_ROWS = HOPPER_BOX_ROWS;  // query rows per block: 64 per consumer warpgroup\n",
     "constexpr int CONSUMERS = 3;\nconstexpr int BLOCK_ROWS = 64 * CONSUMERS;\n"
     "constexpr int Q_BOXES = (BLOCK_ROWS + HOPPER_BOX_ROWS - 1) / HOPPER_BOX_ROWS;\n"),
    ("constexpr int THREADS = 3 * WARPGROUP;       // the producer and two consumers\n",
     "constexpr int THREADS = (1 + CONSUMERS) * WARPGROUP;\n"),
    ("constexpr int CONSUMER_REGISTERS = 240;", "constexpr int CONSUMER_REGISTERS = CONSUMERS == 3 ? 160 : 240;"),
    ("constexpr int PINGPONG = 1;", "constexpr int PINGPONG = CONSUMERS == 2;"),
    ("static constexpr int Q = 0, K = TILE,", "static constexpr int Q = 0, K = Q_BOXES * TILE,"),
    ("mbarrier_init_all(empty, STAGES, 2 * WARPGROUP);", "mbarrier_init_all(empty, STAGES, CONSUMERS * WARPGROUP);"),
    ("    mbarrier_expect_bytes(q_full, L::TILE);\n    for (int panel = 0; panel < PANELS; ++panel)\n"
     "      tma_load_box(q_tile + panel * PANEL_BYTES, &hp.q_map, panel * HOPPER_BOX_COLS, skip + q_start, bh, "
     "q_full);\n",
     "    mbarrier_expect_bytes(q_full, Q_BOXES * L::TILE);\n    for (int box = 0; box < Q_BOXES; ++box)\n"
     "      for (int panel = 0; panel < PANELS; ++panel)\n"
     "        tma_load_box(q_tile + (box * PANELS + panel) * PANEL_BYTES, &hp.q_map, panel * HOPPER_BOX_COLS,\n"
     "                     skip + q_start + box * HOPPER_BOX_ROWS, bh, q_full);\n"),
    ("  if (hp.p.head_dim <= HOPPER_BOX_COLS)\n    return hp.p.causal ? launch<T, 1, true>(hp, stream) : "
     "launch<T, 1, false>(hp, stream);\n  return hp.p.causal ? launch<T, 2, true>(hp, stream) : "
     "launch<T, 2, false>(hp, stream);\n",
     "  if (hp.p.head_dim <= HOPPER_BOX_COLS)\n    return hp.p.causal ? launch<T, 1, true>(hp, stream) : "
     "launch<T, 1, false>(hp, stream);\n  return cudaErrorInvalidValue;  // the experiment: head_dim 64 alone\n"),
]


tune_at = Path(__file__).with_name("tune_at.py")  # HEAD_DIM CAUSAL [its options], against CONSUMERS=2
sys.exit(run(REFERENCE, SWAPS, "CONSUMERS", "CONSUMERS", (3, 2), "90a",
             lambda: [sys.executable, str(tune_at), *sys.argv[1:3], "CONSUMERS=2", *sys.argv[3:]]))
