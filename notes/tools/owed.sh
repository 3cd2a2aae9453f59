#!/bin/bash
# The device work the 2026-12-04 stops left owed (notes/hopper-plan.md "Next", notes/backward16-plan.md), as device
# calls from the repository root (bubblewrap's .deb carried in .dev/; logs under $OUT): bash notes/tools/owed.sh MODE.
# backward16: issue 58's experiment, checked and timed, 64- then 32-query tiles (one build serves both).
# sizes: issue 57's other sizes (B1 H32 S16384, B16 H32 S1024), head_dim 64 and 128, causal and not, with SDPA's
#   backends beside (about 70 s each: one call).
# known-bad: the Hopper known-bad variants under the comparison cap of eccbe68 (the tail-unmasked one's time).
# backward32: the float32 backward with dQ by atomics beside the dQ kernel (task4.tune --backward, checked first).
# wide: issue 57's 192-key tiles at head_dim 64 against 128 (measured and adopted: it patches d90da69's file only).
# d128tiles: issue 57's 192-key tiles at head_dim 128 too (two stages: three do not fit beside them) against the
#   file's 128 with three and with two, causal and not (compiled here without spills, 2026-12-04).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
dpkg -x .dev/bubblewrap_*.deb / 2>/dev/null
case "$1" in
backward16)
  ( time timeout 400 python notes/tools/backward16/bwd16.py check time --block-m 64 ) > $OUT/bwd16_64.log 2>&1
  ( time timeout 150 python notes/tools/backward16/bwd16.py check time --block-m 32 ) > $OUT/bwd16_32.log 2>&1
  grep -E "FAIL|checks:|TFLOP|real|rror" $OUT/bwd16_64.log $OUT/bwd16_32.log | tail -40 ;;
sizes)
  for shape in 1,32,16384 16,32,1024; do
    for d in 64 128; do
      for c in 0 1; do
        ( timeout 70 python notes/tools/hopper/tune_at.py $d $c --shape $shape PINGPONG=0 ) \
          > $OUT/size_${shape//,/x}_${d}_$c.log 2>&1
        grep -E "^\*|^ +[0-9] |SDPA" $OUT/size_${shape//,/x}_${d}_$c.log
      done
    done
  done ;;
known-bad)
  KB_FILES=tests/test_cuda_hopper_submissions.py KB_JOBS=8 KB_LIMIT=400 timeout 420 bash notes/tools/checks.sh known-bad
  mkdir -p $OUT/kb && cp /tmp/logs/kb_*.log $OUT/kb/ 2>/dev/null
  grep -h "passed\|failed" $OUT/kb/*.log | tail -12 ;;
d128tiles)
  for causal in 0 1; do
    ( timeout 150 python notes/tools/hopper/tune_at.py 128 $causal BLOCK_COLS_LARGE_D=192,STAGES=2 STAGES=2 ) \
      > $OUT/d128tiles_$causal.log 2>&1
    grep -E "^\*|^ +[0-9] |SDPA|rror" $OUT/d128tiles_$causal.log
  done ;;
wide)
  for causal in 0 1; do
    ( timeout 100 python notes/tools/hopper/wide_tiles.py 64 $causal ) > $OUT/wide_$causal.log 2>&1
    grep -E "^\*|^ +[0-9] |SDPA|rror" $OUT/wide_$causal.log
  done ;;
backward32)
  ( time timeout 500 python notes/tools/backward32_dq_atomic.py ) > $OUT/backward32.log 2>&1
  tail -25 $OUT/backward32.log ;;
esac
