"""What the device experiments that patch a reference kernel share (hopper/three_consumers.py, hopper/wide_tiles.py,
backward32_dq_atomic.py): the patch, applied once to the device's copy, and here, without a GPU, each variant of its
knob compiled by nvcc with ptxas's spills and notes printed."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository


def patched(text: str, swaps) -> str:
    """`text` with each (old, new[, count]) swapped: `old` must occur `count` times (1 unless given; 0: at least
    once), so a reference that moved on fails loudly instead of patching the wrong place."""
    for old, new, *count in swaps:
        want, found = (count[0] if count else 1), text.count(old)
        assert found == want if want else found >= 1, f"{found} x {old!r}"
        text = text.replace(old, new)
    return text


def patch_once(reference: Path, swaps, marker: str) -> None:
    """The copy's reference patched, unless it holds `marker` already (a second run times the same patch)."""
    text = reference.read_text()
    if marker not in text:
        reference.write_text(patched(text, swaps))


def compile_variants(reference: Path, swaps, knob: str, values, arch: str) -> None:
    """The patched reference with `constexpr int KNOB = value;` for each value, compiled for `arch` (90a: wgmma and
    setmaxnreg; 90), and the lines of ptxas that say spills, C75xx notes or errors."""
    copy = Path("/tmp") / reference.stem / reference.name
    copy.parent.mkdir(exist_ok=True)
    for value in values:
        text = re.sub(rf"constexpr int {knob} = [^;]+;", f"constexpr int {knob} = {value};",
                      patched((ROOT / reference).read_text(), swaps), count=1)
        copy.write_text(text)
        out = subprocess.run(["nvcc", "-c", "-std=c++17", "-O3", "-gencode", f"arch=compute_{arch},code=sm_{arch}",
                              f"-I{ROOT}/common/csrc", str(copy), "-o", str(copy.with_suffix(".o")), "-Xptxas", "-v"],
                             capture_output=True, text=True)
        lines = [line for line in out.stderr.splitlines() if "spill" in line or "C75" in line or "rror" in line]
        print(f"{knob} {value} (nvcc's exit status {out.returncode}):", *sorted(set(lines)), sep="\n  ")


def run(reference: Path, swaps, marker: str, knob: str, values, arch: str, command) -> int:
    """An experiment's command line. `--compile`: each of the knob's values compiled here (compile_variants);
    otherwise, on the device, the copy's reference patched once and `command()` (the timing run's argv, built from
    sys.argv) called; its exit status."""
    if sys.argv[1:] == ["--compile"]:
        compile_variants(reference, swaps, knob, values, arch)
        return 0
    patch_once(reference, swaps, marker)
    return subprocess.call(command())
