"""The CUDA tasks' kernels as registered PyTorch operators (common/csrc/operators.h, common/operators.py).

On a GPU: every operator of the reference builds passes torch.library.opcheck (its schema says what it writes,
its fake implementation traces, aot_autograd compiles it), gives what the pybind11 function gives, keeps the
binding's checks (a CPU tensor is told so by the binding, not by the dispatcher), and a function that calls one
compiles with torch.compile(fullgraph=True), which fails on any graph break. Without a GPU those skip.

Everywhere (CI has no GPU): each binding's schemas name its operators and the implementations it registers, and
the stand-in kernels, registered as operators with those schemas (tests/stand_in/), pass opcheck and run task 6's
model under torch.compile(fullgraph=True): the Python side of the traced path (the given wrappers, the fakes
TaskExtension registers) runs in CI, not first on a grader's GPU."""

import importlib
import math
import re

import pytest
import torch

from common.operators import OPERATORS, operators
from tests.conftest import REPO, needs_nvcc, needs_solution
from tests.stand_in import OPERATOR_CALLS, KERNELS, binding_schemas, stand_in, with_operators  # noqa: F401 (a fixture)



def on_a_gpu(test):
    return needs_nvcc(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


def reference(task):
    return importlib.import_module(f"task{task}.attention").extension(solution=True)


DEVICE = "cuda"  # where samples() makes its tensors: the stand-in tests set the CPU


def cuda(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


def samples(task, ext=None):
    """(operator name, args) for every operator of the task: small valid calls, partial tiles included. ext: the
    module whose forward_lse makes the backward's inputs (the reference's build by default)."""
    if task == 2:
        q, k, v = cuda(2, 3, 33, 40), cuda(2, 3, 50, 40), cuda(2, 3, 50, 40)
        return [("softmax", (cuda(17, 70), cuda(17, 70))),
                ("gemm_nt", (cuda(3, 33, 40), cuda(3, 50, 40), cuda(3, 33, 50))),
                ("gemm_nn", (cuda(3, 33, 50), cuda(3, 50, 40), cuda(3, 33, 40))),
                ("attention", (q, k, v, torch.empty_like(q), True, 1 / math.sqrt(40)))]
    if task == 4:
        q, k, v = cuda(2, 4, 33, 64), cuda(2, 2, 70, 64), cuda(2, 2, 70, 64)
        half = [t.bfloat16() for t in (q, k, v)]
        out, lse = torch.empty_like(q), torch.empty(2, 4, 33, device=DEVICE)
        (ext or reference(4)).forward_lse(q, k, v, out, lse, True, 0.125)
        key_start = torch.tensor([0, 5], device=DEVICE, dtype=torch.int32)
        square = (cuda(2, 4, 40, 64), cuda(2, 2, 40, 64), cuda(2, 2, 40, 64))  # documents need seq_q == seq_k
        cu_seqlens = torch.tensor([0, 13, 40], device=DEVICE, dtype=torch.int32)
        return [("forward", (q, k, v, torch.empty_like(q), True, 0.125, key_start)),
                ("forward_masks", (*square, torch.empty_like(square[0]), True, 0.125, key_start, 20, 1.5, cu_seqlens)),
                ("forward_half", (*half, torch.empty_like(half[0]), False, 0.125, None)),
                ("forward_hopper", (*half, torch.empty_like(half[0]), True, 0.125, key_start)),
                ("forward_lse", (q, k, v, torch.empty_like(q), torch.empty_like(lse), True, 0.125)),
                ("backward", (q, k, v, out, cuda(2, 4, 33, 64), lse, torch.empty_like(q), torch.empty_like(k),
                              torch.empty_like(v), True, 0.125))]
    batch, kv_heads, max_seq, d = 2, 2, 40, 64
    caches = [cuda(batch, kv_heads, max_seq, d) for _ in range(2)]
    half_caches = [c.bfloat16() for c in caches]
    q = cuda(batch, 4, 1, d)
    pos = torch.tensor([3, 10], device=DEVICE, dtype=torch.int32)
    length = pos + 1
    pages = [cuda(6, kv_heads, 16, d) for _ in range(2)]
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], device=DEVICE, dtype=torch.int32)
    return [("update_cache", (cuda(batch, kv_heads, 1, d), cuda(batch, kv_heads, 1, d), *caches, pos)),
            ("update_cache_half", (*(cuda(batch, kv_heads, 1, d).bfloat16() for _ in range(2)), *half_caches, pos)),
            ("decode", (q, *caches, torch.empty_like(q), length, 0.125, 0, None)),
            ("decode_half", (q.bfloat16(), *half_caches, torch.empty_like(q.bfloat16()), length, 0.125, 2, None)),
            ("update_cache_paged", (cuda(batch, kv_heads, 1, d), cuda(batch, kv_heads, 1, d), *pages, table, pos)),
            ("decode_paged", (q, *pages, torch.empty_like(q), table, length, 0.125, 0, None)),
            ("update_cache_paged_half", (*(cuda(batch, kv_heads, 1, d).bfloat16() for _ in range(2)),
                                         *(p.bfloat16() for p in pages), table, pos)),
            ("decode_paged_half", (q.bfloat16(), *(p.bfloat16() for p in pages), torch.empty_like(q.bfloat16()),
                                   table, length, 0.125, 2, None)),
            ("linear", (cuda(3, 64), cuda(96, 64), torch.empty(3, 96, device=DEVICE)))]


@on_a_gpu
@needs_solution(4)
@pytest.mark.parametrize("task", sorted(OPERATORS))
def test_every_operator_passes_opcheck_and_gives_what_the_module_gives(task):
    ext = reference(task)
    check_operators(ext, operators(ext), samples(task))


def check_operators(ext, ops, calls):
    """opcheck on each call, and the operator writes what the module's function writes. On the CPU the stand-in's
    operator calls that very function, so there the second part shows only that the call gets through; on a GPU
    the two are the binding's two registrations of one C++ function."""
    task = int(ext.__name__[4])
    assert sorted(name for name, _ in calls) == sorted(OPERATORS[task]), "a registered operator is not tested"
    if DEVICE == "cuda" and torch.cuda.get_device_capability() != (9, 0):  # it runs on Hopper alone
        calls = [(name, args) for name, args in calls if name != "forward_hopper"]
    for name, args in calls:
        torch.library.opcheck(getattr(ops, name).default, args)
        # the operator and the module's function write the same values (a copy of what each writes)
        written = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and
                   getattr(ops, name).default._schema.arguments[i].alias_info is not None]
        assert written, name
        by_op = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        by_module = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        getattr(ops, name)(*by_op)
        getattr(ext, name)(*by_module)
        for i in written:
            assert torch.equal(by_op[i], by_module[i]), (name, i)


@on_a_gpu
@needs_solution(4)
def test_the_operators_keep_the_bindings_checks():
    ops = operators(reference(4))
    q = torch.randn(1, 2, 8, 64)  # on the CPU: the binding says so, not the dispatcher
    with pytest.raises(RuntimeError, match="q must be a CUDA tensor"):
        ops.forward(q, q, q, torch.empty_like(q), False, 0.125)
    q = cuda(1, 2, 8, 64)
    with pytest.raises(RuntimeError, match="out must have q's shape"):
        ops.forward(q, q, q, cuda(1, 2, 7, 64), False, 0.125)


@on_a_gpu
@needs_solution(4)
def test_a_function_that_calls_the_operators_compiles_without_a_graph_break():
    ops4, ops5 = operators(reference(4)), operators(reference(5))

    def prefill_then_decode(q, k, v, q_new, k_cache, v_cache, length):
        out = torch.empty_like(q)
        ops4.forward(q, k, v, out, True, 0.125)
        step = torch.empty_like(q_new)
        ops5.decode(q_new, k_cache, v_cache, step, length, 0.125)
        return out * 2, step + 1  # PyTorch's own operations around them, in the same graph

    q, k, v = cuda(2, 4, 40, 64), cuda(2, 4, 40, 64), cuda(2, 4, 40, 64)
    q_new, caches = cuda(2, 4, 1, 64), [cuda(2, 4, 64, 64) for _ in range(2)]
    length = torch.tensor([40, 17], device=DEVICE, dtype=torch.int32)
    eager = prefill_then_decode(q, k, v, q_new, *caches, length)
    torch._dynamo.reset()
    compiled = torch.compile(prefill_then_decode, fullgraph=True)(q, k, v, q_new, *caches, length)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


@on_a_gpu
@needs_solution(6)
def test_task6s_decode_step_on_the_kernels_compiles_without_a_graph_break_and_replays_as_a_cuda_graph():
    """The model of task 6 with the reference's kernels: decode steps under torch.compile(fullgraph=True) give the
    eager steps' logits, called directly and captured as a CUDA graph (task6/model.py's DecodeGraph over the
    compiled model: the positions live on the GPU, so each replay writes and reads the next position). The given
    wrappers hand the compiler the operators (common/operators.py's function); eager calls stay the pybind11
    functions."""
    from task5.attention import built_kernels
    from task6.model import Config, DecodeGraph, SmallLM

    attention = importlib.import_module("task6.solution.attention").CachedAttention
    config = Config(vocab=256, hidden=256, heads=4, layers=2, mlp=1024, max_seq=64, kv_heads=2)
    model = SmallLM(config, attention, built_kernels(solution=True), device="cuda", seed=0)
    prompt = torch.randint(0, 256, (2, 9), device="cuda")
    tokens = torch.randint(0, 256, (3, 2, 1), device="cuda")
    eager_cache, compiled_cache, graph_cache = model.new_cache(2), model.new_cache(2), model.new_cache(2)
    torch._dynamo.reset()
    # dynamic=False: the step reads the cache's length, a Python int, so each new length is a new compile; made
    # dynamic after the second, PyTorch 2.11's inductor wrote a graph that returns an undefined size (NameError
    # 's16', on an H200). Captured, the step never runs its Python again, so one compile serves every replay.
    step = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        for cache in (eager_cache, compiled_cache, graph_cache):
            model(prompt, cache, last=True)  # the prompt, eager
        graph = DecodeGraph(step, graph_cache)  # its warm-up and its capture: the compiled step, at the same length
        for i, token in enumerate(tokens):
            expected = model(token, eager_cache, last=True)
            if i == 0:  # the compiled step called as it is, at the length it was compiled for
                torch.testing.assert_close(step(token, compiled_cache, last=True), expected, rtol=0, atol=1e-5)
            torch.testing.assert_close(graph(token).clone(), expected, rtol=0, atol=1e-5)


# -- everywhere: the schemas, and the stand-in kernels as operators -----------------------------------------------

@pytest.mark.parametrize("task", sorted(OPERATORS))
def test_each_binding_registers_the_operators_common_operators_lists(task):
    """The schemas are in the binding's source, the list the wrappers and fakes use in common/operators.py: the
    two must name the same functions, each a function of the pybind11 module too, each implemented for CUDA and
    CPU, and each writing (a Tensor(x!) argument) and returning nothing (the fake computes nothing)."""
    source = (REPO / f"task{task}" / "binding.cpp").read_text()
    schemas = binding_schemas(task)
    assert sorted(schemas) == sorted(OPERATORS[task])
    module_functions = set(re.findall(r'm\.def\(\s*"(\w+)"', source.split("KIT_OPERATORS(m)")[0]))
    implemented = set(re.findall(r'm\.impl\("(\w+)"', source))
    for name, schema in schemas.items():
        assert name in module_functions and name in implemented, name
        assert re.search(r"Tensor\([a-z]!\)", schema) and schema.endswith("-> ()"), schema
    assert "KIT_OPERATOR_IMPLS(register_impls)" in source  # for CUDA and CPU tensors (common/csrc/operators.h)


@pytest.mark.parametrize("task", sorted(OPERATORS))
def test_the_stand_in_kernels_as_operators_pass_opcheck(task, monkeypatch):
    """The binding's schemas on the stand-in kernels (CPU): opcheck runs the schema's alias annotations against
    what each function writes, and common/operators.py's fakes through tracing."""
    monkeypatch.setitem(globals(), "DEVICE", "cpu")
    ext = with_operators(KERNELS[task](), task, solution=True)
    check_operators(ext, operators(ext), samples(task, ext))


@needs_solution(6)
def test_task6s_decode_step_on_the_stand_in_kernels_compiles_without_a_graph_break(stand_in, monkeypatch):
    """Task 6's model, its kernels the stand-ins registered as operators (CPU): one decode step under
    torch.compile(fullgraph=True) gives the eager step's logits. The given wrappers hand the compiler the operators
    (common/operators.py's function) and TaskExtension registered their fakes when it loaded them."""
    from task5.attention import built_kernels
    from task6.model import Config, SmallLM

    attention = importlib.import_module("task6.solution.attention").CachedAttention
    config = Config(vocab=64, hidden=64, heads=4, layers=2, mlp=128, max_seq=32, kv_heads=2)
    model = SmallLM(config, attention, built_kernels(solution=True), device="cpu", seed=0)
    assert stand_in.loads == [(4, True, None), (5, True, None)]
    prompt, token = torch.randint(0, 64, (2, 9)), torch.randint(0, 64, (2, 1))
    eager_cache, compiled_cache = model.new_cache(2), model.new_cache(2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the compiler would save a real GPU's RNG state
    torch._dynamo.reset()
    graphs = []

    def keep_the_graph(graph, example_inputs):  # a backend that runs the graph as traced: no C++ compiler needed
        graphs.append(graph)
        return graph.forward

    step = torch.compile(model, fullgraph=True, backend=keep_the_graph)
    OPERATOR_CALLS.clear()
    with torch.no_grad():
        for cache in (eager_cache, compiled_cache):
            model(prompt, cache, last=True)
        expected = model(token, eager_cache, last=True)
        assert not OPERATOR_CALLS, f"eager calls went through the operators: {OPERATOR_CALLS}"
        got = step(token, compiled_cache, last=True)
    assert OPERATOR_CALLS.get("task5_stand_in_solution.decode"), OPERATOR_CALLS  # the compiled step's graph ran them
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    called = {str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"}
    # the step's kernels are in the one graph, as operators (a pybind11 call would have broken it)
    assert {"task5_stand_in_solution.update_cache", "task5_stand_in_solution.decode"} <= called, called


def test_the_wrappers_call_an_operator_only_while_compiling_and_only_an_operator(monkeypatch):
    """common.operators.function: eager calls (every check and timing of the tests) stay the module's functions;
    while torch.compile traces, a registered operator of a build whose fakes are registered; a function that is no
    operator (splits_for), or a build without fakes, stays the module's."""
    from common import operators as ops_module

    ext = with_operators(KERNELS[5](), 5, solution=True)
    operators(ext)  # as TaskExtension does on loading a build: the fakes
    assert ops_module.function(ext, "decode") == ext.decode
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert ops_module.function(ext, "decode") is torch.ops.task5_stand_in_solution.decode
    assert ops_module.function(ext, "splits_for") == ext.splits_for
    monkeypatch.setattr(ops_module, "_faked", set())  # a build loaded without its fakes
    assert ops_module.function(ext, "decode") == ext.decode
