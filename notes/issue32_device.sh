#!/bin/bash
# Issue 32's next device calls (run from the repository root on the GPU machine, bubblewrap's .deb unpacked
# first; logs under $OUT). Part A: task 5's bf16/fp16 cache and task 4's speed variants; part B: known-bad;
# part C: the grader. Each part fits one 10-minute call on an H100.
L=/tmp/logs; mkdir -p $L
case "$1" in
A)
  CFG="SKIP_SETTLED_RESCALE=1 SKIP_SETTLED_RESCALE=1,BLOCK_COLS_LARGE_D=64 BLOCK_COLS_LARGE_D=64"
  for i in 0 1 2 3; do timeout 240 python notes/half_probe.py --build $i --configs $CFG > $L/build$i.log 2>&1 & done
  ( timeout 200 python notes/decode_half_probe.py --time ) > $OUT/decode_half_probe.log 2>&1
  wait
  ( timeout 150 python notes/half_probe.py --time --configs $CFG ) > $OUT/half_probe.log 2>&1
  ( time timeout 330 python -m task5.test --solution --hidden grader/hidden.py ) > $OUT/t5sol.log 2>&1
  tail -n 4 $OUT/*.log; grep -h "^|" $OUT/half_probe.log ;;
B)
  T=tests/test_cuda_submissions.py
  ( timeout 200 python -m task5.test --half ) > $L/t5skel.log 2>&1 &
  for id in v_read_as_k rows_past_the_end_scored update_one_row_late; do
    timeout 400 python -m pytest -q -p no:cacheprovider -k "task5_half and $id" $T > "$L/kb5_$id.log" 2>&1 &
  done
  for id in diagonal_masked acc_not_rescaled tail_masked scores_not_scaled; do
    timeout 500 python -m pytest -q -p no:cacheprovider -k "task4_$id" $T > "$L/kb4_$id.log" 2>&1 &
  done
  wait
  for f in $L/*.log; do echo "== $f"; tail -n 4 "$f"; done > $OUT/partB.log; cat $OUT/partB.log ;;
D)
  ( time timeout 590 python -m task7.test --solution ) > $OUT/t7sol.log 2>&1
  tail -n 20 $OUT/t7sol.log ;;
K)  # every known-bad submission of tests/test_cuda_submissions.py, in ${2:-8} shards at once
  T=tests/test_cuda_submissions.py
  if [ -n "$3" ]; then cp "$3" $L/ids; else  # a file of test ids: those only
    python -m pytest --collect-only -q -p no:cacheprovider $T | grep "::" > $L/ids; fi
  split -n r/${2:-8} $L/ids $L/shard.
  for s in $L/shard.*; do
    timeout 570 python -m pytest -q -p no:cacheprovider -rA $(cat $s) > $s.log 2>&1 &
  done
  wait
  for s in $L/shard.*.log; do echo "== $s"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|Timeout|Error" $s | tail -n 12; done > $OUT/known_bad.log
  cat $L/shard.*.log > $OUT/known_bad_full.log; cat $OUT/known_bad.log ;;
C)
  ( time timeout 590 python -m grader --solution --out $OUT/graded --keep --tasks "${2:-1,2,3,4,5,6,7}" ) > $OUT/grader.log 2>&1
  tail -n 30 $OUT/grader.log ;;
esac
