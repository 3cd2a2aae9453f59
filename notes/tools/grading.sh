#!/bin/bash
# Device calls that measure a grading, from the repository root on the GPU machine (the `device` tool's `run`, with
# bubblewrap's .deb carried in .dev/): bash notes/tools/grading.sh MODE. Logs and records come back under $OUT.
# grade [TASKS]: `python -m grader --solution`, each output line time-stamped, the records (with each case's
#   seconds, when each test started and when each timed part began) packed as graded.tgz. For a first run's cost,
#   `rm -rf build /tmp/graded` first: --keep reuses a task graded earlier on the same machine (or carried back in as
#   ./graded), which is how a long grading is split over calls.
# class: a class of one student who hands in the reference's files, through grader.batch (its prebuild, then the
#   grading): the cost of a grading in a class. Run it after `grade` in the same machine's session, so the prebuild
#   finds the references `grade` published in build/ (else it builds them one after another first).
# oom: GPU memory held by another process (all but 1 GiB), then task 3 graded: it must end "could not grade"
#   (grader/machine.py), not 0.
# PROFILE=1: notes/tools/wallprof.py samples the grading's processes (prof.tgz; `python notes/tools/wallprof.py prof
#   START END` sums a window).
# It grades the working tree as sent. The device's copy of .git stays at the commit the session started from, so
# Results.md says "<that commit> with changes not committed"; the tree graded is the one of the call (commit first,
# and name that commit).
export PYTHONUNBUFFERED=1
dpkg -x .dev/bubblewrap_*.deb / 2>/dev/null
# cuobjdump (the Hopper part reads its kernels' instructions): the toolkit's, else CUDA's wheels carried in .dev/
command -v cuobjdump >/dev/null || [ -x /usr/local/cuda/bin/cuobjdump ] || python -m pip install -q --no-index .dev/nvidia_cuda_cuobjdump-*.whl .dev/nvidia_cuda_nvdisasm-*.whl 2>/dev/null
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > $OUT/gpu.txt
stamp() { python3 -c '
import sys, time
t0 = time.time()
for line in sys.stdin:
    print(f"{time.time() - t0:7.1f} {line}", end="", flush=True)'; }
git status --short > $OUT/tree.txt 2>/dev/null
if [ -n "$PROFILE" ]; then  # notes/tools/wallprof.py in every Python process of the grading (workers left out)
  site=$(python3 -c "import site; print(site.getsitepackages()[0])")
  cp notes/tools/wallprof.py "$site/kit_wallprof.py" && echo "import kit_wallprof" > "$site/kit_wallprof.pth"
  export KIT_WALLPROF=/tmp/prof KIT_WALLPROF_ROOT=$PWD
fi
case "$1" in
grade)
  [ -d graded ] && cp -r graded /tmp/graded
  ( time timeout ${LIMIT:-570} python -m grader --solution --out /tmp/graded --keep --tasks "${2:-1,2,3,4,5,6,7}" ) 2>&1 | stamp > $OUT/grader.log
  tar czf $OUT/graded.tgz -C /tmp graded; tail -n 25 $OUT/grader.log
  [ -d /tmp/prof ] && tar czf $OUT/prof.tgz -C /tmp prof ;;
class)
  python3 - <<'PY'
from pathlib import Path
from common.tasks import TASKS
for rel in (r for t in TASKS.values() for r in t.student_files):
    dest = Path("/tmp/class/reference-files") / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(Path(rel.replace("/", "/solution/", 1)).read_text())
PY
  ( time timeout ${LIMIT:-400} python -m grader.batch /tmp/class --out /tmp/classout ) 2>&1 | stamp > $OUT/class.log
  cp /tmp/classout/students/reference-files/grade.log $OUT/class-grade.log 2>/dev/null
  tar czf $OUT/class.tgz -C /tmp/classout students/reference-files/graded students/reference-files/grading.json 2>/dev/null
  tail -n 15 $OUT/class.log; grep -E "^\s+[0-9.]+ +\(|of which" $OUT/class-grade.log ;;
oom)
  python3 -c "
import time, torch
free, total = torch.cuda.mem_get_info()
held = torch.empty(free - (1 << 30), dtype=torch.uint8, device='cuda')
open('/tmp/holding', 'w').write(str(held.numel()))
time.sleep(900)" &
  holder=$!; while [ ! -f /tmp/holding ]; do sleep 1; done; nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> $OUT/gpu.txt
  ( time timeout ${LIMIT:-300} python -m grader --solution --tasks 3 --out /tmp/oom ) 2>&1 | stamp > $OUT/oom.log
  kill $holder; cp /tmp/oom/Results.md $OUT/oom-Results.md; tail -n 12 $OUT/oom.log ;;
esac
