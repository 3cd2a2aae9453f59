"""Task 2: attention from separate CUDA kernels (softmax, tiled GEMM_NT and GEMM_NN)."""
