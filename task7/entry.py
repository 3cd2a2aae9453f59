"""Task 7's entry points: how the checks call GPT-2 with your attention (task7/attention.py).

Given: not graded; edits here are not submitted. This runs in the worker process: it makes a
GPT-2 or a Llama from the configuration and weights the checks send, routes its attention through your
`kernel_attention` (task7/gpt2.py's `use_kernels`), with PyTorch in place of the kernels on
the CPU and your Task 4 and Task 5 kernels on the GPU, and generates greedily.
"""

from types import SimpleNamespace

import torch

from common.torch_kernels import PyTorchKernels
from common.student_module import load_student_module
from task5.attention import built_kernels
from task7 import gpt2

student = load_student_module("task7.attention")
_model = _kernels = None


def make_model(config: dict, state: dict, device: str, dtype: str = "float32") -> None:
    """dtype "bfloat16" or "float16": the whole model in that type (on the GPU, your kernels' optional 16-bit parts:
    Task 4's steps 8-11 and Task 5's step 6)."""
    global _model, _kernels
    _model = None
    _kernels = PyTorchKernels() if device == "cpu" else built_kernels()
    model = gpt2.from_state(config, state, device).to(getattr(torch, dtype))
    _model = gpt2.use_kernels(model, student.kernel_attention, _kernels)


def generate(ids, new_tokens, attention_mask=None):
    """Greedy generation after the prompts ids (batch, n), padded on the left where attention_mask (batch, n)
    is 0: [tokens (batch, new_tokens), logits (batch, new_tokens, vocab)]."""
    out = gpt2.greedy(_model, ids, new_tokens, attention_mask, return_dict_in_generate=True, output_logits=True)
    tokens = out.sequences[:, ids.shape[1]:]
    return [tokens.cpu(), torch.stack(out.logits, dim=1).float().cpu()]


def logits(ids, attention_mask=None):
    """The model's logits over the whole of ids (batch, n) in one forward pass (a prompt: teacher forcing), padded on
    the left where attention_mask (batch, n) is 0: (batch, n, vocab) float32."""
    mask = None if attention_mask is None else attention_mask.to(_model.device)
    with torch.no_grad():
        return _model(input_ids=ids.to(_model.device), attention_mask=mask).logits.float().cpu()


def generate_only(ids, new_tokens):
    """The same generation, nothing returned, once the GPU is done: what the checks time."""
    gpt2.greedy(_model, ids, new_tokens)
    if _model.device.type == "cuda":
        torch.cuda.synchronize()


def attend(query, key, value, attention_mask, scaling, dropout, extra=None):
    """Your function on its own, as GPT-2's attention module would call it (the checks' bad inputs); extra: the
    keyword arguments other models add (Gemma 2's softcap, Mistral's sliding_window)."""
    module = SimpleNamespace(is_causal=True, scaling=key.shape[-1] ** -0.5, training=False)
    device = _model.device if _model is not None else "cpu"
    out, _ = student.kernel_attention(module, query.to(device), key.to(device), value.to(device),
                                      None if attention_mask is None else attention_mask.to(device),
                                      scaling=scaling, dropout=dropout, kernels=_kernels or PyTorchKernels(),
                                      **(extra or {}))
    return out.cpu()
