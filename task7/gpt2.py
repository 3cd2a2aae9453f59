"""Task 7: Hugging Face GPT-2 with your kernels inside, through the library's own extension point.

Given: not graded; edits here are not submitted.

transformers lets a model's attention be any function registered under a name
(`AttentionInterface`). GPT-2 projects q, k and v, appends k and v to its KV cache, then calls
the function with (module, query, key, value, attention_mask, scaling=..., dropout=...), and
expects (output, weights) back. `use_kernels` registers yours (task7/attention.py) under NAME
and switches a model to it; GPT-2's own forward pass is untouched.

It registers a mask function for NAME as well, the one PyTorch's SDPA uses: transformers hands
a name without one no mask at all, padding included, so a padded batch would come out silently
wrong. With it, `attention_mask` is None when causality alone decides (no padding) and a
boolean (batch, 1, q_len, kv_len) mask otherwise.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

NAME = "course_kernels"
# A GPT-2 small enough for any CPU, and GPT-2's own size (124M parameters, head_dim 64).
SMALL = dict(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=256, bos_token_id=0, eos_token_id=0)
GPT2_SIZE = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
DEFAULT_PROMPT = "The attention mechanism lets a language model"


def use_kernels(model, attention, kernels):
    """Route `model`'s attention through `attention(module, q, k, v, mask, ..., kernels=kernels)`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, functools.partial(attention, kernels=kernels))
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return model


def hides_only_the_future(mask: torch.Tensor, q_len: int, kv_len: int) -> bool:
    """Whether a (batch, 1, q_len, kv_len) mask (boolean: True = attend; or additive) is plain causal attention."""
    allowed = mask if mask.dtype == torch.bool else mask == 0
    causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=mask.device).tril(kv_len - q_len)
    return bool((allowed == causal).all())


def greedy(model, ids: torch.Tensor, new_tokens: int, **options):
    """model.generate: exactly `new_tokens` greedy tokens after the unpadded prompts ids (batch, n).

    The mask says no prompt token is padding: GPT-2 pads with its end-of-text token, so without
    it transformers cannot tell, and warns.
    """
    ids = ids.to(model.device)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=model.config.eos_token_id,
                              **options)


def random_gpt2(config: dict, seed: int):
    """A GPT-2 with random weights from a seed (the tests' model: they never download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT2LMHeadModel(GPT2Config(**config)).eval()


def from_state(config: dict, state: dict, device):
    """A GPT-2 of `config` holding the weights `state` (what the checks send the worker)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(**config))
    model.load_state_dict(state)
    return model.to(device).eval()


class WeightsMissing(Exception):
    """No GPT-2 weights could be found or fetched; the message says what to do."""


def pretrained(path: str | None = None, download: bool = True):
    """(model, tokenizer) of GPT-2: from `path`, else the Hugging Face cache, else the usual download."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    where = path or "gpt2"
    if path and not Path(path).is_dir():
        raise WeightsMissing(f"--model {path}: no such folder (it should hold config.json and the weights)")
    tries = [True, False] if download and not path else [True]
    for local_only in tries:
        try:
            model = GPT2LMHeadModel.from_pretrained(where, local_files_only=local_only).eval()
            return model, AutoTokenizer.from_pretrained(where, local_files_only=local_only)
        except OSError as err:
            last = err
    raise WeightsMissing(
        f"GPT-2's weights are not here ({type(last).__name__}: {str(last).splitlines()[0]}). They are not in the "
        "Hugging Face cache and could not be downloaded (no network?). On a machine with network run\n"
        "    python -c \"from transformers import AutoTokenizer, GPT2LMHeadModel; "
        "GPT2LMHeadModel.from_pretrained('gpt2'); AutoTokenizer.from_pretrained('gpt2')\"\n"
        "to fill the cache (about 550 MB in ~/.cache/huggingface), or save them with save_pretrained(FOLDER), "
        "copy the folder here and pass --model FOLDER.")
