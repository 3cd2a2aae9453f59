"""Experiment (device only; patches the reference file of this copy, so run it on the GPU machine's copy alone):
FlashAttention-3's ping-pong on top of step 21. The two consumer warpgroups take turns issuing their products, with
two named barriers (ids 1 and 2, 256 threads: both consumers), so that one's softmax runs while the other's products
are on the tensor cores. A turn is the prologue's S, each loop iteration's S and P V, and the last P V; a consumer
syncs on its own barrier before its turn and arrives on the other's after issuing (consumer 1 once ahead, so
consumer 0 goes first, and not after its last turn, so that no arrival is left over). Then task4.tune at HEAD_DIM,
CAUSAL with PINGPONG 0 and 1: PYTHONPATH=. python notes/tools/hopper/pingpong_ab.py HEAD_DIM CAUSAL [--build-only]."""
import subprocess
import sys
from pathlib import Path

path = Path("task4/solution/kernels/attention_hopper.cu")
s = path.read_text()
swaps = [
    ("constexpr int MAX_HEAD_DIM = 128;",
     "constexpr int PINGPONG = 0;\nconstexpr int MAX_HEAD_DIM = 128;"),
    ("    mbarrier_wait(q_full, 0);\n    mbarrier_wait(&k_full[0], 0);\n    issue_scores<T, D>(s, q_rows, k_tiles);\n",
     "    const auto turn_begin = [&]() {\n"
     "      if (PINGPONG) asm volatile(\"bar.sync %0, 256;\" ::\"r\"(1 + consumer) : \"memory\");\n"
     "    };\n"
     "    const auto turn_end = [&](bool last) {\n"
     "      if (PINGPONG && !(last && consumer == 1)) asm volatile(\"bar.arrive %0, 256;\" ::\"r\"(2 - consumer) : \"memory\");\n"
     "    };\n"
     "    if (PINGPONG && consumer == 1) asm volatile(\"bar.arrive 1, 256;\" ::: \"memory\");\n"
     "    mbarrier_wait(q_full, 0);\n    mbarrier_wait(&k_full[0], 0);\n"
     "    turn_begin();\n    issue_scores<T, D>(s, q_rows, k_tiles);\n    turn_end(false);\n"),
    ("      mbarrier_wait(&k_full[stage], (j / STAGES) % 2);\n      issue_scores<T, D>(s, q_rows, k_tiles + stage * L::TILE);\n"
     "      mbarrier_wait(&v_full[before], ((j - 1) / STAGES) % 2);\n      issue_pv<T, D>(o, pa, v_tiles + before * L::TILE);\n",
     "      mbarrier_wait(&k_full[stage], (j / STAGES) % 2);\n      mbarrier_wait(&v_full[before], ((j - 1) / STAGES) % 2);\n"
     "      turn_begin();\n      issue_scores<T, D>(s, q_rows, k_tiles + stage * L::TILE);\n"
     "      issue_pv<T, D>(o, pa, v_tiles + before * L::TILE);\n      turn_end(false);\n"),
    ("    mbarrier_wait(&v_full[last], ((tiles - 1) / STAGES) % 2);\n    issue_pv<T, D>(o, pa, v_tiles + last * L::TILE);\n",
     "    mbarrier_wait(&v_full[last], ((tiles - 1) / STAGES) % 2);\n"
     "    turn_begin();\n    issue_pv<T, D>(o, pa, v_tiles + last * L::TILE);\n    turn_end(true);\n"),
]
if "PINGPONG" not in s:  # patched once per copy: a second run times the same patch again
    for old, new in swaps:
        assert old in s, old
        s = s.replace(old, new, 1)
    path.write_text(s)
head_dim, causal, *rest = sys.argv[1:]
tune_at = Path(__file__).with_name("tune_at.py")
sys.exit(subprocess.call([sys.executable, str(tune_at), head_dim, causal, "PINGPONG=1", *rest]))
