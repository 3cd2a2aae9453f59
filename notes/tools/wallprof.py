"""A wall-clock sampler for a grading's test processes (a device aid, not part of the kit).

Installed as a module beside a .pth file that imports it (notes/tools/grading.sh, PROFILE=1), it does nothing unless
KIT_WALLPROF names a folder. Then every Python process of the grading samples its main thread's stack every
SAMPLE_S and appends the samples to KIT_WALLPROF/<pid>.jsonl: one line per sample, (epoch, [frame, ...]), the frames
inside the checkout only, outermost first, and for a worker call the entry point's name. Sampling counts waits too
(a worker call, a lock), which a profiler of CPU time misses; `python notes/tools/wallprof.py FOLDER START END` sums each
frame's inclusive seconds over the samples between two epochs (a timed part's window, from a record's timed_parts).
"""

import json
import os
import sys
import threading
import time

SAMPLE_S = 0.02
CALLS = {"call", "call_measuring_memory", "call_on_gpu", "keep"}


def _label(frame, root: str):
    code = frame.f_code
    if not code.co_filename.startswith(root) or "/.venv/" in code.co_filename:
        return None
    name = f"{code.co_filename[len(root):]}:{code.co_name}"
    if code.co_name in CALLS and isinstance(frame.f_locals.get("name"), str):
        name += f"({frame.f_locals['name']})"
    return name


def _sample(folder: str, root: str) -> None:
    main = threading.main_thread().ident
    path = os.path.join(folder, f"{os.getpid()}.jsonl")
    lines = [json.dumps({"argv": sys.argv})]
    last_write = time.time()
    while True:
        time.sleep(SAMPLE_S)
        frame = sys._current_frames().get(main)
        stack = []
        while frame is not None:
            label = _label(frame, root)
            if label:
                stack.append(label)
            frame = frame.f_back
        lines.append(json.dumps([round(time.time(), 3), stack[::-1]]))
        if time.time() - last_write > 2:
            with open(path, "a") as out:
                out.write("\n".join(lines) + "\n")
            lines, last_write = [], time.time()


def install() -> None:
    folder = os.environ.get("KIT_WALLPROF")
    if not folder:
        return
    root = os.environ.get("KIT_WALLPROF_ROOT", os.getcwd()).rstrip("/") + "/"
    os.makedirs(folder, exist_ok=True)
    threading.Thread(target=_sample, args=(folder, root), daemon=True, name="wallprof").start()


def report(folder: str, start: float, end: float, top: int = 40) -> None:
    """Each frame's inclusive seconds over every process's samples between two epochs."""
    inclusive: dict = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            lines = f.read().splitlines()
        argv = json.loads(lines[0]).get("argv") if lines and lines[0].startswith("{") else None
        for line in lines[1:]:
            try:
                when, stack = json.loads(line)
            except ValueError:
                continue
            if start <= when <= end:
                for label in dict.fromkeys(stack):
                    key = (" ".join(argv or [])[:60], label)
                    inclusive[key] = inclusive.get(key, 0.0) + SAMPLE_S
    for (who, label), seconds in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{seconds:7.1f} s  {who:60s} {label}")


if __name__ == "__main__":
    report(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 40)
else:
    install()
