"""Task 1: naive multi-head attention in PyTorch."""
