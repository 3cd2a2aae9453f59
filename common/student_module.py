"""Importing a file students write, in the worker: what it defined is kept even if it exits at import.

The task's entry points (taskN/entry.py) load the student's module through `load_student_module`; the worker
(common/worker.py) sends `notes` with every reply, so the checks can say what happened at import.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the kit, or the worker's copy of it
notes: list[str] = []  # things the checks should know, sent with every reply


def load_student_module(name: str):
    """Import a student file, keeping what it defined even if it calls sys.exit() at import."""
    if name in sys.modules:
        return sys.modules[name]
    path = ROOT / (name.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise ImportError(f"{path.relative_to(ROOT)} is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as stop:
        notes.append(f"{path.relative_to(ROOT)} called sys.exit({stop.code!r}) while it was imported; "
                     "the lines after that call did not run")
    except BaseException:
        del sys.modules[name]
        raise
    return module
