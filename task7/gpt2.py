"""Task 7: Hugging Face GPT-2 (and a Llama-family model) with your kernels inside, through the library's own
extension point.

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
# Llama-family models (Llama 3, SmolLM, Qwen, Mistral: rotary positions, SwiGLU, grouped-query
# attention, so key and value arrive with fewer heads than the query). A small one, and one with
# Llama 3.2 1B's attention (32 query heads, 8 key/value heads, head_dim 64) in 2 layers, with a smaller MLP
# and vocabulary (80M parameters: the checks send the weights to the worker).
LLAMA_SMALL = dict(model_type="llama", hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                   num_hidden_layers=2, intermediate_size=256, vocab_size=1000, max_position_embeddings=256,
                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
LLAMA_1B_ATTENTION = dict(model_type="llama", hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                          num_hidden_layers=2, intermediate_size=2048, vocab_size=8192,
                          max_position_embeddings=2048, rope_theta=500000.0, bos_token_id=0, eos_token_id=0,
                          pad_token_id=0)
# Models whose attention masks more than the future (step 4, optional): a small Gemma 2 (its local layers a sliding
# window of 8 keys, every other layer global; scores soft-capped at 1.0, with weights large enough that the cap
# binds: the logits move by about 6 without it) and a Mistral-style model with a sliding window of 8 on every layer.
GEMMA2_SMALL = dict(model_type="gemma2", hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    num_hidden_layers=2, intermediate_size=256, vocab_size=1000, max_position_embeddings=256,
                    sliding_window=8, attn_logit_softcapping=1.0, query_pre_attn_scalar=32, initializer_range=0.2,
                    bos_token_id=0, eos_token_id=0, pad_token_id=0)
MISTRAL_SMALL = dict(model_type="mistral", hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                     num_hidden_layers=2, intermediate_size=256, vocab_size=1000, max_position_embeddings=256,
                     sliding_window=8, bos_token_id=0, eos_token_id=0, pad_token_id=0)
# A small public Llama-family checkpoint with its real weights (9 query heads over 3 key/value
# heads), for python -m task7.inference --model; fetched as the README says, never by the tests.
LLAMA_CHECKPOINT = "HuggingFaceTB/SmolLM2-135M"
DEFAULT_PROMPT = "The attention mechanism lets a language model"


def use_kernels(model, attention, kernels):
    """Route `model`'s attention through `attention(module, q, k, v, mask, ..., kernels=kernels)`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, functools.partial(attention, kernels=kernels))
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return model


def key_start_of(mask: torch.Tensor, q_len: int, kv_len: int, window_left: int | None = None) -> torch.Tensor | None:
    """Each sequence's first real key, int32 (batch,) on the mask's device, from a (batch, 1, q_len, kv_len)
    mask (boolean: True = attend; or additive) of causal attention over a batch padded on the left, as
    `generate` pads prompts of different lengths; None when no sequence is padded. The queries are the last
    q_len positions; those before a sequence's first real key are padding and see no key at all.
    window_left: a sliding window's (sliding_window - 1), whose mask also hides the keys before each query's
    window; a new token's window may start past the padding, and then its first key is the window's.
    Any other mask raises ValueError: the kernels take key ranges, not masks."""
    allowed = (mask if mask.dtype == torch.bool else mask == 0)[:, 0]
    batch = allowed.shape[0]
    allowed = allowed.expand(batch, q_len, kv_len)
    # the earliest key any query sees (the padding's end: the first real query sees its own key first)
    none = torch.full((batch, q_len), kv_len, dtype=torch.long, device=mask.device)  # a row that sees no key
    first = torch.where(allowed.any(dim=-1), allowed.int().argmax(dim=-1), none).min(dim=-1).values
    keys = torch.arange(kv_len, device=mask.device)
    expected = torch.ones(q_len, kv_len, dtype=torch.bool, device=mask.device).tril(kv_len - q_len)
    if window_left is not None:
        expected = expected & ~torch.ones(q_len, kv_len, dtype=torch.bool, device=mask.device).tril(
            kv_len - q_len - window_left - 1)
    if not bool((allowed == (expected & (keys >= first[:, None, None]))).all()):
        window = "" if window_left is None else (
            f", with a sliding window of window_left + 1 = {window_left + 1} keys (transformers' sliding_window is "
            f"window_left + 1: README, Task 7, step 4)")
        raise ValueError(f"attention_mask is not causal attention over a batch padded on the left{window} (it hides "
                         "keys in the middle or at the end of a sequence, or shows a query its future): the kernels "
                         "take each sequence's first real key, not a mask")
    return None if bool((first == 0).all()) else first.to(torch.int32)


def greedy(model, ids: torch.Tensor, new_tokens: int, attention_mask: torch.Tensor | None = None, **options):
    """model.generate: exactly `new_tokens` greedy tokens after the prompts ids (batch, n).

    attention_mask (batch, n), 1 for a real token and 0 for padding: prompts of different lengths
    padded on the left (`left_pad`). None: no prompt token is padding. The mask is always passed:
    GPT-2 pads with its end-of-text token, so without it transformers cannot tell, and warns.
    """
    ids = ids.to(model.device)
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask.to(model.device)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=model.config.eos_token_id,
                              **options)


def left_pad(prompts: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask), both (batch, longest): token-id prompts of different lengths padded on the left."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, longest - len(p):] = p
        mask[b, longest - len(p):] = 1
    return ids, mask


def _model_of(config: dict):
    """An untrained model of `config`: GPT-2 unless its model_type says otherwise ("llama")."""
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = dict(config)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(settings.pop("model_type", "gpt2"), **settings))


def random_model(config: dict, seed: int):
    """A GPT-2 or Llama with random weights from a seed (the tests' models: they never download)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _model_of(config).eval()


def from_state(config: dict, state: dict, device):
    """A model of `config` (GPT-2 unless its model_type says otherwise) holding the weights `state` (what the
    checks send the worker)."""
    model = _model_of(config)
    model.load_state_dict(state)
    return model.to(device).eval()


class WeightsMissing(Exception):
    """No GPT-2 weights could be found or fetched; the message says what to do."""


def _in_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def pretrained(path: str | None = None, download: bool = True, name: str = "gpt2"):
    """(model, tokenizer): from `path`, else `name` (GPT-2, or a Llama-family checkpoint such as
    LLAMA_CHECKPOINT) from the Hugging Face cache, else the usual download."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = path or name
    if path and not Path(path).is_dir():
        raise WeightsMissing(f"--model {path}: no such folder (it should hold config.json and the weights)")
    tries = [True, False] if download and not path else [True]
    if not path and not _in_cache(name):
        # transformers asks the hub about adapter files even with local_files_only on some versions,
        # retrying for about 25 s per model where there is no network: look in the cache ourselves
        tries = [False] if download else []
    last = FileNotFoundError(f"{name} is not in the Hugging Face cache")
    for local_only in tries:
        try:
            # float32 as the kernels take it (SmolLM2 is stored in bfloat16, which transformers would keep)
            model = AutoModelForCausalLM.from_pretrained(where, local_files_only=local_only, dtype=torch.float32).eval()
            return model, AutoTokenizer.from_pretrained(where, local_files_only=local_only)
        except (OSError, ValueError) as err:  # ValueError: a folder without a model's config.json
            last = err
    raise WeightsMissing(
        f"{where}'s weights are not here ({type(last).__name__}: {str(last).splitlines()[0]}). They are not in the "
        "Hugging Face cache and could not be downloaded (no network?). On a machine with network run\n"
        "    python -c \"from transformers import AutoTokenizer, AutoModelForCausalLM; "
        f"AutoModelForCausalLM.from_pretrained('{where}'); AutoTokenizer.from_pretrained('{where}')\"\n"
        "to fill the cache (~/.cache/huggingface: about 550 MB for gpt2, 270 MB for SmolLM2-135M), or save them "
        "with save_pretrained(FOLDER), copy the folder here and pass --model FOLDER.")
