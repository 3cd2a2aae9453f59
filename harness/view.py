"""The worker's view of the files, and the bubblewrap command that shows it nothing else (trusted side).

`make_view` fills a fresh folder with common/ (the given code and the worker's side of the protocol),
the task's given files and the student's files (regular files only, never a link followed). With
bubblewrap (`bwrap`) installed, the worker runs inside it (`bwrap_command`):
- the file system is read-only, and everything but the operating system's own folders
  (/usr, /etc, /opt, ...) is hidden behind empty folders: home folders, /tmp, /run, /var, /work,
  /srv and the like, this checkout, the submission and the results folder (only Python's own
  folders and the view are put back), so neither the reference solutions nor the hidden cases are there;
- its own PID namespace: it cannot see or signal the checks, and every process it starts
  dies with it (--die-with-parent);
- no network, and no capabilities when run as root.
Without bubblewrap it is a plain process in the view: the split between checks and student
code still holds (separate memory, validated replies, records written by the checks), but
the files of the machine are not hidden and a detached process may outlive the task.
`sandbox_status` says which one applies; the grader writes it into the results.
"""

from __future__ import annotations

import os
import shutil
import site
import stat
import sys
import tempfile
import time
from pathlib import Path

from common.impl import REPO, source_of
from common.tasks import TASKS, WORKER_FOLDER

BWRAP = shutil.which("bwrap")
MAX_STUDENT_FILE_BYTES = 2 * 1024 * 1024
WORKER_CODE = (".py", ".h", ".cu", ".cuh")  # what of common/ the view holds: its modules, the headers the bindings
# include, the kernels given with them (common/csrc/linear_rows.cu) and the device library (common/csrc/device)


def sandbox_status() -> str:
    if BWRAP and os.environ.get("KIT_NO_SANDBOX") != "1":
        return "bubblewrap"
    return "plain process"


def remove_tree(path: Path, wait_s: float = 10.0) -> None:
    """Remove a folder that processes being killed may still write in (a stopped grading's scratch copy).

    A sandboxed worker dies a moment after the test that started it (its parent-death signals fire one
    after the other), so a single rmtree can meet a file created after it listed the folder.
    """
    deadline = time.monotonic() + wait_s
    handler = "onexc" if sys.version_info >= (3, 12) else "onerror"
    root = os.path.abspath(path)
    while True:
        shutil.rmtree(path, **{handler: lambda function, failed, error: _unlock(root, failed, error)})
        if not os.path.lexists(path) or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _unlock(root: str, path, error) -> None:
    """rmtree met a folder the student's code made read-only (chmod): open it, and the next pass removes it.

    Only for a refusal, and only inside the tree being removed: its parent (/tmp, say) is never touched, since
    a chmod 700 of /tmp would close it to every other user."""
    if not isinstance(error[1] if isinstance(error, tuple) else error, PermissionError):
        return
    for folder in (os.path.dirname(path), path):
        folder = os.path.abspath(folder)
        if folder != root and not folder.startswith(root + os.sep):
            continue
        try:
            if os.path.isdir(folder) and not os.path.islink(folder):
                os.chmod(folder, 0o700)
        except OSError:
            pass


def copy_regular_file(src: Path, dst: Path) -> str | None:
    """Copy one submitted file without following links; None, or why it was not copied."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "not a regular file (a link?)"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
        data = f.read(MAX_STUDENT_FILE_BYTES + 1)
        mtime = os.fstat(fd).st_mtime_ns
    if len(data) > MAX_STUDENT_FILE_BYTES:
        return f"larger than {MAX_STUDENT_FILE_BYTES // 1024 // 1024} MiB"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    os.utime(dst, ns=(mtime, mtime))  # an unchanged kernel keeps its cached build
    return None


def building_lock(builds: Path) -> Path:
    """Held exclusively by the grader while it builds the kernels ahead into `builds` (grader/runner.py)."""
    return builds / "building.lock"


def built_ahead(builds: Path) -> Path:
    """The grader's copy of the kernels it built ahead in `builds`, which no worker can write (grader/runner.py)."""
    return builds.with_name(builds.name + "-ahead")


def copy_tree(source: Path, target: Path, suffixes: tuple[str, ...] | None = None) -> None:
    """Copy the folders and regular files under `source` (those ending in `suffixes`, if given), times kept
    (ninja compares them); a link is left out, not followed, and so is anything else, and __pycache__.
    Copy only what no process writes meanwhile."""
    for folder, folders, files in os.walk(source):  # does not enter a link to a folder
        folders[:] = [name for name in folders if name != "__pycache__"]
        into = target / Path(folder).relative_to(source)
        into.mkdir(parents=True, exist_ok=True)
        for name in files:
            if stat.S_ISREG(os.lstat(Path(folder) / name).st_mode) and (suffixes is None or name.endswith(suffixes)):
                shutil.copy2(Path(folder) / name, into / name)


def copy_builds(shared: Path, private: Path, folders: list[str]) -> None:
    """Copy the named build folders of the grader's copy of `shared` (`built_ahead`) into `private`, once the
    grader has made it (its building lock). A folder not built is left out: the worker builds it in its copy."""
    import fcntl

    from harness.gpu_share import waiting

    private.mkdir(parents=True, exist_ok=True)
    ahead = building_lock(shared.parent)
    if ahead.exists():
        with open(ahead) as held, waiting():
            fcntl.flock(held, fcntl.LOCK_SH)
    source = built_ahead(shared.parent) / shared.name
    for name in folders:
        if (source / name).is_dir() and not (source / name).is_symlink():
            copy_tree(source / name, private / name)


def make_view(task: int, student_dir: Path, view: Path, solution: bool) -> list[str]:
    """Fill `view` with the given code and the student's files; returns notes on files not taken."""
    if view.exists():
        shutil.rmtree(view)
    view.mkdir(parents=True)
    spec = TASKS[task]
    # common/ whole, but only its code: an editor's backup or a link left there is not the worker's
    copy_tree(REPO / WORKER_FOLDER, view / WORKER_FOLDER, suffixes=WORKER_CODE)
    for rel in spec.given_files:
        (view / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, view / rel)
    for used in spec.uses:
        for rel in TASKS[used].given_files:
            if not (view / rel).exists():
                (view / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, view / rel)
    notes, missing = [], []
    for number in (task, *spec.uses):
        for rel in TASKS[number].student_files:
            source = source_of(rel, student_dir, solution)
            why = copy_regular_file(source, view / rel)
            if why == "missing":
                missing.append(rel)
            elif why:
                notes.append(f"{rel}: {why}, so it was not used")
    if missing:  # one line: a checkout with a task's files only should not push its failures off the first lines
        notes.insert(0, f"{', '.join(missing)}: missing, so {'it was' if len(missing) == 1 else 'they were'} not used")
    return notes


# Top-level folders of the operating system, kept (read-only): Python, compilers, CUDA and its driver
# live there. Every other top-level folder (/home, /root, /tmp, /work, /srv, /mnt, /data, ...) is
# hidden, since a copy of the course with its solutions may sit in any of them. So are /run and /var: a
# read-only view of a Unix socket still lets a process connect to it (munge, Docker, D-Bus, and
# slurmstepd's sockets in /var/spool/slurmd, which obey the job's user). /dev/shm stays: PyTorch's CUDA
# tensor sharing between the checks and the worker keeps its reference counts in a file there.
SYSTEM_FOLDERS = {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "opt", "proc", "sbin",
                  "sys", "usr"}


def _hidden_roots(extra: list[Path]) -> list[Path]:
    roots = [p for p in Path("/").iterdir() if p.name not in SYSTEM_FOLDERS and p.is_dir() and not p.is_symlink()]
    roots += [REPO.resolve(), *[p.resolve() for p in extra]]
    return sorted({r for r in roots if r.exists()}, key=lambda p: len(p.parts))


def _python_paths() -> list[Path]:
    """Folders Python and its packages live in: put back inside hidden folders, read-only."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent}
    paths |= {Path(p) for p in sys.path if p and Path(p).is_dir()}
    paths |= {Path(p) for p in site.getsitepackages() if Path(p).is_dir()}
    from common.nvcc import cpp_extension

    cuda_home = cpp_extension().CUDA_HOME
    if cuda_home:
        paths.add(Path(cuda_home))
    for tool in ("nvcc", "ninja", "c++", "gcc"):
        found = shutil.which(tool)
        if found:
            paths.add(Path(found).resolve().parent)
    repo = REPO.resolve()
    return sorted(p.resolve() for p in paths if p.exists() and not _inside(p.resolve(), repo, but=".venv"))


def _inside(path: Path, root: Path, but: str) -> bool:
    """True if path is the checkout or inside it, except its virtual environment."""
    try:
        rel = path.relative_to(root)
    except ValueError:
        return False
    return not rel.parts or rel.parts[0] != but


def bwrap_command(view: Path, writable: list[tuple[Path, Path]], hide: list[Path]) -> list[str]:
    """writable: (folder here, where the worker sees it) pairs."""
    cmd = [BWRAP, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    for root in _hidden_roots(hide):
        cmd += ["--tmpfs", str(root)]
    for path in _python_paths():
        cmd += ["--ro-bind", str(path), str(path)]
    cmd += ["--ro-bind", str(view), str(view)]
    for path, seen_as in writable:
        cmd += ["--bind", str(path), str(seen_as)]
    cmd += ["--unshare-pid", "--unshare-net", "--unshare-uts", "--die-with-parent", "--chdir", str(view)]
    if os.geteuid() == 0:
        cmd += ["--cap-drop", "ALL"]
    if not sys.stdin.isatty():
        cmd += ["--new-session"]  # no terminal to type into; with one, breakpoint() needs it
    return cmd + ["--"]


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="kit-"))
