"""Task 7: the course kernels inside a Hugging Face GPT-2."""
