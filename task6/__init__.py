"""Task 6: prefill/decode dispatch with a KV cache inside a small LLM. Not in the kit yet."""
