"""harness.profile: Nsight Compute's report cut down to what a student acts on, read from a recorded report."""

from harness.profile import NCU_ARGS, parse_ncu, summary
from tests.conftest import REPO

RECORDED = (REPO / "tests/data/ncu/task4_h200.txt").read_text()


def test_a_recorded_report_becomes_a_short_summary():
    (launch,) = parse_ncu(RECORDED)
    assert launch.kernel == "flash_attention_kernel<128>" and launch.grid == "(256, 32, 1)"
    assert launch.get("Registers Per Thread") == 254 and launch.get("Elapsed Cycles") == 108_686_628
    assert launch.get("Memory Throughput", "GPU Speed Of Light Throughput") == 48.97  # not the GB/s of another table
    text = "\n".join(summary(launch))
    for words in ["compute (SM) 71.69% of peak, memory 48.97% of peak (DRAM 10.16%)",
                  "issue slots busy 71.69%",
                  "8 warps per SM resident, 8 possible; blocks per SM limited to 1 by registers and shared memory "
                  "(254 registers per thread, 202.75 KB of dynamic shared memory per block)",
                  "0.38  dispatch stall", "0.25  short scoreboard",
                  "shared-memory stores: 134 M warp instructions, 134 M bank conflicts (1 extra pass per instruction)",
                  "fixes the SM clock at 1.5 GHz"]:
        assert words in text, (words, text)
    assert "  selected" not in text and len(summary(launch)) <= 14


def test_what_a_report_lacks_is_left_out():
    (launch,) = parse_ncu(RECORDED.split("Section: Command line profiler metrics")[0])  # no stall metrics
    text = "\n".join(summary(launch))
    assert "waited per instruction" not in text and "bank conflicts" not in text and "occupancy" in text
    assert parse_ncu("no kernel here\n    Duration   ms   3.0\n") == []


def test_the_ncu_command_asks_for_what_the_summary_reads():
    asked = " ".join(NCU_ARGS)
    assert "--section Occupancy" in asked and "stalled_" in asked and "bank_conflicts" in asked


def test_byte_counts_are_read_in_the_unit_ncu_gives():
    header = RECORDED.splitlines()[5]  # the kernel's line
    for unit, value, expected in (("Gbyte", "34.90", "DRAM read: 34.9 GB"), ("Mbyte", "512.00", "DRAM read: 0.512 GB"),
                                  ("", "1,000,000", "DRAM read: 0.001 GB")):
        report = f"{header}\n    Section: Command line profiler metrics\n    dram__bytes_read.sum   {unit}   {value}\n"
        assert expected in "\n".join(summary(parse_ncu(report)[0]))


def test_at_the_memory_or_compute_bound_what_does_not_limit_the_kernel_is_left_out():
    (launch,) = parse_ncu(RECORDED)
    key = next(k for k in launch.metrics if k[1] == "Memory Throughput" and k[0] == "GPU Speed Of Light Throughput")
    launch.metrics[key] = (launch.metrics[key][0], 92.0)  # busy L1 (shared memory) is not DRAM: still said
    assert "bank conflicts (" in "\n".join(summary(launch)) and "memory bound" not in "\n".join(summary(launch))
    key = next(k for k in launch.metrics if k[1] == "DRAM Throughput")
    launch.metrics[key] = (launch.metrics[key][0], 92.0)  # a decode at 92% of DRAM peak
    text = "\n".join(summary(launch))
    assert "at the memory bound (DRAM 92% >= 80% of peak)" in text and "DRAM read" in text
    assert "bank conflicts (" not in text and "issue slots busy" not in text
    (launch,) = parse_ncu(RECORDED)
    key = next(k for k in launch.metrics if k[1] == "Compute (SM) Throughput")
    launch.metrics[key] = (launch.metrics[key][0], 85.0)
    text = "\n".join(summary(launch))
    assert "at the compute bound (SM 85% >= 80% of peak)" in text and "DRAM read" not in text
    assert "bank conflicts (" in text and "issue slots busy" in text


def test_a_kernel_of_an_anonymous_namespace_is_read_too():
    line = ("  void (anonymous namespace)::flash_attention_half_kernel<__nv_bfloat16, 128, 64, 8, true>(const T1 *, int) "
            "(256, 16, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0")
    launches = parse_ncu(line)
    assert [(l.kernel, l.grid, l.block) for l in launches] == [
        ("flash_attention_half_kernel<__nv_bfloat16, 128, 64, 8, true>", "(256, 16, 1)", "(256, 1, 1)")]
