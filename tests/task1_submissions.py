"""Task 1 submissions for the grader's tests: the reference, the skeleton, and one known-bad submission for each way
a submission can cheat or crash (SUBMISSIONS: an exact change of the reference, or code added to it), with `grade`,
which grades one in a fresh grader process as an instructor would."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from harness.processes import MAX_THREADS
from tests.conftest import REPO, bad_variant


def skeleton(task=1):
    from harness.skeleton import generate

    return {str(k): v for k, v in generate(REPO).items()}[f"task{task}/attention.py"]


SOLUTION_1 = (REPO / "task1/solution/attention.py").read_text() if (REPO / "task1/solution").is_dir() else ""
GRAB_REFERENCE = """
import glob, os
roots = ["/work", "/home", "/root", "/tmp", "/srv", "/opt"]
found = [p for r in roots for p in glob.glob(r + "/**/task1/solution/attention.py", recursive=True)]
for path in found + ["/proc/1/cwd/task1/solution/attention.py"]:
    try:
        exec(open(path).read())
        break
    except OSError:
        pass
import subprocess
for where in [".", "/proc/1/cwd"] + [p.split("/task1/")[0] for p in found]:
    shown = subprocess.run(["git", "-C", where, "show", "HEAD:task1/solution/attention.py"], capture_output=True, text=True)
    if shown.returncode == 0:
        exec(shown.stdout)
        break
"""
FORGE_RECORD = """
import atexit, glob, json, os
def forge():
    record = {"task": 1, "status": "passed", "cases": [{"name": "x", "kind": "check", "passed": True,
              "message": "", "metrics": {}}], "notes": []}
    roots = ["/work", "/home", "/root", "/tmp"]
    for path in [p for r in roots for p in glob.glob(r + "/**/*.json", recursive=True)]:
        try:
            open(path, "w").write(json.dumps(record))
        except OSError:
            pass
atexit.register(forge)
forge()
"""
LEAK_HIDDEN = """
import glob
roots = ["/work", "/home", "/root", "/tmp", "/srv", "/opt", "/mnt"]
found = [p for r in roots for p in glob.glob(r + "/**/grader/hidden.py", recursive=True)]
for path in found + ["/proc/1/cwd/grader/hidden.py"]:
    try:
        raise RuntimeError("leaked: " + open(path).read())
    except OSError:
        pass
try:
    import grader.hidden
    raise RuntimeError("leaked: " + repr(vars(grader.hidden)))
except ImportError:
    pass
"""
CANARY = "kit_canary_from_a_submission"
WRITE_EVERYWHERE = f"""
import glob, os
roots = ["/work", "/home", "/root", "/tmp", "/srv", "/opt", "/mnt"]
found = [p for r in roots for name in ("task3", "grading") for p in glob.glob(f"{{r}}/**/{{name}}", recursive=True)]
for folder in found + ["/proc/1/cwd"]:
    try:
        open(os.path.join(folder, "{CANARY}"), "w").write("written")
    except OSError:
        pass
"""
THREAD_BOMB = MAX_THREADS + 256  # threads the known-bad thread_bomb starts
CONNECT_SOCKETS = """
import os, socket, stat
for top in ["/run", "/var", "/tmp", "/dev"]:
    for root, _, names in os.walk(top):
        for name in names:
            try:
                if stat.S_ISSOCK(os.stat(os.path.join(root, name)).st_mode):
                    with socket.socket(socket.AF_UNIX) as s:
                        s.settimeout(1)
                        s.connect(os.path.join(root, name))
                        s.sendall(b"kit_canary")
            except OSError:
                pass
"""
# Task 1 student files: the reference with one change, or the skeleton with an attack added.
SUBMISSIONS = {
    "correct": None,
    "wrong_scale": ("/ math.sqrt(q.shape[-1])", "/ q.shape[-1]"),
    "segfault": ("    scores = attention_scores(q, k)\n",
                 "    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)\n    scores = attention_scores(q, k)\n"),
    "hang": ("    scores = attention_scores(q, k)\n", "    import time\n    time.sleep(600)\n    scores = attention_scores(q, k)\n"),
    # bounded, so that a test machine outlives a watch that fails; the name lets the test find leftovers
    "fork_bomb": ("    scores = attention_scores(q, k)\n",
                  "    import ctypes, os, time\n    for _ in range(1000):\n        if os.fork() == 0:\n"
                  "            ctypes.CDLL(None).prctl(15, b'kit_fork_bomb', 0, 0, 0)\n"
                  "            time.sleep(120)\n            os._exit(0)\n    scores = attention_scores(q, k)\n"),
    "thread_bomb": ("    scores = attention_scores(q, k)\n",
                    "    import threading, time\n    threading.stack_size(65536)\n"
                    f"    for _ in range({THREAD_BOMB}):\n"
                    "        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
                    "    scores = attention_scores(q, k)\n"),
    # keeps writing in the one folder its worker may write in, the grader's scratch copy, until it is killed
    "hang_writing": ("    scores = attention_scores(q, k)\n",
                     "    import itertools, os\n    for i in itertools.count():\n"
                     "        open(os.path.join(os.environ['KIT_BUILD_ROOT'], f'junk{i % 1000}'), 'w').close()\n"),
    "pytorch_attention": ("    return torch.softmax(scores, dim=-1) @ v\n",
                          "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"),
    "sdpa_by_built_name_in_a_thread": ("    return torch.softmax(scores, dim=-1) @ v\n",
        "    import concurrent.futures, torch.nn.functional as F\n"
        "    from torch.utils._python_dispatch import _disable_current_modes\n"
        "    with _disable_current_modes(), concurrent.futures.ThreadPoolExecutor() as pool:\n"
        "        return pool.submit(getattr(F, 'scaled_dot_' + 'product_attention'), q, k, v, is_causal=causal).result()\n"),
    "raises": ("    return torch.softmax(scores, dim=-1) @ v\n",
               "    if q.shape[-2] == 1:\n        raise ValueError('one query: not handled')\n"
               "    return torch.softmax(scores, dim=-1) @ v\n"),
    "imports_solution": ("from common.layer import AttentionLayer\n",
                         "from common.layer import AttentionLayer\nfrom task1.solution.attention import *  # noqa\n"),
    "imports_the_checks_reference": ("    return torch.softmax(scores, dim=-1) @ v\n",
        "    import importlib\n    return importlib.import_module('harness.attention' + '_math')"
        ".attention_float64(q, k, v, causal)[0].float()\n"),
    "syntax_error": ("def merge_heads(", "def merge_heads(:"),
    "sys_exit_at_import": ("solution", "\nimport sys\nsys.exit(0)\n"),
    "leftover_thread": ("from common.layer import AttentionLayer\n",
                        "from common.layer import AttentionLayer\nimport threading, time\n"
                        "threading.Thread(target=time.sleep, args=(3600,)).start()\n"),
    # attacks on the skeleton: none of them may earn a point
    "reads_the_reference_from_disk": ("skeleton", GRAB_REFERENCE),
    "forges_the_record": ("skeleton", FORGE_RECORD),
    "kills_the_checks": ("skeleton", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"),
    "patches_the_checks": ("skeleton", "try:\n    import harness.checks as c\n    c.compare = lambda *a, **k: None\n"
                                       "except ImportError:\n    pass\n"),
    "reads_the_hidden_cases": ("solution", LEAK_HIDDEN),
    "writes_outside_its_view": ("skeleton", WRITE_EVERYWHERE),
    "connects_to_sockets": ("skeleton", CONNECT_SOCKETS),
    "empties_the_watch_list": ("    return torch.softmax(scores, dim=-1) @ v\n",
        "    import common.impl as impl, torch.nn.functional as F\n"
        "    getattr(impl, 'PYTORCH_ATTENTION', set()).clear()\n"
        "    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"),
    "detached_process": ("skeleton", "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                         "'import time, glob\\nfor _ in range(600):\\n    time.sleep(0.1)\\n    "
                         "[open(p, \"w\").write(\"{}\") for p in glob.glob(\"/**/results.json\", recursive=True)]'], "
                         "start_new_session=True)\n"),
}


def submission_text(name):
    variant = SUBMISSIONS[name]
    if variant is None:
        return SOLUTION_1
    if variant[0] in ("skeleton", "solution"):
        return (skeleton() if variant[0] == "skeleton" else SOLUTION_1) + variant[1]
    return bad_variant(1, "attention.py", *variant)


def grade(tmp_path, name, timeout=120, tasks="1", files=None, plain=False):
    """Grade a task 1 submission (plain: with --no-sandbox, which runs the code without bubblewrap even where it
    is installed: Results.md then says so)."""
    sub = tmp_path / name
    sub.mkdir()
    for rel, text in (files if files is not None else {"task1/attention.py": submission_text(name)}).items():
        (sub / rel).parent.mkdir(parents=True, exist_ok=True)
        (sub / rel).write_bytes(text if isinstance(text, bytes) else text.encode())
    temp = tmp_path / "tmp"  # the grader's scratch copy: its own, so no other test's leftovers count here
    temp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "grader", "--submission", str(sub), "--tasks", tasks,
                           "--timeout", str(timeout), *(["--no-sandbox"] if plain else [])], cwd=REPO,
                          capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, TMPDIR=str(temp), KIT_NO_SANDBOX="0"))  # the flag alone decides
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not list(temp.iterdir()), "a scratch copy was left behind"
    out = tmp_path / "grading" / name
    assert not (sub / "results.json").exists(), "results must not be written into the submission"
    results = json.loads((out / "results.json").read_text())
    md = (out / "Results.md").read_text()
    if plain or shutil.which("bwrap") is None:
        assert "Student code ran in: a plain worker process" in md, md  # --no-sandbox is honest
    return results, md


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt install bubblewrap)")
