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
// Add --solution to either command to build and test the reference instead.  [reference only]

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
  // BEGIN SOLUTION "step 1: reduce the row maximum through shared memory"
  const float* x = in + (size_t)blockIdx.x * cols;  // this block's row of in
  float* y = out + (size_t)blockIdx.x * cols;       // and of out
  __shared__ float partial[SOFTMAX_THREADS];  // one value per thread, reduced as a tree

  // Each thread takes every blockDim.x-th column, so any number of columns works.
  float thread_max = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) thread_max = fmaxf(thread_max, x[j]);
  partial[threadIdx.x] = thread_max;
  __syncthreads();
  // Tree reduction: at each level the lower half absorbs the upper half, until
  // partial[0] holds the maximum of the whole row.
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + half]);
    __syncthreads();
  }
  const float row_max = partial[0];
  __syncthreads();  // everyone has read partial[0] before step 2 reuses the array
  // END SOLUTION

  // BEGIN SOLUTION "step 2: reduce the sum of exponentials, then write the normalised row"
  // Subtracting the maximum keeps every exponent <= 0, so expf cannot overflow, and the
  // largest term is exactly 1, so the sum is at least 1. (A row of all -inf would give
  // NaN here; the binding rejects the shapes that could produce one.)
  float thread_sum = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) thread_sum += expf(x[j] - row_max);
  partial[threadIdx.x] = thread_sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const float inv_sum = 1.0f / partial[0];
  // Recomputing expf is cheaper than storing the exponentials: they do not fit in
  // shared memory for long rows, and a round trip through global memory costs more.
  for (int j = threadIdx.x; j < cols; j += blockDim.x) y[j] = expf(x[j] - row_max) * inv_sum;
  // END SOLUTION
}

// ----------------------------------------------------------------------------
// GEMM_NT: c[b] = a[b] @ b[b]^T

// a: (batch, m, k), b: (batch, n, k), c: (batch, m, n).
// grid (ceil(n / TILE_N), ceil(m / TILE_M), batch), block (GEMM_THREADS_X, GEMM_THREADS_Y).
// Both operands have k as their contiguous dimension, so a tile of either is a block of
// rows of length TILE_K, and C[i][j] is the dot product of row i of a and row j of b.
__global__ void gemm_nt_kernel(const float* a, const float* b, float* c, int m, int n, int k) {
  // BEGIN SOLUTION "step 3: GEMM_NT, C = A B^T, tiled through shared memory"
  // Move the pointers to the rows this block reads, in this block's batch entry. The
  // binding checks that offsets inside one matrix fit in int; across the batch they
  // may not, hence size_t here.
  const int row0 = blockIdx.y * TILE_M;
  const int col0 = blockIdx.x * TILE_N;
  a += (size_t)blockIdx.z * m * k + (size_t)row0 * k;  // row row0 of a[blockIdx.z]
  b += (size_t)blockIdx.z * n * k + (size_t)col0 * k;  // row col0 of b[blockIdx.z]
  c += (size_t)blockIdx.z * m * n + (size_t)row0 * n + col0;

  // Both tiles are stored as they lie in memory: (rows, TILE_K). The inner loop reads
  // b_tile down a column, 16 threads at 16 different rows; the +1 puts those rows in
  // different banks (a_tile is read at only 2 rows per warp: a broadcast).
  __shared__ float a_tile[TILE_M][TILE_K];
  __shared__ float b_tile[TILE_N][TILE_K + 1];

  const int tid = threadIdx.y * GEMM_THREADS_X + threadIdx.x;
  float acc[MICRO_M][MICRO_N] = {};

  for (int k0 = 0; k0 < k; k0 += TILE_K) {
    // Load both tiles, zero-filling past the edges of the matrices so that the
    // inner loop needs no bounds checks. Consecutive threads read consecutive
    // addresses along k (coalesced).
    for (int e = tid; e < TILE_M * TILE_K; e += GEMM_THREADS) {
      const int r = e / TILE_K, kk = e % TILE_K;
      a_tile[r][kk] = (row0 + r < m && k0 + kk < k) ? a[r * k + k0 + kk] : 0.0f;
    }
    for (int e = tid; e < TILE_N * TILE_K; e += GEMM_THREADS) {
      const int r = e / TILE_K, kk = e % TILE_K;
      b_tile[r][kk] = (col0 + r < n && k0 + kk < k) ? b[r * k + k0 + kk] : 0.0f;
    }
    __syncthreads();

    for (int kk = 0; kk < TILE_K; ++kk) {
      // One column of each tile into registers, then MICRO_M x MICRO_N FFMAs.
      float a_frag[MICRO_M], b_frag[MICRO_N];
#pragma unroll
      for (int i = 0; i < MICRO_M; ++i) a_frag[i] = a_tile[threadIdx.y + i * GEMM_THREADS_Y][kk];
#pragma unroll
      for (int j = 0; j < MICRO_N; ++j) b_frag[j] = b_tile[threadIdx.x + j * GEMM_THREADS_X][kk];
#pragma unroll
      for (int i = 0; i < MICRO_M; ++i)
#pragma unroll
        for (int j = 0; j < MICRO_N; ++j) acc[i][j] += a_frag[i] * b_frag[j];
    }
    __syncthreads();  // everyone is done with the tiles before the next load overwrites them
  }

#pragma unroll
  for (int i = 0; i < MICRO_M; ++i) {
    const int r = threadIdx.y + i * GEMM_THREADS_Y;
#pragma unroll
    for (int j = 0; j < MICRO_N; ++j) {
      const int col = threadIdx.x + j * GEMM_THREADS_X;
      if (row0 + r < m && col0 + col < n) c[r * n + col] = acc[i][j];
    }
  }
  // END SOLUTION
}

// ----------------------------------------------------------------------------
// GEMM_NN: c[b] = a[b] @ b[b]

// a: (batch, m, k), b: (batch, k, n), c: (batch, m, n).
// grid (ceil(n / TILE_N), ceil(m / TILE_M), batch), block (GEMM_THREADS_X, GEMM_THREADS_Y).
// Same structure as gemm_nt_kernel; only b changes: its contiguous dimension is n, so
// its tile is (TILE_K, TILE_N), TILE_K rows of b each read along n.
__global__ void gemm_nn_kernel(const float* a, const float* b, float* c, int m, int n, int k) {
  // BEGIN SOLUTION "step 4: GEMM_NN, C = A B, tiled through shared memory"
  const int row0 = blockIdx.y * TILE_M;
  const int col0 = blockIdx.x * TILE_N;
  a += (size_t)blockIdx.z * m * k + (size_t)row0 * k;  // row row0 of a[blockIdx.z]
  b += (size_t)blockIdx.z * k * n + col0;              // column col0 of b[blockIdx.z]
  c += (size_t)blockIdx.z * m * n + (size_t)row0 * n + col0;

  // b_tile is read along a row, 16 consecutive words per half-warp: no padding needed.
  __shared__ float a_tile[TILE_M][TILE_K];
  __shared__ float b_tile[TILE_K][TILE_N];

  const int tid = threadIdx.y * GEMM_THREADS_X + threadIdx.x;
  float acc[MICRO_M][MICRO_N] = {};

  for (int k0 = 0; k0 < k; k0 += TILE_K) {
    for (int e = tid; e < TILE_M * TILE_K; e += GEMM_THREADS) {
      const int r = e / TILE_K, kk = e % TILE_K;
      a_tile[r][kk] = (row0 + r < m && k0 + kk < k) ? a[r * k + k0 + kk] : 0.0f;
    }
    // Consecutive threads read consecutive columns of one row of b (coalesced).
    for (int e = tid; e < TILE_K * TILE_N; e += GEMM_THREADS) {
      const int kk = e / TILE_N, col = e % TILE_N;
      b_tile[kk][col] = (k0 + kk < k && col0 + col < n) ? b[(k0 + kk) * n + col] : 0.0f;
    }
    __syncthreads();

    for (int kk = 0; kk < TILE_K; ++kk) {
      float a_frag[MICRO_M], b_frag[MICRO_N];
#pragma unroll
      for (int i = 0; i < MICRO_M; ++i) a_frag[i] = a_tile[threadIdx.y + i * GEMM_THREADS_Y][kk];
#pragma unroll
      for (int j = 0; j < MICRO_N; ++j) b_frag[j] = b_tile[kk][threadIdx.x + j * GEMM_THREADS_X];
#pragma unroll
      for (int i = 0; i < MICRO_M; ++i)
#pragma unroll
        for (int j = 0; j < MICRO_N; ++j) acc[i][j] += a_frag[i] * b_frag[j];
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < MICRO_M; ++i) {
    const int r = threadIdx.y + i * GEMM_THREADS_Y;
#pragma unroll
    for (int j = 0; j < MICRO_N; ++j) {
      const int col = threadIdx.x + j * GEMM_THREADS_X;
      if (row0 + r < m && col0 + col < n) c[r * n + col] = acc[i][j];
    }
  }
  // END SOLUTION
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
  // BEGIN SOLUTION "step 5: chain the kernels in attention_forward"
  cudaError_t err = gemm_nt(q, k, scores, batch_heads, seq_q, seq_k, head_dim, stream);
  if (err != cudaSuccess) return err;
  err = scale_and_mask(scores, batch_heads, seq_q, seq_k, scale, causal, stream);
  if (err != cudaSuccess) return err;
  // Each of the batch_heads * seq_q rows of scores is one softmax; in place.
  err = softmax_forward(scores, scores, batch_heads * seq_q, seq_k, stream);
  if (err != cudaSuccess) return err;
  // (seq_q, seq_k) @ (seq_k, head_dim): m = seq_q, n = head_dim, k = seq_k.
  return gemm_nn(scores, v, out, batch_heads, seq_q, head_dim, seq_k, stream);
  // SKELETON
  // return cudaSuccess;
  // END SOLUTION
}
