"""Task 7: your kernels as the attention of GPT-2 and of a Llama-family model, through transformers'
AttentionInterface.

The model (transformers' own code, untouched) projects q, k and v (Llama also rotates them:
RoPE), appends k and v to its KV cache and calls `kernel_attention` (registered by
task7/gpt2.py's `use_kernels`) with:
- query (batch, heads, q_len, head_dim): the new tokens, a transposed view (not contiguous);
- key, value (batch, kv_heads, kv_len, head_dim): every token so far, the cache included; a
  Llama-family model has fewer key/value heads than query heads (grouped-query attention), and
  the kernels read them as they are: never repeat them per query head;
- attention_mask: None when causality alone decides, else a boolean (batch, 1, q_len, kv_len)
  mask, True where a query may attend: a batch of prompts padded on the left makes one;
- scaling: the factor of q k^T (older transformers may pass none), dropout: 0 in eval mode.
It returns (output (batch, q_len, heads, head_dim), None): no attention weights, which a
fused kernel never holds. A prompt (q_len == kv_len) goes to task 4's kernel, each new token
(q_len == 1) to task 5's decode over the key and value handed in. `kernels` is the same
trio as in tasks 5 and 6 (attention, update_cache, decode), scale 1/sqrt(head_dim) built in.
"""

from __future__ import annotations

from task7.gpt2 import key_start_of


def kernel_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, *, kernels,
                     **kwargs):
    q_len, kv_len, head_dim = query.shape[2], key.shape[2], query.shape[3]
    # BEGIN SOLUTION "step 4: (optional, after steps 1-3) Gemma 2's softcap and a sliding_window as the kernels' window_left (sliding_window - 1); a new token's window as the last keys; no soft-capping decode"
    # Gemma 2 soft-caps its scores and Mistral's and Gemma's local layers see a sliding window (transformers: the
    # keys j > i - sliding_window): task 4's kernel takes both (steps 23-24); task 5's decode neither, so a new
    # token's window is the keys it covers, and its soft-capping is refused (a model run without either would give
    # wrong logits with no error)
    softcap = kwargs.get("softcap")
    window = kwargs.get("sliding_window")
    window_left = window - 1 if window is not None and window < kv_len else None
    if softcap and q_len != kv_len:
        raise ValueError(f"softcap = {softcap} for a new token: task 5's decode does not soft-cap the scores "
                         "(Gemma 2's attn_logit_softcapping); only a whole prompt runs with it (teacher forcing)")
    # SKELETON
    # if kwargs.get("softcap") or (kwargs.get("sliding_window") is not None and kwargs["sliding_window"] < kv_len):
    #     raise NotImplementedError("Gemma 2's softcap and Mistral's sliding_window: see README, Task 7, step 4 "
    #                               "(optional); until then, run such a model with its own attention")
    # softcap = window_left = None
    # END SOLUTION
    # BEGIN SOLUTION "step 1: the mask as each sequence's first real key (left padding); refuse what the kernels cannot do (dropout, any other mask, several new tokens after a prompt)"
    if dropout:
        raise ValueError(f"dropout = {dropout}: the kernels have no dropout; run the model in eval mode (model.eval())")
    key_start = None if attention_mask is None else key_start_of(attention_mask, q_len, kv_len, window_left)
    if q_len not in (1, kv_len):
        raise ValueError(f"{q_len} new tokens after {kv_len - q_len} cached ones: the kernels take a whole prompt "
                         "or one new token")
    # END SOLUTION
    # BEGIN SOLUTION "step 2: the scale: `scaling`, else the module's, else 1/sqrt(head_dim); fold any other into the query"
    if scaling is None:
        scaling = getattr(module, "scaling", head_dim ** -0.5)
    if scaling != head_dim ** -0.5:
        query = query * (scaling * head_dim ** 0.5)
    # END SOLUTION
    q, k, v = (t.contiguous() for t in (query, key, value))
    # BEGIN SOLUTION "step 3: a prompt through task 4's kernel (causal if the module is), one new token through task 5's decode, both with key_start"
    masks = {name: value for name, value in (("window_left", window_left), ("softcap", softcap or None))
             if value is not None}  # step 4's, passed only where the model has them
    if q_len == kv_len:
        out = kernels.attention(q, k, v, bool(getattr(module, "is_causal", True)), key_start, **masks)
    else:
        if window_left is not None:  # the new token sees the last window_left + 1 keys: decode over those
            start = kv_len - window_left - 1
            k, v = k[:, :, start:].contiguous(), v[:, :, start:].contiguous()
            key_start = None if key_start is None else (key_start - start).clamp(min=0)
        out = kernels.decode(q, k, v, k.shape[2], key_start)
    return out.transpose(1, 2), None
    # END SOLUTION
