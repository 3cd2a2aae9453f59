"""Task 4: one fused FlashAttention CUDA kernel."""
