#!/bin/bash
# Issue 55's device calls, from the repository root on the GPU machine; bubblewrap's .deb carried in .dev/.
# G [TASKS]: the grader on the reference, each output line time-stamped, the records (with each case's seconds)
# packed as graded.tgz. A part graded by an earlier call is carried back in as ./graded and kept.
export PYTHONUNBUFFERED=1
dpkg -x .dev/bubblewrap_*.deb / 2>/dev/null
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > $OUT/gpu.txt
stamp() { python3 -c '
import sys, time
t0 = time.time()
for line in sys.stdin:
    print(f"{time.time() - t0:7.1f} {line}", end="", flush=True)'; }
case "$1" in
G)
  [ -d graded ] && cp -r graded /tmp/graded
  ( time timeout ${LIMIT:-570} python -m grader --solution --out /tmp/graded --keep --tasks "${2:-1,2,3,4,5,6,7}" ) 2>&1 | stamp > $OUT/grader.log
  tar czf $OUT/graded.tgz -C /tmp graded; tail -n 25 $OUT/grader.log ;;
esac
