// Task 2: attention from separate kernels.
//
//   scores = Q K^T            gemm_nt         (batch, seq_q, head_dim) x (batch, seq_k, head_dim)
//   scores = mask(scale * s)  scale_and_mask  given
//   P      = softmax(scores)  softmax_forward row by row, in place
//   out    = P V              gemm_nn         (batch, seq_q, seq_k) x (batch, seq_k, head_dim)
//
// Each step reads its input from global memory and writes its result back, and the
// (seq_q, seq_k) scores matrix of every head lives in global memory in between. That
// round trip is what the fused kernels of the later tasks remove; this task is the
// baseline they are measured against.
//
// All matrices are row-major, contiguous float32. The kernels trust their arguments:
// task2/binding.cpp checks the tensors before calling the launchers at the bottom.
//
// Build and test:
//   python -m task2.compile                 build this file (task2/kernels/attention.cu)
//   python -m task2.test --softmax          steps 1-2
//   python -m task2.test --gemm             steps 3-4
//   python -m task2.test --attention        step 5
//   python -m task2.test                    everything

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

// ----------------------------------------------------------------------------
// Tile sizes

// Softmax: one block of SOFTMAX_THREADS threads per row. A power of two, because the
// tree reduction halves the number of active threads at each level.
constexpr int SOFTMAX_THREADS = 256;
static_assert((SOFTMAX_THREADS & (SOFTMAX_THREADS - 1)) == 0, "SOFTMAX_THREADS: a power of two");

// GEMM: each block computes a TILE_M x TILE_N tile of C, walking over k in steps of
// TILE_K. Its 16 x 16 threads each compute a MICRO_M x MICRO_N block of that tile, so
// every value read from shared memory is used MICRO_N (or MICRO_M) times from a register.
constexpr int TILE_M = 64;
constexpr int TILE_N = 64;
constexpr int TILE_K = 16;
constexpr int GEMM_THREADS_X = 16;  // threadIdx.x: along the columns of C
constexpr int GEMM_THREADS_Y = 16;  // threadIdx.y: along the rows of C
constexpr int GEMM_THREADS = GEMM_THREADS_X * GEMM_THREADS_Y;
constexpr int MICRO_M = TILE_M / GEMM_THREADS_Y;  // 4 rows of C per thread
constexpr int MICRO_N = TILE_N / GEMM_THREADS_X;  // 4 columns of C per thread
static_assert(MICRO_M * GEMM_THREADS_Y == TILE_M && MICRO_N * GEMM_THREADS_X == TILE_N,
              "the threads' micro-tiles cover the block's tile exactly");
static_assert((TILE_M * TILE_K) % GEMM_THREADS == 0 && (TILE_N * TILE_K) % GEMM_THREADS == 0,
              "every thread loads the same number of elements of each tile");

// Thread (ty, tx) owns rows ty, ty + 16, ty + 32, ty + 48 of the tile and columns
// tx, tx + 16, tx + 32, tx + 48: strided rather than 4 neighbours, so the 16 threads
// of a half-warp read 16 consecutive shared-memory words (no bank conflicts) and write
// 16 consecutive floats of C (coalesced).

// ----------------------------------------------------------------------------
// Softmax

// in, out: (rows, cols). Block r normalises row r. in == out is allowed: every thread
// reads an element for the last time just before it writes the same element.
__global__ void softmax_kernel(const float* in, float* out, int cols) {
  // TODO (README, Task 2, step 1: reduce the row maximum through shared memory)

  // TODO (README, Task 2, step 2: reduce the sum of exponentials, then write the normalised row)
}

// ----------------------------------------------------------------------------
// GEMM_NT: c[b] = a[b] @ b[b]^T

// a: (batch, m, k), b: (batch, n, k), c: (batch, m, n).
// grid (ceil(n / TILE_N), ceil(m / TILE_M), batch), block (GEMM_THREADS_X, GEMM_THREADS_Y).
// Both operands have k as their contiguous dimension, so a tile of either is a block of
// rows of length TILE_K, and C[i][j] is the dot product of row i of a and row j of b.
__global__ void gemm_nt_kernel(const float* a, const float* b, float* c, int m, int n, int k) {
  // TODO (README, Task 2, step 3: GEMM_NT, C = A B^T, tiled through shared memory)
}

// ----------------------------------------------------------------------------
// GEMM_NN: c[b] = a[b] @ b[b]

// a: (batch, m, k), b: (batch, k, n), c: (batch, m, n).
// grid (ceil(n / TILE_N), ceil(m / TILE_M), batch), block (GEMM_THREADS_X, GEMM_THREADS_Y).
// Same structure as gemm_nt_kernel; only b changes: its contiguous dimension is n, so
// its tile is (TILE_K, TILE_N), TILE_K rows of b each read along n.
__global__ void gemm_nn_kernel(const float* a, const float* b, float* c, int m, int n, int k) {
  // TODO (README, Task 2, step 4: GEMM_NN, C = A B, tiled through shared memory)
}

// ----------------------------------------------------------------------------
// Scale and causal mask (given)

// scores: (batch, m, n), m queries by n keys, scaled in place. With a causal mask,
// query i sees key j iff j <= i + (n - m): the queries are the last m positions of the
// sequence, as when decoding new tokens against a longer cache.
__global__ void scale_and_mask_kernel(float* scores, size_t total, int m, int n, float scale,
                                      bool causal) {
  // Grid-stride loop: a fixed number of blocks covers any number of elements.
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const int j = (int)(idx % n);        // key
    const int i = (int)((idx / n) % m);  // query
    const bool masked = causal && j > i + (n - m);
    scores[idx] = masked ? -INFINITY : scores[idx] * scale;
  }
}

// ----------------------------------------------------------------------------
// Launchers: called by task2/binding.cpp on PyTorch's current stream. Each returns the
// error of its launch (a bad configuration); errors inside the kernel surface later,
// at the next synchronisation.

cudaError_t softmax_forward(const float* in, float* out, int rows, int cols, cudaStream_t stream) {
  softmax_kernel<<<rows, SOFTMAX_THREADS, 0, stream>>>(in, out, cols);
  return cudaGetLastError();
}

static dim3 gemm_grid(int batch, int m, int n) {
  return dim3((n + TILE_N - 1) / TILE_N, (m + TILE_M - 1) / TILE_M, batch);
}

cudaError_t gemm_nt(const float* a, const float* b, float* c, int batch, int m, int n, int k,
                    cudaStream_t stream) {
  const dim3 block(GEMM_THREADS_X, GEMM_THREADS_Y);
  gemm_nt_kernel<<<gemm_grid(batch, m, n), block, 0, stream>>>(a, b, c, m, n, k);
  return cudaGetLastError();
}

cudaError_t gemm_nn(const float* a, const float* b, float* c, int batch, int m, int n, int k,
                    cudaStream_t stream) {
  const dim3 block(GEMM_THREADS_X, GEMM_THREADS_Y);
  gemm_nn_kernel<<<gemm_grid(batch, m, n), block, 0, stream>>>(a, b, c, m, n, k);
  return cudaGetLastError();
}

cudaError_t scale_and_mask(float* scores, int batch, int m, int n, float scale, bool causal,
                           cudaStream_t stream) {
  const size_t total = (size_t)batch * m * n;
  const int threads = 256;
  // Enough blocks to fill the GPU several times over; the grid-stride loop does the rest.
  const int blocks = (int)std::min<size_t>((total + threads - 1) / threads, 65536);
  scale_and_mask_kernel<<<blocks, threads, 0, stream>>>(scores, total, m, n, scale, causal);
  return cudaGetLastError();
}

// q: (batch_heads, seq_q, head_dim), k and v: (batch_heads, seq_k, head_dim),
// scores: workspace (batch_heads, seq_q, seq_k), out: (batch_heads, seq_q, head_dim).
// Launches on one stream run in order, so each kernel sees the previous one's output.
cudaError_t attention_forward(const float* q, const float* k, const float* v, float* scores,
                              float* out, int batch_heads, int seq_q, int seq_k, int head_dim,
                              float scale, bool causal, cudaStream_t stream) {
  // TODO (README, Task 2, step 5: chain the kernels in attention_forward)
  return cudaSuccess;
}
