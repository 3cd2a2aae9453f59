"""Task 5: KV-cache update and decode kernels (CUDA). Not in the kit yet."""
