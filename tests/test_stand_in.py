"""The stand-ins themselves (tests/stand_in/): the GPU they fake tells a model's device from a host tensor's, their
CUDA graphs replay as a GPU's do, and no run outside tests/ can reach them.
"""

from common.tasks import KIT_FOLDERS
from tests.conftest import REPO
from tests.stand_in import stand_in  # noqa: F401


def test_the_stand_in_gpu_tells_a_models_device_from_a_host_tensors():
    """`.to(model.device)` moves a host tensor to the (stand-in) GPU; `.to(host_tensor.device)` does not, as on a
    real GPU, where the bindings then refuse it."""
    import torch

    from tests.stand_in import CudaOnTheCpu

    on_host = lambda t: getattr(t, "on_host", False)  # noqa: E731
    with CudaOnTheCpu():
        model = torch.nn.Linear(2, 2, device="cuda")
        tokens, key_start = torch.zeros(2, dtype=torch.long), torch.tensor([1, 2], dtype=torch.int32)
        assert on_host(tokens) and on_host(key_start)
        assert not on_host(key_start.to(model.weight.device)) and not on_host(key_start.to(device=model.weight.device))
        assert on_host(key_start.to(tokens.device)) and on_host(key_start.to(torch.device("cpu")))
        assert not on_host(key_start.cuda()) and on_host(key_start.cuda().cpu())


def test_the_stand_in_cuda_graph_replays_as_a_gpu_does(stand_in):
    """A capture runs nothing for good; a replay reads memory anew but keeps a Python value as it was captured,
    and a stand-in kernel is one launch that reads its lengths from memory; reading a value back refuses."""
    import pytest
    import torch

    from task5.attention import extension
    from tests.stand_in import CudaOnTheCpu

    ext = extension(solution=True)
    with CudaOnTheCpu():
        cache, lengths = torch.zeros(1, 1, 8, 4, device="cuda"), torch.tensor([2], dtype=torch.int32, device="cuda")
        new, step = torch.ones(1, 1, 1, 4, device="cuda"), 5
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ext.update_cache(new * step, new, cache, cache.clone(), lengths)  # step: a Python int, kept as captured
            lengths.add_(1)
        assert lengths.tolist() == [2] and not cache.any()  # the capture wrote nothing for good
        step = 7
        for _ in range(2):
            graph.replay()
        assert lengths.tolist() == [4] and cache[0, 0, :, 0].tolist() == [0, 0, 5, 5, 0, 0, 0, 0]
        with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                int(lengths[0])


def test_a_kernel_in_another_thread_leaves_a_capture_and_the_clock_alone(stand_in):
    """A sanitizer pass runs the stand-in kernels in a thread beside the checks: while one of its kernels runs, a
    capture in the checks' thread still records theirs as launches, and their clock does not count its time."""
    import threading

    import torch

    from task5.attention import extension
    from tests.stand_in import CudaOnTheCpu
    from tests.stand_in import gpu

    inside, leave = threading.Event(), threading.Event()

    def a_long_kernel():
        gpu.CLOCK.ahead += 100.0  # its modelled time, on its own thread's clock
        inside.set()
        leave.wait(timeout=60)
    beside = threading.Thread(target=gpu.run_kernel, args=(a_long_kernel, (), {}))
    beside.start()
    try:
        assert inside.wait(timeout=60)
        before = gpu.CLOCK.perf_counter()
        ext = extension(solution=True)
        with CudaOnTheCpu():
            cache, lengths = torch.zeros(1, 1, 8, 4, device="cuda"), torch.tensor([2], dtype=torch.int32, device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                new = torch.ones(1, 1, 1, 4, device="cuda")
                ext.update_cache(new, new, cache, cache.clone(), lengths)
                lengths.add_(1)
            for _ in range(2):
                graph.replay()
            assert cache[0, 0, :, 0].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]  # each replay wrote at the length it read
        assert gpu.CLOCK.perf_counter() - before < 50.0
    finally:
        leave.set()
        beside.join(timeout=60)


def test_no_real_run_can_reach_the_stand_ins():
    """The stand-ins are monkeypatches made by this test suite's fixture: no code outside tests/ imports them."""
    names = ("tests.stand_in", "import stand_in", "CudaOnTheCpu", "InProcessWorker")
    found = [f"{path.relative_to(REPO)}" for folder in KIT_FOLDERS
             for path in (REPO / folder).rglob("*.py") if any(name in path.read_text() for name in names)]
    assert found == []
