"""Task 3: FlashAttention-2 in PyTorch."""
