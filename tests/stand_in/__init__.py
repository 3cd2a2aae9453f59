"""The CUDA tasks' whole grading flow on the CPU, with PyTorch standing in for the kernels and the GPU.

For the kit's own tests only. CI has no GPU, so a CUDA task's test stops at "needs a CUDA GPU"
and everything after its checks (the benchmarks, loading the reference, the estimate from the
calibration, the record's speed fields) would run for the first time on a grader's GPU. Here
that flow runs in the pytest process: `checks.taskN.test.main([...])` as the grader calls it, then the
record validated and scored as the grader does. Every stand-in is a monkeypatch made by
`stand_in()`, undone when the test ends: no flag, file or environment variable of a student's or
a grader's run leads here, and nothing the real run checks is changed.

What stands in for what:
- the GPU: `CudaOnTheCpu` makes every tensor asked for on "cuda" on the CPU; a tensor made for the
  host (`.cpu()`, or a factory without a CUDA device) is marked `on_host`, so the bindings' "must be
  a CUDA tensor" still refuses it, and `.cuda()` copies it; torch.cuda's availability, synchronize,
  events (a host clock), name and properties are those of a stand-in GPU with one SM; streams are
  one; CUDA graphs are `StandInGraph`, which records a capture and replays it as a GPU would (a
  Python value is kept as captured, memory is read anew, reading a value back refuses);
- its speed: a stand-in kernel's call lasts exactly the time its work takes at FLOPS_PER_S or
  BYTES_PER_S on harness/bench.py's clock (`StandInClock`, the host's clock with each call counted
  at that time instead of the CPU's), so its timings do not depend on how busy the machine is;
- the kernels: `Task2Kernels`, `Task4Kernels` and `Task5Kernels` make the bindings' checks with
  the bindings' messages, then compute in PyTorch; `common.build.load_extension` returns them,
  called as the real one is called (a call it would refuse is refused), so each task's
  `extension()` and `harness.bench.load_reference` run as they are;
- the worker: `InProcessWorker` runs taskN/entry.py in this process on the checks' own tensors
  (as a worker writes the checks' shared GPU memory), and its replies cross common/wire.py as a
  real worker's do; requests do not (no CUDA IPC handles here: tests/test_grader.py and the GPU
  tests cover the real worker);
- the operators: each stand-in module is also registered as its build's PyTorch operators
  (`with_operators`: the schemas read from taskN/binding.cpp's KIT_OPERATORS block, under the namespace
  taskN_stand_in_student or taskN_stand_in_solution), so TaskExtension registers their fakes as it does
  a real build's, and a function compiled with torch.compile runs the stand-ins through them;
- compute-sanitizer: a clean report for each tool (the pass's parsing is tested on real reports
  in tests/test_sanitize.py);
- sizes: the benchmarks' shapes are small, and the requests are sized for a CPU (the numbers
  are not the point; the flow that turns them into points is).

One module per job: gpu.py (the GPU, its graphs, clock and generators), kernels.py (the bindings' checks, a
student's Behaviour, task 2's kernels), task4.py and task5.py (their kernels), operators.py, worker.py, and
fixture.py (the `stand_in` fixture and its Harness). The names the tests use are here.
"""

from tests.stand_in.fixture import HIDDEN, KERNELS, SCORED, SMALL, SMALL_HIDDEN, Harness, failed, stand_in
from tests.stand_in.gpu import GPU_NAME, CudaOnTheCpu
from tests.stand_in.kernels import Behaviour, StandInKernels, Task2Kernels
from tests.stand_in.operators import OPERATOR_CALLS, binding_schemas, with_operators
from tests.stand_in.task4 import Task4Kernels
from tests.stand_in.task5 import Task5Kernels

__all__ = ["GPU_NAME", "HIDDEN", "KERNELS", "OPERATOR_CALLS", "SCORED", "SMALL", "SMALL_HIDDEN", "Behaviour",
           "CudaOnTheCpu", "Harness", "StandInKernels", "Task2Kernels", "Task4Kernels", "Task5Kernels", "binding_schemas",
           "failed", "stand_in", "with_operators"]
