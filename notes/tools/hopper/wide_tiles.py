"""In the kernel since 2026-12-04 (64-row K/V boxes): this patch applies to d90da69's reference only.

Experiment (issue 57, head_dim 64 at 0.83x cuDNN): K/V tiles of 192 keys, FlashAttention-3's width at head_dim 64
(its tile_size_fwd_sm90, read, not copied), against the reference's 128. Per tile, the products grow by half and the
fixed costs (barrier waits, the row maxima's shuffles, the rescale of O) stay. S becomes 64 x 192 a consumer (96
registers a thread: with P's 48 and O's 32, 176 of the 240), issued as an m64n128 and an m64n64 wgmma per k16 step.
The binding's maps keep their 128-row box: a 192-key tile is two boxes (rows key and key + 128), so each tile lands
256 rows, the last 64 unused (read again, from L2, as the next tile's first). Only head_dim <= 64 is built.

Here (no GPU): python notes/tools/hopper/wide_tiles.py --compile  (patches a copy in /tmp, nvcc, spills)
On the device: PYTHONPATH=. python notes/tools/hopper/wide_tiles.py 64 CAUSAL  (patches this copy's reference once,
then task4.tune at head_dim 64 with BLOCK_COLS 192 and 128 side by side, every timed output checked)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from patch_experiment import run  # noqa: E402  (notes/tools)

REFERENCE = Path("task4/solution/kernels/attention_hopper.cu")
SWAPS = [  # (old, new, count): patch_experiment.patched
    ("constexpr int BLOCK_COLS = HOPPER_BOX_ROWS;  // keys per K/V tile (S is 64 x 128 per consumer)\n",
     "constexpr int BLOCK_COLS = 192;  // keys per K/V tile: 128 (one box) or 192 (two)\n"
     "constexpr int KV_BOXES = (BLOCK_COLS + HOPPER_BOX_ROWS - 1) / HOPPER_BOX_ROWS;\n"
     "constexpr int SCORES = BLOCK_COLS / 2;    // S's values a thread holds (64 x BLOCK_COLS over 128 threads)\n"
     "constexpr int P_STEPS = BLOCK_COLS / 16;  // k16 steps of O += P V\n", 1),
    ("  static constexpr int Q = 0, K = TILE, V = K + STAGES * TILE, BARRIERS = V + STAGES * TILE;\n",
     "  static constexpr int KV_TILE = KV_BOXES * TILE;\n"
     "  static constexpr int Q = 0, K = TILE, V = K + STAGES * KV_TILE, BARRIERS = V + STAGES * KV_TILE;\n", 1),
    ("float (&s)[64]", "float (&s)[SCORES]", 0),
    ("for (int i = 0; i < 64; ++i)", "for (int i = 0; i < SCORES; ++i)", 0),
    ("for (int n = 0; n < 16; ++n)", "for (int n = 0; n < SCORES / 4; ++n)", 0),
    ("uint32_t (&pa)[8][4]", "uint32_t (&pa)[P_STEPS][4]", 0),
    ("for (int t = 0; t < 8; ++t)", "for (int t = 0; t < P_STEPS; ++t)", 0),
    ("    wgmma_m64n128_ss<T>(s, swizzled_tile(q_rows + at), swizzled_tile(k_tile + at), kk > 0);\n",
     "    wgmma_m64n128_ss<T>(*reinterpret_cast<float(*)[64]>(s), swizzled_tile(q_rows + at), swizzled_tile(k_tile + at),\n"
     "                        kk > 0);\n"
     "    if constexpr (BLOCK_COLS == 192)  // keys 128 .. 191: rows 128 .. of the tile\n"
     "      wgmma_m64n64_ss<T>(*reinterpret_cast<float(*)[32]>(s + 64), swizzled_tile(q_rows + at),\n"
     "                         swizzled_tile(k_tile + 128 * 128 + at), kk > 0);\n", 1),
    ("// Step 18: S = Q K^T of one K tile",
     "// d (64 x 64) = (accumulate ? d : 0) + A B^T, as wgmma_m64n128_ss\n"
     "template <typename T>\n"
     "__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {\n"
     "  if constexpr (std::is_same_v<T, __nv_bfloat16>)\n"
     "    KIT_WGMMA_SS(64, \"bf16\", KIT_NAMES32, \"32\", \"33\", \"34\", KIT_ACC32);\n"
     "  else\n"
     "    KIT_WGMMA_SS(64, \"f16\", KIT_NAMES32, \"32\", \"33\", \"34\", KIT_ACC32);\n"
     "}\n\n"
     "// Step 18: S = Q K^T of one K tile", 1),
    ("      mbarrier_expect_bytes(&k_full[stage], L::TILE);\n"
     "      for (int panel = 0; panel < PANELS; ++panel)\n"
     "        tma_load_box(k_tiles + stage * L::TILE + panel * PANEL_BYTES, &hp.k_map, panel * HOPPER_BOX_COLS, key, kv_bh,\n"
     "                     &k_full[stage]);\n"
     "      mbarrier_expect_bytes(&v_full[stage], L::TILE);\n"
     "      for (int panel = 0; panel < PANELS; ++panel)\n"
     "        tma_load_box(v_tiles + stage * L::TILE + panel * PANEL_BYTES, &hp.v_map, panel * HOPPER_BOX_COLS, key, kv_bh,\n"
     "                     &v_full[stage]);\n",
     "      mbarrier_expect_bytes(&k_full[stage], L::KV_TILE);\n"
     "      for (int box = 0; box < KV_BOXES; ++box)  // PANELS is 1 here: a box after the other\n"
     "        tma_load_box(k_tiles + stage * L::KV_TILE + box * L::TILE, &hp.k_map, 0, key + box * HOPPER_BOX_ROWS,\n"
     "                     kv_bh, &k_full[stage]);\n"
     "      mbarrier_expect_bytes(&v_full[stage], L::KV_TILE);\n"
     "      for (int box = 0; box < KV_BOXES; ++box)\n"
     "        tma_load_box(v_tiles + stage * L::KV_TILE + box * L::TILE, &hp.v_map, 0, key + box * HOPPER_BOX_ROWS,\n"
     "                     kv_bh, &v_full[stage]);\n", 1),
    ("stage * L::TILE", "stage * L::KV_TILE", 0),
    ("before * L::TILE", "before * L::KV_TILE", 0),
    ("last * L::TILE", "last * L::KV_TILE", 0),
    ("  float s[64];        // S, 64 x 128, in the accumulator layout\n  uint32_t pa[8][4];",
     "  float s[SCORES];\n  uint32_t pa[P_STEPS][4];", 1),
    ("  return hp.p.causal ? launch<T, 2, true>(hp, stream) : launch<T, 2, false>(hp, stream);\n",
     "  return cudaErrorInvalidValue;  // the experiment: head_dim 64 alone\n", 1),
]


tune_at = Path(__file__).with_name("tune_at.py")  # HEAD_DIM CAUSAL [its options], against BLOCK_COLS=128
sys.exit(run(REFERENCE, SWAPS, "KV_BOXES", "BLOCK_COLS", (192, 128), "90a",
             lambda: [sys.executable, str(tune_at), *sys.argv[1:3], "BLOCK_COLS=128", *sys.argv[3:]]))
