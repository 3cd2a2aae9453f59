"""What a student handed in: the entries of a submissions folder, unpacked safely, and the checkout in them.

A learning-management system exports one folder or archive per student, named by the student's id. The
exports of Canvas, Moodle, Blackboard and Gradescope are read as they name things (`lms_entry`): one student
per user, the latest of several uploads graded and the earlier ones named as superseded, and the export's own
files (Gradescope's submission_metadata.yml, Blackboard's receipts) never taken for a student.
The checkout is the folder that holds the files students write at their places, at any depth, or
inside the one archive a student's folder holds; only what can be graded is taken out of an
archive (never what lies in SKIPPED folders), within bounds that refuse a bomb. Anything that
cannot be graded raises NotGradable, whose message is the gradebook's problem text.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from common.tasks import all_student_files

MAX_ENTRIES = 200_000  # entries an archive may list: a repository with its .venv has thousands; more is a bomb
MAX_FILES = 2000  # files taken out of one archive
MAX_BYTES = 200 * 1024 * 1024  # bytes taken out of one archive
# what an archive may hold in all, skipped content included: a tar is read through to skip it (a .venv with
# PyTorch's CUDA wheels is about 6 GiB; decompressing 16 GiB takes about a minute)
MAX_LISTED_BYTES = 16 << 30
ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar", ".zip")
# Folders whose contents are never graded: not taken out of archives, not searched for the student's files.
SKIPPED = {".venv", "venv", "env", ".git", "__pycache__", "__MACOSX", "node_modules", "build", "site-packages",
           ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache", ".idea", ".vscode", "grader-work", "graded"}
STUDENT_FILES = sorted(set(all_student_files()))
MAX_DEPTH = 8  # folders down to the student's checkout inside a submission
MAX_NESTING = 8  # archives inside archives (a zip of the upload, zipped again by the LMS, ...)


class NotGradable(Exception):
    """A submission that cannot be graded; the message is the student's error, as the gradebook states it."""

    kind = "submission"

    def __init__(self, message: str, tampering: bool = False):
        super().__init__(message)
        self.tampering = tampering  # a path out of the folder or a link: not an accident of zipping


class BadArchive(NotGradable):
    """An archive that cannot be unpacked safely."""

    kind = "archive"


def archive_suffix(name: str) -> str | None:
    return next((suffix for suffix in ARCHIVES if name.lower().endswith(suffix)), None)


def student_id(path: Path) -> str:
    """The entry's name without its extension (an archive's, or any other file's last one)."""
    name = path.name
    suffix = archive_suffix(name)
    if suffix:
        return name[: -len(suffix)]
    if not path.is_dir() and not path.is_symlink() and "." in name.strip("."):
        return name.rsplit(".", 1)[0]
    return name


# -- the exports of learning-management systems ------------------------------------------------------------------
# Canvas: "smith_john_12345_67890_upload.zip", a late one "smith_john_LATE_12345_67891_upload-1.zip": the user id is
# the first number, the submission id (later uploads have larger ones) the second.
CANVAS = re.compile(r"^(?P<who>[a-z]+(?:_[a-z]+)*?)_(?:LATE_)?(?P<user>\d{3,})_(?P<upload>\d{3,})_(?P<file>.+)$")
# Moodle: "Jane Doe_123456_assignsubmission_file_" (a folder of the student's files, or each file flattened into its
# name); its online text and feedback folders hold nothing to grade.
MOODLE = re.compile(r"^(?P<who>.+?_\d+)_assign(?P<plugin>submission_file|submission_\w+?|feedback_\w+?)_(?P<file>.*)$")
# Blackboard: "Assignment_jdoe_attempt_2026-11-30-10-15-02_upload.zip", and the attempt's receipt
# "Assignment_jdoe_attempt_2026-11-30-10-15-02.txt". The student is what comes before "_attempt_": a user name may
# hold "_" as the assignment's name may, so the two are not split.
BLACKBOARD = re.compile(r"^(?P<who>.+)_attempt_(?P<when>\d{4}(?:-\d\d){5})(?:_(?P<file>.+))?$")
GRADESCOPE_METADATA = "submission_metadata.yml"  # Gradescope's export: who handed in each submission_<id>/


@dataclass(frozen=True)
class LmsEntry:
    sid: str  # the student: one row in the gradebook
    order: tuple | None  # which of a student's uploads is later (None: the export does not say)
    export: bool = False  # a file of the export itself (metadata, a receipt, feedback): no student


def lms_entry(path: Path, who: dict[str, tuple[str, str]] | None = None) -> LmsEntry:
    """Who an entry of the submissions folder belongs to, as the LMS that exported it names it. who: Gradescope's
    {folder: (student, submitted at)} from its metadata (gradescope_submitters)."""
    name = path.name
    if name == GRADESCOPE_METADATA:
        return LmsEntry(name, None, export=True)
    # Of one student's entries of one upload, a folder or an archive goes before a write-up beside it (a PDF).
    gradable = path.is_dir() or archive_suffix(name) is not None
    if who and name in who:
        sid, when = who[name]
        return LmsEntry(sid, (gradable, when, name))
    if m := BLACKBOARD.match(student_id(path)):
        receipt = not m["file"] and name.lower().endswith(".txt")
        return LmsEntry(m["who"], (gradable, m["when"]), export=receipt)
    if m := MOODLE.match(name):
        return LmsEntry(m["who"], None, export=m["plugin"] != "submission_file")
    if m := CANVAS.match(name):
        resubmitted = re.search(r"-(\d+)(?:\.[^.]+)*$", m["file"])  # Canvas's "-1", "-2" on a file sent again
        return LmsEntry(f"{m['who']}_{m['user']}",
                        (gradable, int(m["upload"]), int(resubmitted[1]) if resubmitted else 0))
    return LmsEntry(student_id(path), None)


def gradescope_submitters(submissions: Path) -> dict[str, tuple[str, str]]:
    """Gradescope's {submission folder: (student, submitted at)}, from its submission_metadata.yml: the student is
    the submitters' student ids (their emails, else names, where none is set), joined by "+" for a group."""
    path = submissions / GRADESCOPE_METADATA
    if not path.is_file() or path.is_symlink():
        return {}
    try:
        import yaml  # PyYAML: installed with transformers

        meta = yaml.safe_load(path.read_text(errors="replace"))
    except Exception:  # noqa: BLE001  unreadable: the folders keep their own names
        return {}
    found = {}
    for folder, about in (meta or {}).items() if isinstance(meta, dict) else ():
        about = {str(k).lstrip(":"): v for k, v in about.items()} if isinstance(about, dict) else {}
        people = [{str(k).lstrip(":"): v for k, v in p.items()} for p in about.get("submitters") or []
                  if isinstance(p, dict)]
        names = [str(p.get("sid") or p.get("email") or p.get("name") or "") for p in people]
        # a folder's name under the class's folders: no "/", no leading "." (".." would be the folder above)
        sid = re.sub(r"[^\w.@+-]+", "_", "+".join(n for n in names if n)).lstrip(".")
        if sid:
            found[str(folder)] = (sid, str(about.get("created_at", "")))
    return found


def discover(submissions: Path) -> list[tuple[str, Path]]:
    """(student id, entry) for every student of the submissions folder (dot files and the export's own files left
    out), sorted by id.

    Every entry is a student, also one that is not a folder or archive the kit can read: its grading then
    says why (NotGradable), so nobody disappears from the gradebook. Where the LMS says which upload of a student
    is the latest, that one is graded (superseded() names the others); two entries with one id and no order
    (alice.zip and alice/) are one student, whose grading names both (namesakes()) until one is removed.
    """
    groups = _entries_by_id(str(submissions), _stamp(submissions))
    return sorted((sid, submissions / names[0]) for sid, (names, _) in groups.items())


def superseded(submissions: Path) -> dict[str, list[str]]:
    """{student: the earlier uploads the latest replaced}, for the students the LMS shows more than one of."""
    return {sid: list(names[1:]) for sid, (names, ordered) in _entries_by_id(str(submissions),
                                                                              _stamp(submissions)).items()
            if len(names) > 1 and ordered}


def namesakes(source: Path) -> list[Path]:
    """The other entries of the submissions folder with the id of `source`, where the export does not say which
    one is the latest."""
    folder = source.parent
    names, ordered = next((group for group in _entries_by_id(str(folder), _stamp(folder)).values()
                           if source.name in group[0]), ((), True))
    return [] if ordered else [folder / name for name in names if name != source.name]


def _stamp(folder: Path) -> tuple[int, int]:
    """The folder's state: an entry added or removed changes its time, Gradescope's metadata its own."""
    meta = folder / GRADESCOPE_METADATA
    return folder.stat().st_mtime_ns, meta.stat().st_mtime_ns if meta.is_file() else 0


@functools.lru_cache(maxsize=4)
def _entries_by_id(folder: str, stamp: tuple[int, int]) -> dict[str, tuple[tuple[str, ...], bool]]:
    """{student: (their entries, whether the export orders them)}, the latest first where it does; read once per
    state of the folder: asked once per student, a listing each time would read a class's folder n times over."""
    who = gradescope_submitters(Path(folder))
    groups: dict[str, list[tuple[tuple | None, str]]] = {}
    only_export: dict[str, list[tuple[tuple | None, str]]] = {}  # a student who sent text alone keeps a row
    for path in sorted(Path(folder).iterdir()):
        if path.name.startswith(".") or path.name == GRADESCOPE_METADATA:
            continue
        entry = lms_entry(path, who)
        (only_export if entry.export else groups).setdefault(entry.sid, []).append((entry.order, path.name))
    for sid, items in only_export.items():
        groups.setdefault(sid, items)
    found = {}
    for sid, items in groups.items():
        ordered = all(order is not None for order, _ in items)
        if ordered:
            items = sorted(items, key=lambda item: item[0], reverse=True)
        found[sid] = (tuple(name for _, name in items), ordered)
    return found


def entry_name(name: str) -> str:
    """An archive entry's name with "/" between folders: some Windows zip tools write "\\" (task1\\attention.py),
    which is read as a folder too, so "..\\" or "\\x" can no more leave the folder than "../" or "/x"."""
    return name.replace("\\", "/")


def _safe_target(dest: Path, name: str) -> Path:
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
        raise BadArchive(f"the archive holds a path outside its folder: {name!r}", tampering=True)
    return dest.joinpath(*parts)


def _members(archive: Path):
    """(name, "file" | "folder" | "other", bytes, a function that opens its data) for each entry."""
    if archive.name.lower().endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                mode = stat.S_IFMT(info.external_attr >> 16)  # 0 when the archiver did not record it
                kind = ("other" if mode not in (0, stat.S_IFREG, stat.S_IFDIR) else
                        "folder" if info.is_dir() else "file")
                yield entry_name(info.filename), kind, info.file_size, lambda info=info: zf.open(info)
    else:
        with tarfile.open(archive, "r:*") as tf:  # plain, gzip, bzip2 or xz
            for member in tf:
                kind = "folder" if member.isdir() else "file" if member.isfile() else "other"
                yield entry_name(member.name), kind, member.size, lambda member=member: tf.extractfile(member)


def graded_file(parts: tuple[str, ...]) -> str | None:
    """The file students write that a path ends with (task1/attention.py), or None."""
    return next((rel for rel in STUDENT_FILES if parts[-len(PurePosixPath(rel).parts):] == PurePosixPath(rel).parts),
                None)


def graded_place(parts: tuple[str, ...]) -> str:
    """"file" where a path ends with a file students write (task1/attention.py), "way" where it ends with a
    folder on the way to one (task1, task2/kernels), else ""."""
    if graded_file(parts):
        return "file"
    for rel in STUDENT_FILES:
        rel_parts = PurePosixPath(rel).parts
        if any(parts[-n:] == rel_parts[:n] for n in range(1, len(rel_parts))):
            return "way"
    return ""


class Taken:
    """What has been taken out of one submission's archives so far: the limits hold for them all together, so
    archives nested in archives are no way around them."""

    def __init__(self):
        self.files = self.size = 0


def unpack(archive: Path, dest: Path, taken: Taken | None = None) -> list[str]:
    """Take out of `archive`, into `dest` (created), what can be graded: the files students write, and archives
    that may hold them, outside SKIPPED folders. The rest is only listed, so a repository zipped with its
    .venv is fine; a link or device where a graded file goes is refused as tampering. Returns the files
    students write that it left in SKIPPED folders (a few), to say why a submission holding only those is 0.
    taken: what earlier archives of the same submission gave (MAX_FILES and MAX_BYTES count them too)."""
    dest.mkdir(parents=True)
    taken = taken or Taken()
    entries, listed = 0, 0
    skipped = []
    try:
        for name, kind, nbytes, read in _members(archive):
            entries, listed = entries + 1, listed + max(nbytes, 0)
            if entries > MAX_ENTRIES:
                raise BadArchive(f"more than {MAX_ENTRIES} entries in the archive")
            if listed > MAX_LISTED_BYTES:
                raise BadArchive(f"more than {MAX_LISTED_BYTES >> 30} GiB in the archive, counting what is not graded")
            target = _safe_target(dest, name) if PurePosixPath(name).parts else dest  # "./": `tar -C dir .`
            parts = tuple(p for p in PurePosixPath(name).parts if p != ".")
            if not parts or any(p.startswith("._") for p in parts):
                continue
            if any(p in SKIPPED for p in parts):
                if kind == "file" and graded_file(parts) and len(skipped) < 5:
                    skipped.append("/".join(parts))
                continue
            place = graded_place(parts)
            if kind == "other":
                if place:
                    raise BadArchive(f"the archive holds a link or device where a graded file goes: {name!r}",
                                     tampering=True)
                continue
            if kind == "folder" or not (place == "file" or archive_suffix(parts[-1])):
                continue
            taken.files += 1
            if taken.files > MAX_FILES:
                raise BadArchive(f"more than {MAX_FILES} files to take out of the archive")
            if taken.size + nbytes > MAX_BYTES:
                raise BadArchive(f"more than {MAX_BYTES // 1024 // 1024} MiB unpacked")
            target.parent.mkdir(parents=True, exist_ok=True)
            with read() as src, open(target, "wb") as out:
                taken.size = _copy_within(src, out, taken.size)
    except NotGradable:
        raise
    except Exception as err:  # noqa: BLE001  bad archives raise many kinds (zlib.error, NotImplementedError, ...)
        raise BadArchive(f"not a readable archive: {type(err).__name__}: {err}") from None
    return skipped


def _copy_within(src, out, size: int) -> int:
    """Copy, counting the bytes an entry really holds (a zip may state fewer), up to MAX_BYTES in all."""
    while chunk := src.read(1 << 20):
        size += len(chunk)
        if size > MAX_BYTES:
            raise BadArchive(f"more than {MAX_BYTES // 1024 // 1024} MiB unpacked")
        out.write(chunk)
    return size


def checkouts(folder: Path) -> tuple[dict[Path, list[str]], list[Path]]:
    """The folders under `folder` that hold files students write at their places, with those files, and the
    archives found on the way. SKIPPED folders are not searched, links not followed."""
    found: dict[Path, list[str]] = {}
    archives = []
    for here, dirs, files in os.walk(folder):
        depth = len(Path(here).relative_to(folder).parts)
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED and depth < MAX_DEPTH)
        for name in sorted(files):
            parts = (Path(here) / name).relative_to(folder).parts
            if archive_suffix(name):
                archives.append(Path(here) / name)
            if rel := graded_file(parts):
                found.setdefault(folder.joinpath(*parts[:-len(PurePosixPath(rel).parts)]), []).append(rel)
    return found, archives


def locate(source: Path, unpacked: Path) -> Path:
    """The student's checkout in the submission `source` (a folder or an archive, unpacked under `unpacked`):
    the one folder that holds files students write at their places, in the submission or in the one archive
    it holds (an LMS keeps the uploaded zip in the student's folder). NotGradable says why there is none."""
    if source.is_symlink():
        raise NotGradable("a link, not a folder or archive of the student's own", tampering=True)
    if others := namesakes(source):
        names = ", ".join(_entry_name(p) for p in [source, *others])
        raise NotGradable(f"{len(others) + 1} submissions with this id ({names}): which one counts? Remove or "
                          "rename the others, then run grader.batch again (it grades this student then)")
    skipped: list[str] = []  # files students write found only inside SKIPPED folders
    taken, opened = Taken(), []  # what the archives gave, and the archives opened, outermost first
    if source.is_dir():
        folder = source
    elif source.is_file() and archive_suffix(source.name):
        skipped += unpack(source, unpacked / "outer", taken)
        folder, opened = unpacked / "outer", [source.name]
    elif source.is_file():
        raise NotGradable(f"{source.name}: a file the kit cannot read as a submission (a folder or an archive: "
                          f"{', '.join(ARCHIVES)})")
    else:
        raise NotGradable(f"{source.name}: neither a folder nor a file")
    for level in range(MAX_NESTING + 1):
        found, archives = checkouts(folder)
        if len(found) == 1:
            return next(iter(found))
        if found:
            places = "; ".join(f"{_shown(place, folder)} ({', '.join(files)})" for place, files in found.items())
            raise NotGradable(f"the files students write are in {len(found)} places: {places}; which one counts?")
        if level == MAX_NESTING or len(archives) != 1:
            break
        # the upload inside the student's folder or archive, itself perhaps zipped again (any depth up to MAX_NESTING)
        skipped += unpack(archives[0], unpacked / f"inner{level + 1}", taken)
        folder = unpacked / f"inner{level + 1}"
        opened.append(archives[0].name)
    skipped += in_skipped_folders(folder)
    if skipped:
        never = sorted({f"{part}/" for path in skipped for part in PurePosixPath(path).parts[:-1] if part in SKIPPED})
        raise NotGradable(f"the files students write are only inside folders that are never graded "
                          f"({', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''}; {', '.join(never)} "
                          f"{'is' if len(never) == 1 else 'are'} never graded): move the checkout out of it")
    also = f"; it holds {len(archives)} archives ({', '.join(a.name for a in archives[:5])})" if archives else ""
    if len(archives) == 1:
        also += f", nested deeper than the {MAX_NESTING} archives the kit opens"
    inside = f" (in {' > '.join(opened)})" if opened else ""
    raise NotGradable(f"none of the files students write ({', '.join(STUDENT_FILES[:3])}, ...) is in it at its "
                      f"place{inside}{also}: an empty or unrelated submission")


def in_skipped_folders(folder: Path, limit: int = 100_000) -> list[str]:
    """Files students write that lie in SKIPPED folders under `folder` (looking at `limit` entries at most):
    why a submission that seems to hold them is not graded."""
    found, seen = [], 0
    for here, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            seen += 1
            parts = (Path(here) / name).relative_to(folder).parts
            if graded_file(parts) and any(p in SKIPPED for p in parts[:-1]):
                found.append("/".join(parts))
        if seen > limit:
            break
    return found


def _entry_name(path: Path) -> str:
    return f"{path.name}/" if path.is_dir() and not path.is_symlink() else path.name


def _shown(place: Path, folder: Path) -> str:
    rel = place.relative_to(folder)
    return f"{rel}/" if rel.parts else "the top folder"


def linked_files(root: Path) -> list[str]:
    """The files students write that this submission holds through links (the file or a folder on its way)."""
    odd = []
    for rel in STUDENT_FILES:
        steps = [root.joinpath(*Path(rel).parts[:n]) for n in range(1, len(Path(rel).parts) + 1)]
        if any(step.is_symlink() for step in steps) or (steps[-1].exists() and not steps[-1].is_file()):
            odd.append(rel)
    return odd


def source_fingerprint(source: Path) -> str:
    """What a grade of this submission graded: the archive's bytes, or a folder's gradable files (the files
    students write and the archives that may hold them, with their paths; SKIPPED folders left out), and the
    names of its namesakes (removing one changes what is graded)."""
    digest = hashlib.sha256()
    for other in namesakes(source):
        digest.update(f"namesake {other.name}\0".encode())
    _digest_entry(digest, source)
    return digest.hexdigest()[:16]


def _digest_entry(digest, source: Path) -> None:
    mode = os.lstat(source).st_mode
    if stat.S_ISLNK(mode):  # never followed or opened: a link to /dev/zero or a FIFO would never end
        digest.update(f"link to {os.readlink(source)}".encode())
    elif not stat.S_ISDIR(mode):
        if not stat.S_ISREG(mode):
            digest.update(f"not a file: {stat.S_IFMT(mode)}".encode())
            return
        try:
            with open(source, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError as err:
            digest.update(f"unreadable: {err}".encode())
    else:
        for here, dirs, files in os.walk(source):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
            for name in sorted(files):
                path = Path(here) / name
                parts = path.relative_to(source).parts
                if not graded_file(parts) and not archive_suffix(name):
                    continue
                digest.update("/".join(parts).encode() + b"\0")
                mode = os.lstat(path).st_mode
                digest.update(f"link to {os.readlink(path)}".encode() if stat.S_ISLNK(mode) else
                              path.read_bytes() if stat.S_ISREG(mode) else b"not a file")
