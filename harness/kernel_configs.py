"""A kernel file's tunable constants and its configurations, compiled without a GPU (harness/tune.py times them).

A kernel file's tunables are its top-level `constexpr int NAME = VALUE;` lines (task 4's
BLOCK_ROWS, BLOCK_COLS, THREAD_ROWS, THREAD_COLS, MIN_BLOCKS_PER_SM). A configuration
such as "BLOCK_ROWS=64,BLOCK_COLS=64" is the file with those lines changed; nothing in the
student's file changes. Each configuration is compiled in a folder of its own (so its
object is cached like any other build) and reports what the compiler says it costs
(common/resources.py), or why it does not build: a `static_assert` of the file names a
configuration it cannot run, before any GPU time is spent on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from common import nvcc
from common.resources import KernelResources

_SKELETON_MARK = re.compile(r"\s*(//\s*)?\[skeleton: \d+\]")  # the reference's note of the skeleton's value
_CONSTANT = re.compile(r"^(?P<head>(\[\[maybe_unused\]\] )?constexpr int (?P<name>[A-Z][A-Z0-9_]*) = )(?P<value>\d+)"
                       r"(?P<tail>;.*)$", re.M)  # [[maybe_unused]]: a constant only a later step uses


def tunables(text: str) -> dict[str, int]:
    """The file's top-level integer constants, by name."""
    return {m["name"]: int(m["value"]) for m in _CONSTANT.finditer(text)}


def parse_config(spec: str) -> dict[str, int]:
    """"BLOCK_ROWS=64,BLOCK_COLS=32" -> {"BLOCK_ROWS": 64, "BLOCK_COLS": 32}; a clear ValueError otherwise."""
    config = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not value.strip().isdigit():
            raise ValueError(f"configuration {spec!r}: expected NAME=NUMBER pairs separated by commas, got {part!r}")
        config[name.strip()] = int(value)
    return config


def configure(text: str, config: dict[str, int]) -> str:
    """The kernel file with the constants of `config` set; an unknown name is a ValueError listing the known ones."""
    known = tunables(text)
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a top-level `constexpr int` of the kernel file "
                         f"(it has {', '.join(known) or 'none'})")
    return _CONSTANT.sub(lambda m: f"{m['head']}{config.get(m['name'], m['value'])}{m['tail']}", text)


def config_text(config: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items()) or "as in the file"


@dataclass
class Built:
    config: dict[str, int]
    objects: list[Path] = field(default_factory=list)
    kernels: list[KernelResources] = field(default_factory=list)
    error: str | None = None  # why it did not build (a static_assert of the file, a compiler error)

    @property
    def spills(self) -> bool:
        return any(k.spills for k in self.kernels)


def build_configs(source: Path, configs: list[dict[str, int]], folder: Path, arch: str, jobs: int = 1) -> list[Built]:
    """Compile `source` (a kernel file) once per configuration, each in folder/<n>/, `jobs` at once; no GPU needed."""
    from concurrent.futures import ThreadPoolExecutor

    text = source.read_text()

    def one(n: int, config: dict[str, int]) -> Built:
        row = Built(config)
        try:
            kernels = folder / str(n) / "kernels"  # a kernels folder of its own: includes resolve as in the original
            kernels.mkdir(parents=True, exist_ok=True)
            for sibling in source.parent.iterdir():  # headers the file includes from its own folder
                if sibling.is_file() and sibling != source:
                    (kernels / sibling.name).write_bytes(sibling.read_bytes())
            (kernels / source.name).write_text(configure(text, config))
            out = folder / str(n) / "build"
            out.mkdir(exist_ok=True)
            row.objects = nvcc.compile_kernels([kernels / source.name], out, arch, nvcc.CUDA_FLAGS)
            row.kernels = nvcc.kernel_resources(row.objects)
        except (ValueError, nvcc.BuildError) as err:
            row.error = str(err).splitlines()[0] if isinstance(err, ValueError) else first_error(str(err))
        return row

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, range(len(configs)), configs))


def first_error(message: str) -> str:
    """The line a student needs from a failed build: a static_assert's own words when there is one."""
    for line in message.splitlines():
        said = re.search(r'static assertion failed with "(?P<why>[^"]+)"', line)
        if said:
            return f"static_assert: {said['why']}"
    errors = [line for line in message.splitlines() if "error" in line]
    return (errors or message.splitlines() or ["did not build"])[0].strip()


def paste_lines(text: str, config: dict[str, int]) -> list[str]:
    """The kernel file's constant lines as this configuration sets them: what to paste."""
    configured = configure(text, config)
    return [_SKELETON_MARK.sub("", m.group(0)) for m in _CONSTANT.finditer(configured) if m["name"] in config]
