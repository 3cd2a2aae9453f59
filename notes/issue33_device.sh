#!/bin/bash
# Issue 33's device calls (run from the repository root on the GPU machine, bubblewrap's .deb unpacked first; logs
# under $OUT). T: the backward part of the reference (cases, sanitizer, training, timings) and the skeleton's;
# K: the backward known-bad submissions, one process each; U: tune and profile --backward; G: the grader.
L=/tmp/logs; mkdir -p $L
export PYTHONUNBUFFERED=1  # a log cut by a timeout still shows how far it got
case "$1" in
T)
  ( time timeout 400 python -m task4.test --solution --backward --hidden grader/hidden.py ) > $OUT/t4bwd.log 2>&1
  ( timeout 150 python -m task4.test --backward ) > $OUT/t4bwd_skeleton.log 2>&1
  grep -E "FAIL|model trained|pass time|memory-safe|bad input" $OUT/t4bwd.log; tail -n 4 $OUT/t4bwd_skeleton.log ;;
K)
  T=tests/test_cuda_submissions.py
  python -m pytest --collect-only -q -p no:cacheprovider $T -k backward | grep "::" > $L/ids
  i=0; while read id; do i=$((i+1)); timeout 560 python -m pytest -q -p no:cacheprovider -rA "$id" > $L/kb_$i.log 2>&1 & done < $L/ids
  wait
  for f in $L/kb_*.log; do grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $f | tail -n 2; done | tee $OUT/known_bad.log
  cat $L/kb_*.log > $OUT/known_bad_full.log ;;
U)
  ( timeout 400 python -m task4.tune --backward --solution --csv $OUT/task4-backward-tune.csv ) > $OUT/tune.log 2>&1
  ( timeout 150 python -m task4.profile --backward --solution ) > $OUT/profile.log 2>&1
  tail -n 25 $OUT/tune.log; tail -n 30 $OUT/profile.log ;;
G)
  ( time timeout 590 python -m grader --solution --out $OUT/graded --keep --tasks "${2:-1,2,3,4,5,6,7}" ) > $OUT/grader.log 2>&1
  tail -n 30 $OUT/grader.log ;;
esac
