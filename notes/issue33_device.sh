#!/bin/bash
# Issue 33's device calls (run from the repository root on the GPU machine, bubblewrap's .deb unpacked first; logs
# under $OUT). T: the backward part of the reference (cases, sanitizer, training, timings) and the skeleton's;
# K: the known-bad submissions, one process each; U: tune and profile --backward; G: the grader.
L=/tmp/logs; mkdir -p $L
export PYTHONUNBUFFERED=1  # a log cut by a timeout still shows how far it got
case "$1" in
T)
  ( timeout 200 python -m task4.test --backward ) > $OUT/t4bwd_skeleton.log 2>&1 &  # builds while the reference builds
  ( time timeout 400 python -m task4.test --solution --backward --hidden grader/hidden.py ) > $OUT/t4bwd.log 2>&1
  wait
  grep -E "FAIL|model trained|pass time|memory-safe|bad input" $OUT/t4bwd.log; tail -n 4 $OUT/t4bwd_skeleton.log ;;
K)  # known-bad submissions, one process each, ${2:-16} at a time; $3: a pytest -k filter (default: every one)
  T=tests/test_cuda_submissions.py
  python -m pytest --collect-only -q -p no:cacheprovider $T ${3:+-k "$3"} | grep "::" > $L/ids
  cat -n $L/ids | sed 's/^ *//' | xargs -P ${2:-16} -L 1 sh -c \
    'timeout 540 python -m pytest -q -p no:cacheprovider -rA "$1" > '$L'/kb_$0.log 2>&1; echo "$? $1" >> '$L'/rcs'
  sort -n $L/rcs | tee $OUT/known_bad.log; cat $L/kb_*.log > $OUT/known_bad_full.log ;;
U)
  ( timeout 400 python -m task4.tune --backward --solution --csv $OUT/task4-backward-tune.csv ) > $OUT/tune.log 2>&1
  ( timeout 150 python -m task4.profile --backward --solution ) > $OUT/profile.log 2>&1
  tail -n 25 $OUT/tune.log; tail -n 30 $OUT/profile.log ;;
G)
  ( time timeout 590 python -m grader --solution --out $OUT/graded --keep --tasks "${2:-1,2,3,4,5,6,7}" ) > $OUT/grader.log 2>&1
  tail -n 30 $OUT/grader.log ;;
esac
