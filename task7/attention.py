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
    # TODO (README, Task 7, step 4: (optional, after steps 1-3) Gemma 2's softcap and a sliding_window as the kernels' window_left (sliding_window - 1); a new token's window as the last keys; no soft-capping decode)
    if kwargs.get("softcap") or (kwargs.get("sliding_window") is not None and kwargs["sliding_window"] < kv_len):
        raise NotImplementedError("Gemma 2's softcap and Mistral's sliding_window: see README, Task 7, step 4 "
                                  "(optional); until then, run such a model with its own attention")
    softcap = window_left = None
    # TODO (README, Task 7, step 1: the mask as each sequence's first real key (left padding); refuse what the kernels cannot do (dropout, any other mask, several new tokens after a prompt))
    raise NotImplementedError("see README, Task 7, step 1: the mask as each sequence's first real key (left padding); refuse what the kernels cannot do (dropout, any other mask, several new tokens after a prompt)")
    # TODO (README, Task 7, step 2: the scale: `scaling`, else the module's, else 1/sqrt(head_dim); fold any other into the query)
    raise NotImplementedError("see README, Task 7, step 2: the scale: `scaling`, else the module's, else 1/sqrt(head_dim); fold any other into the query")
    q, k, v = (t.contiguous() for t in (query, key, value))
    # TODO (README, Task 7, step 3: a prompt through task 4's kernel (causal if the module is), one new token through task 5's decode, both with key_start)
    raise NotImplementedError("see README, Task 7, step 3: a prompt through task 4's kernel (causal if the module is), one new token through task 5's decode, both with key_start")
