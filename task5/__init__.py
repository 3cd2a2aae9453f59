"""Task 5: the KV cache and the decode kernels (CUDA)."""
