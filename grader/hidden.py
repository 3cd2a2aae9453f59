"""Hidden test cases: instructor-only, left out of the student handout.

`SECRET_SEED` is mixed into every public seed when the grader passes --hidden,
and `CASES` adds shapes to each task's public list (same tuple layout as the
task's test.py). Change the seed each term.
"""

SECRET_SEED = 0x5EED_2026

CASES = {
    # (batch, seq_q, seq_k, hidden, heads)
    1: [(3, 31, 31, 120, 5), (1, 7, 50, 256, 2)],
    # softmax (rows, cols), GEMM (batch, m, n, k), attention (batch, heads, seq_q, seq_k, head_dim)
    2: [(7, 513), (1, 31, 65, 200), (3, 2, 45, 130, 96)],
    # (batch, heads, seq_q, seq_k, head_dim, block_rows, block_cols)
    3: [(2, 3, 65, 65, 48, 32, 48), (1, 2, 3, 190, 24, 16, 64), (1, 1, 33, 33, 16, 33, 1)],
    # (batch, heads, seq_q, seq_k, head_dim)
    4: [(3, 1, 191, 191, 96), (1, 2, 5, 700, 128), (2, 1, 256, 256, 40)],
}
