"""common/machine_code.py reads a built kernel's instructions (cuobjdump -sass), and the Hopper part asks it for wgmma
and TMA: the reference has them; steps 8-11's mma.sync kernel under the Hopper part's name (right numbers) has
neither. Compiled here with `nvcc -arch=sm_90a`, no GPU needed; the full grading of that file runs on an H100/H200
(tests/test_cuda_hopper_submissions.py)."""

import shutil

import pytest

from checks.task4.hopper import HOPPER_INSTRUCTIONS, INSTRUCTIONS_CASE, hopper_instructions_verdict, instructions_case
from common import machine_code, nvcc
from grader.rubric import RUBRIC, score
from tests.conftest import REPO, needs_nvcc, needs_solution
from tests.stand_in import SCORED, Behaviour, failed, stand_in  # noqa: F401
from tests.stand_in.kernels import STAND_IN_BUILDS

needs_disassembler = pytest.mark.skipif(machine_code.tools_missing() is not None,
                                        reason=f"{machine_code.tools_missing()} (the test extra installs them)")

# Steps 8-11's kernel under the Hopper part's name: the part's numbers come out right, without wgmma or TMA
BORROWED_HOPPER = """// nvcc target: sm_90a
#define flash_attention_half_forward borrowed_half_forward
#include "attention_half.cu"
#undef flash_attention_half_forward

cudaError_t flash_attention_hopper_forward(const HopperAttentionParams& hp, cudaStream_t stream) {
  return borrowed_half_forward(hp.p, stream);
}
"""

LISTING = """
	code for sm_90a
		Function : _Z6kernelv
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 UTMALDG.2D [UR8], [UR4] ;                   /* 0x00000008040075b4 */
        /*0020*/             @UP0 HGMMA.64x192x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0030*/                   EXIT ;
		Function : _Z5otherv
        /*0000*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
"""


def test_a_listing_is_read_kernel_by_kernel_past_predicates_and_suffixes():
    kernels = machine_code.parse_sass(LISTING)
    assert kernels == {"_Z6kernelv": {"LDC", "UTMALDG", "HGMMA", "EXIT"}, "_Z5otherv": {"HMMA"}}
    assert hopper_instructions_verdict(kernels)[0]
    passed, message, _ = hopper_instructions_verdict({"_Z5otherv": {"HMMA"}, "_Z1av": {"UTMALDG"}})
    assert not passed and "holds both wgmma and TMA loads (the closest has no wgmma (step 18))" in message, message
    passed, message, _ = hopper_instructions_verdict({})
    assert not passed and all(what in message for what in HOPPER_INSTRUCTIONS.values()), message


class Said:
    def __init__(self, answer, builds=None):
        self.answer, self.builds, self.private_builds = answer, builds, None
        self.notes, self.cases = [], []

    def call(self, name):
        assert name == "extension_file"
        return self.answer

    def note(self, message):
        self.notes.append(message)

    def run(self, name, fn):
        self.cases.append((name, fn()))


@needs_disassembler
def test_an_extension_outside_the_workers_build_folder_is_not_read(tmp_path):
    """The worker names the file; the checks read it only inside the worker's own build folder, else say so."""
    outside = tmp_path / "elsewhere.so"
    outside.write_bytes(b"\x7fELF")
    for answer in (str(outside), str(tmp_path / "builds" / ".." / "elsewhere.so"), None, 3):
        said = Said(answer, builds=tmp_path / "builds")
        instructions_case(said, said)
        assert not said.cases and len(said.notes) == 1 and "did not name a built extension" in said.notes[0]
    said = Said(str(tmp_path / "builds" / "task4.so"), builds=tmp_path / "builds")
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "task4.so").write_bytes(b"not an object")
    instructions_case(said, said)  # cuobjdump refuses it: not checked, not failed
    assert not said.cases and "Not checked" in said.notes[0] and "cuobjdump could not read" in said.notes[0]


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    """The reference's attention_hopper.cu and BORROWED_HOPPER, compiled for sm_90a: {"reference", "borrowed"}."""
    tmp = tmp_path_factory.mktemp("objects")
    reference = REPO / "task4/solution/kernels"
    for folder, hopper in (("reference", (reference / "attention_hopper.cu").read_text()), ("borrowed", BORROWED_HOPPER)):
        (tmp / folder).mkdir()
        (tmp / folder / "attention_half.cu").write_text((reference / "attention_half.cu").read_text())
        (tmp / folder / "attention_hopper.cu").write_text(hopper)
    (tmp / "build").mkdir()
    built = nvcc.compile_kernels([tmp / "reference" / "attention_hopper.cu", tmp / "borrowed" / "attention_hopper.cu"],
                                 tmp / "build", "90", nvcc.CUDA_FLAGS)
    return dict(zip(("reference", "borrowed"), built))


@needs_nvcc
@needs_disassembler
@needs_solution(4)
def test_the_reference_holds_wgmma_and_tma_and_the_borrowed_mma_sync_kernel_does_not(objects):
    passed, message, _ = hopper_instructions_verdict(machine_code.kernel_instructions(objects["reference"]))
    assert passed, message
    found = machine_code.kernel_instructions(objects["borrowed"])
    assert found and all("HMMA" in used for used in found.values()), found  # steps 8-11's kernels, read
    passed, message, _ = hopper_instructions_verdict(found)
    assert not passed and "steps 17-18" in message and "wgmma (step 18) or TMA loads (step 17)" in message, message


@needs_nvcc
@needs_disassembler
@needs_solution(4)
def test_the_part_reads_the_built_extension_and_fails_on_the_borrowed_kernel_alone(objects, stand_in, tmp_path):
    """The whole part on the CPU (PyTorch standing in for the kernels' numbers, which pass), the instructions read
    from a real object where the worker's build folder holds it: the reference's passes, the borrowed one fails the
    part and no point."""
    for rel in ("task4/kernels/attention.cu", "task4/kernels/attention_hopper.cu"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel.replace("kernels/", "solution/kernels/")).read_text())
    STAND_IN_BUILDS.mkdir(parents=True, exist_ok=True)
    verdicts = {}
    for name, built in objects.items():
        library = STAND_IN_BUILDS / f"{tmp_path.name}-{name}.o"
        shutil.copyfile(built, library)
        try:
            stand_in.student[4] = Behaviour(library=library)
            record = stand_in.run(4, "--student-dir", str(tmp_path), *SCORED[4], "--hopper")
        finally:
            library.unlink()
        assert record["status"] == "passed" and score(4, record)[0] == RUBRIC[4].points, failed(record)
        verdicts[name] = [c for c in record["cases"] if c["name"] == INSTRUCTIONS_CASE]
        others = [c for c in record["cases"] if c["kind"] == "optional" and c["name"] != INSTRUCTIONS_CASE]
        assert others and all(c["passed"] for c in others), failed(record)
        assert not any("Not checked" in n for n in record["notes"]), record["notes"]
    assert [c["passed"] for c in verdicts["reference"]] == [True], verdicts
    assert [c["passed"] for c in verdicts["borrowed"]] == [False], verdicts
    assert "mma.sync" in verdicts["borrowed"][0]["message"]
