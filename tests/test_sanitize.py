"""The sanitizer pass's report reading and messages, on real compute-sanitizer logs (no GPU needed).

tests/data/sanitizer/ holds logs recorded on an H200: task 2's reference gemm_nt with one
edit each (norowguard: the A-tile load without `row0 + r < m`; nosync: no __syncthreads()
after the inner loop; nostoreguard: the store without its guard), called on a (2, 67, 45)
x (2, 53, 45) product whose tensors lay at the addresses below.
"""

from pathlib import Path

from harness import sanitize

DATA = Path(__file__).parent / "data" / "sanitizer"
SOURCE = (Path(__file__).parent.parent / "task2/solution/kernels/attention.cu")
# (name, shape, address, bytes) as the worker reported them in each recorded run
TENSORS = {
    "norowguard": [("a", (2, 67, 45), 0x7fe846800000, 24120), ("b", (2, 53, 45), 0x7fe846806000, 19080),
                   ("c", (2, 67, 53), 0x7fe84680ac00, 28408)],
    "nostoreguard": [("a", (2, 67, 45), 0x7f7832800000, 24120), ("b", (2, 53, 45), 0x7f7832806000, 19080),
                     ("c", (2, 67, 53), 0x7f783280ac00, 28408)],
}


def report(name):
    return sanitize.parse((DATA / f"{name}.log").read_text())


def messages(name, tensors=()):
    lines = {"attention.cu": SOURCE.read_text().splitlines()} if SOURCE.exists() else {}
    unique = sanitize.closest_to_the_edge(report(name).findings)  # as the pass tells them
    return [sanitize.finding_message(f, lines, list(tensors), lambda k: "Task 2, step 3" if k == "gemm_nt_kernel" else None)
            for f in unique]


def test_clean_reports_are_clean():
    for name in ("clean-memcheck", "clean-racecheck", "norowguard-racecheck", "nosync-memcheck"):
        r = report(name)
        assert r.findings == [] and r.errors == 0 and r.complete, name


def test_an_out_of_bounds_read_names_the_line_and_the_tensor():
    r = report("norowguard-memcheck")
    assert r.errors == 50 and r.complete and len(r.findings) >= 3
    (message,) = messages("norowguard-memcheck", TENSORS["norowguard"])
    assert message.startswith("out-of-bounds read of global memory in gemm_nt_kernel at attention.cu:138")
    assert "4 bytes right after the end of `a` (2 x 67 x 45)" in message
    assert message.endswith("(README, Task 2, step 3)")


def test_an_out_of_bounds_write_names_the_output():
    r = report("nostoreguard-memcheck")
    assert r.errors == 210 and r.complete, r.summaries  # "110 errors were not printed" is not a second summary
    (message,) = messages("nostoreguard-memcheck", TENSORS["nostoreguard"])
    assert "out-of-bounds write of global memory in gemm_nt_kernel at attention.cu:167" in message
    assert "4 bytes right after the end of `c` (2 x 67 x 53)" in message


def test_the_access_told_is_the_one_nearest_the_edge_whatever_the_order():
    # Which thread memcheck reports first depends on scheduling (an H200 once reported a write a whole
    # row past `c` first): the message must not.
    found = report("nostoreguard-memcheck").findings
    for order in (found, found[::-1], sorted(found, key=lambda f: -f.beyond())):
        (chosen,) = sanitize.closest_to_the_edge(order)
        assert chosen.beyond() == 0, chosen
    assert max(f.beyond() for f in found) > 0, "the log holds accesses further out too"


def test_a_race_names_both_sides():
    r = report("nosync-racecheck")
    assert r.errors == 4 and r.complete
    assert all(f.kind == "shared-memory race" for f in r.findings)  # racecheck's warnings are left out
    message = messages("nosync-racecheck")[0]
    assert message.startswith("shared-memory race in gemm_nt_kernel: attention.cu:142")
    assert "against attention.cu:152" in message and "__syncthreads() missing" in message


def test_source_lines_are_quoted():
    if not SOURCE.exists():
        return  # the handout has no reference file to quote from
    (message,) = messages("norowguard-memcheck", TENSORS["norowguard"])
    assert "a_tile[r][kk]" in message


def test_a_report_cut_short_or_doubled_is_not_complete():
    text = (DATA / "clean-memcheck.log").read_text()
    assert not sanitize.parse(text.replace("ERROR SUMMARY: 0 errors", "")).complete  # killed before its summary
    assert not sanitize.parse(text + text).complete  # a forged summary beside the real one


def test_an_allocation_the_checks_do_not_know_is_described_by_its_size():
    finding = report("norowguard-memcheck").findings[0]
    assert sanitize.name_address(finding, []) == "4 bytes right after the end of an allocation of 24120 bytes " \
                                                 "the binding made"


def test_task4_findings_name_the_kernel_and_the_copy():
    lines = {}
    race = {f.key(): f for f in report("task4-nowaitv-racecheck").findings}
    first = sanitize.finding_message(next(iter(race.values())), lines, [], lambda k: "Task 4, steps 1-6")
    assert first.startswith("shared-memory race in flash_attention_kernel: an asynchronous copy (cp.async)")
    assert "attention.cu:341" in first and "__pipeline_wait_prior" in first
    oob = report("task4-norowguard-memcheck")
    assert oob.complete and oob.errors == 256
    out = [("q", (1, 2, 65, 64), 0, 1), ("out", (1, 2, 65, 64), 0x7f7504818600, 33280)]
    message = sanitize.finding_message(oob.findings[0], lines, out, lambda k: "Task 4, steps 1-6")
    assert message.startswith("out-of-bounds write of global memory in flash_attention_kernel at attention.cu:373")
    assert "16 bytes right after the end of `out` (1 x 2 x 65 x 64) (README, Task 4, steps 1-6)" in message


def test_a_kernel_is_named_without_its_templates_or_its_anonymous_namespace():
    assert sanitize._function("void flash_attention_kernel<(int)64, (bool)1>(const float *, int)") == \
        "flash_attention_kernel"
    assert sanitize._function("void (anonymous namespace)::decode_kernel<__nv_bfloat16, (int)8, (int)16, (int)1>"
                              "(const T1 *, const T1 *, int)") == "decode_kernel"
    assert sanitize._function("void <unnamed>::attend_rows<float>(int)") == "attend_rows"


def test_an_access_in_a_device_library_helper_names_the_students_call():
    """libraryframe: a kernel (inl.cu) calls a helper of a header (helpers.cuh, first_position as in the kit's
    device/decode.cuh) with b one past the end of pos; recorded on an H200 with --show-backtrace device, which
    adds the inlined caller's frame."""
    r = report("libraryframe-memcheck")
    (finding,) = r.findings
    assert finding.kernel == "first_position" and finding.where == ["helpers.cuh:3"]
    assert finding.called_from == "update_kernel at inl.cu:8"
    lines = {"helpers.cuh": ["", "__device__ int first_position(...) {", "  const int p = pos[b];"],
             "inl.cu": [""] * 7 + ["  const int p = first_position(pos, b, 1, 100);"]}
    pos = [("pos", (4,), 0x7efb6e800000, 16)]
    message = sanitize.finding_message(finding, lines, pos, lambda k: "Task 5, step 1" if k == "first_position" else None)
    assert message == ("out-of-bounds read of global memory in first_position at helpers.cuh:3 `const int p = pos[b];` "
                       "(the device library's, given), called from update_kernel at inl.cu:8 "
                       "`const int p = first_position(pos, b, 1, 100);`: 4 bytes right after the end of `pos` (4) "
                       "(README, Task 5, step 1)"), message


def test_a_frame_line_is_never_read_as_the_access_itself():
    # "float *" holds "at ": read with the access's pattern, the frame would name a function "*"
    block = ["Invalid __global__ read of size 4 bytes", "at k(const float *)+0x10 in a.cu:3",
             "Device Frame: outer(const float *, float *)+0x50 in a.cu:9"]
    finding = sanitize._finding(block)
    assert finding.kernel == "k" and finding.where == ["a.cu:3"] and finding.called_from == ""
