"""Task 6's entry points: how the checks call the model with your attention (task6/attention.py).

Given: not graded; edits here are not submitted. This runs in the worker process: it makes
the model of task6/model.py with your CachedAttention in every layer, on the CPU with
PyTorchKernels in place of the kernels, or on the GPU with your Task 4 and Task 5 kernels,
and answers the checks (checks/task6/test.py) with logits and tokens.
"""

import torch

from common.torch_kernels import PyTorchKernels
from common.student_module import load_student_module
from task5.attention import built_kernels
from task6.model import Config, Decoder, SmallLM

student = load_student_module("task6.attention")
_model = _decoder = None


def make_model(config: dict, seed: int, device: str, dtype: str = "float32") -> None:
    """The model with your attention, its weights drawn from `seed` (the checks draw the same ones), in `dtype`:
    float32, or bfloat16 or float16 (the optional 16-bit part: your kernels' 16-bit versions run it)."""
    global _model, _decoder
    _model = _decoder = None
    if device == "cuda":
        torch.cuda.empty_cache()
    kernels = PyTorchKernels() if device == "cpu" else built_kernels()
    _model = SmallLM(Config(**config), student.CachedAttention, kernels, device=device, dtype=getattr(torch, dtype),
                     seed=seed)
    if device == "cuda":  # a decode step's products by the given kernel, which reads weights faster than cuBLAS
        _model.set_linear(kernels.linear, kernels.linear_max_rows())


def teacher_force(tokens, prompt_len, key_start=None, graph=False):
    """Prefill tokens[:, :prompt_len], then feed the rest one at a time: the logits of every position.
    key_start (batch,): the prompts are padded on the left, sequence b's first key_start[b] tokens.
    graph: the decode steps replayed from one captured as a CUDA graph (task6/model.py's DecodeGraph)."""
    tokens = tokens.to(_model.embed.weight.device)
    with torch.no_grad():
        decoder = Decoder(_model, graph=graph and prompt_len < tokens.shape[1])
        logits = [decoder.prefill(tokens[:, :prompt_len], key_start, last=False)]
        logits += [decoder.step(tokens[:, i:i + 1]).clone() for i in range(prompt_len, tokens.shape[1])]
        return torch.cat(logits, dim=1).float().cpu()  # a 16-bit model's too: the checks take float32


def feed(chunks, key_start=None):
    """A new cache, then each chunk of tokens in turn (the checks' bad inputs)."""
    with torch.no_grad():
        cache = _model.new_cache(chunks[0].shape[0], key_start)
        for chunk in chunks:
            _model(chunk.to(_model.embed.weight.device), cache)


def prefill(prompt, logits, graph=False):
    """The handout run's prompt: a new generation, and the last position's logits into logits[:, 0].

    graph: the decode steps that follow replay one step captured as a CUDA graph, captured in the first
    generation (untimed) and kept for the next ones (Decoder). On the GPU the checks own `logits` and see
    it written; CPU tensors come here as copies, so they go back.
    """
    global _decoder
    with torch.no_grad():
        if _decoder is None or _decoder.graph != graph:
            _decoder = None  # its cache goes before the next is made
            _decoder = Decoder(_model, graph)
        logits[:, 0] = _decoder.prefill(prompt)[:, 0]
    return _answer(logits)


def steps(tokens, logits):
    """Greedy decode steps: tokens[:, i] is the argmax of logits[:, i], and its logits go to logits[:, i + 1]."""
    with torch.no_grad():
        for i in range(tokens.shape[1]):
            token = logits[:, i].argmax(dim=-1, keepdim=True)
            tokens[:, i:i + 1] = token
            logits[:, i + 1] = _decoder.step(token)[:, 0]
    return _answer(tokens, logits)


def _answer(*written):
    """On the GPU, nothing once the work is done (the checks' clock stops at the answer); on the CPU, the copies."""
    if written[0].is_cuda:
        torch.cuda.synchronize()
        return None
    return list(written)
