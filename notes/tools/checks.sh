#!/bin/bash
# Device calls that check the kit, from the repository root on the GPU machine (bubblewrap's .deb unpacked first;
# the notebook's packages carried as wheels in .dev/wheels; logs under $OUT): bash notes/tools/checks.sh MODE.
# notebook: the notebook in a fresh handout; compare: every reference implementation side by side; operators: the
# registered operators' tests; known-bad [FILTER]: tests/test_cuda_submissions.py and test_cuda_hopper_submissions.py
# (or KB_FILES), one process each (no xdist workers: 11 processes of 4 ran past their time), KB_JOBS (8) at a time,
# each verdict in known_bad.log as it comes, with its seconds (a pytest -k filter; KB_LIMIT seconds each); grade: the
# grader.
L=/tmp/logs; mkdir -p $L
export PYTHONUNBUFFERED=1  # a log cut by a timeout still shows how far it got
# cuobjdump (the Hopper part reads its kernels' instructions): the toolkit's, else CUDA's wheels carried in .dev/
command -v cuobjdump >/dev/null || [ -x /usr/local/cuda/bin/cuobjdump ] || python -m pip install -q --no-index .dev/nvidia_cuda_cuobjdump-*.whl .dev/nvidia_cuda_nvdisasm-*.whl 2>/dev/null
case "$1" in
notebook)
  which -a python pip > $OUT/pip.log; python -m pip install -q --no-index --find-links .dev/wheels nbclient nbformat ipykernel >> $OUT/pip.log 2>&1; python -c "import nbformat, nbclient, ipykernel" >> $OUT/pip.log 2>&1
  rm -rf /tmp/handout && python -m grader.handout /tmp/handout > /dev/null
  # no network here: the kit installed as the notebook's set-up cell would, without fetching its build backend
  python -m pip install -q --no-deps --no-build-isolation -e /tmp/handout >> $OUT/pip.log 2>&1
  ( time timeout -s INT ${NB_LIMIT:-560} python - <<'PY'
import os, time, nbformat
from nbclient import NotebookClient
nb = nbformat.read("/tmp/handout/course.ipynb", 4)
started = {}
def start(cell, cell_index, **_): started[cell_index] = time.time()
def done(cell, cell_index, **_):  # each cell's time as it ends, in a log a timeout cannot lose
    with open(os.environ["OUT"] + "/cells.log", "a") as log:
        print(f"cell {cell_index}: {time.time() - started[cell_index]:.0f} s: {cell.source.splitlines()[0][:60]}", file=log)
try:
    NotebookClient(nb, timeout=int(os.environ.get("NB_CELL_LIMIT", 540)), kernel_name="python3", on_cell_start=start,
                   on_cell_executed=done, resources={"metadata": {"path": "/tmp/handout"}}).execute()
finally:  # what ran, even when a cell failed or the time ran out
    nbformat.write(nb, "/tmp/course-executed.ipynb")
    for c in nb.cells:
        for o in c.get("outputs", []):
            print(o.get("text", "") or o.get("data", {}).get("text/plain", ""), end="")
PY
  ) > $OUT/notebook.log 2>&1
  cp /tmp/course-executed.ipynb $OUT/ 2>/dev/null; tail -n 40 $OUT/notebook.log; cat $OUT/cells.log ;;
compare)
  ( time timeout 560 python -m harness.compare --solution --head-dims 64,128 --csv $OUT/compare.csv ) > $OUT/compare.log 2>&1
  tail -n 30 $OUT/compare.log ;;
operators)
  ( timeout 560 python -m pytest -q -p no:cacheprovider -rA tests/test_operators.py ) > $OUT/operators.log 2>&1
  tail -n 30 $OUT/operators.log ;;
known-bad)  # one process each, KB_JOBS (8) at a time, each verdict written as it comes
  python -m pytest --collect-only -q -p no:cacheprovider ${KB_FILES:-tests/test_cuda_submissions.py tests/test_cuda_hopper_submissions.py} ${2:+-k "$2"} | grep "::" > $L/ids
  cat -n $L/ids | sed 's/^ *//' | xargs -P ${KB_JOBS:-8} -L 1 sh -c \
    'start=$(date +%s); timeout ${KB_LIMIT:-540} python -m pytest -q -n 0 -p no:cacheprovider -rA "$1" > '$L'/kb_$0.log 2>&1; echo "$? $1 ($(( $(date +%s) - start )) s)" | tee -a '$OUT'/known_bad.log'
  ;;
grade)  # a part graded by an earlier call is carried back in as ./graded (gitignored) and kept
  [ -d graded ] && cp -r graded $OUT/graded
  ( time timeout 590 python -m grader --solution --out $OUT/graded --keep --tasks "${2:-1,2,3,4,5,6,7}" ) > $OUT/grader.log 2>&1
  tail -n 30 $OUT/grader.log ;;
esac
