"""Where a test's own process spends a grading (a device diagnostic for notes/grading-time.md, never in the kit).

`bash notes/issue55_device.sh P` installs it as a .pth hook of the Python that grades: each `python -m taskN.test`
process runs under cProfile and leaves taskN-PID.prof in $KITPROF_DIR; `python notes/kitprof.py DIR` prints, per
test, the cumulative seconds of the calls that make up its timed parts and its waits.
"""

import os
import sys

WATCHED = ("run_generation", "time_student", "time_here", "time_recompute", "same_type_logits", "check",
           "time_yours", "time_per_token", "check_training", "run_benchmarks", "time_against_task1",
           "copy_bandwidth_gbs", "matmul_tflops", "start", "handshake", "_take", "add_to_report", "run_pass",
           "take_kernels_built_ahead", "used_code_hung", "__init__", "train", "greedy", "time_case", "call",
           "check_teacher_forced", "check_half_case", "check_backward_case", "stop")


OPENED = ("run_generation", "result", "time_student", "time_yours", "time_per_token", "check_training",
          "run_benchmarks", "time_against_task1", "copy_bandwidth_gbs", "run_timing", "float_benchmarks",
          "timed_alone", "check_teacher_forced")


def install() -> None:
    argv = getattr(sys, "orig_argv", [])
    where = os.environ.get("KITPROF_DIR")
    if not where or "-m" not in argv:
        return
    module = argv[argv.index("-m") + 1] if argv.index("-m") + 1 < len(argv) else ""
    if not (module.startswith("task") and module.endswith(".test")):
        return
    import atexit
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    atexit.register(lambda: (profile.disable(),
                             profile.dump_stats(os.path.join(where, f"{module.split('.')[0]}-{os.getpid()}.prof"))))


def show(folder: str) -> None:
    import pstats

    for name in sorted(os.listdir(folder)):
        if not name.endswith(".prof"):
            continue
        stats = pstats.Stats(os.path.join(folder, name))
        rows = []
        for (path, line, function), (calls, _, _, cumulative, _) in stats.stats.items():
            if function in WATCHED and cumulative >= 1 and ("kit" in path or "task" in path or "harness" in path):
                rows.append((cumulative, calls, f"{os.path.relpath(path) if path.startswith('/') else path}:{line} "
                                                 f"{function}"))
        print(f"== {name}")
        for cumulative, calls, where in sorted(rows, reverse=True)[:40]:
            print(f"  {cumulative:8.1f} s {calls:5d}x  {where}")
        for function in OPENED:  # what each timed part's time goes to, one level down
            for key, (_, _, _, cumulative, callers) in stats.stats.items():
                if key[2] != function or cumulative < 1:
                    continue
                print(f"  -- {function} ({cumulative:.1f} s):")
                callees = [(value[4][key][3], callee) for callee, value in stats.stats.items() if key in value[4]]
                for _, callee in sorted(callees, reverse=True)[:12]:
                    spent = stats.stats[callee][4][key]  # (calls, ..., total, cumulative) from this caller
                    print(f"       {spent[3]:7.1f} s {spent[0]:5d}x  {os.path.basename(callee[0])}:{callee[1]} {callee[2]}")


if __name__ == "__main__":
    show(sys.argv[1])
