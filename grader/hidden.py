"""Hidden test cases: instructor-only, left out of the student handout.

`SECRET_SEED` is mixed into every public seed when the grader passes --hidden,
and `CASES` adds shapes to each task's public list (same tuple layout as the
task's test.py). Change the seed each term.
"""

SECRET_SEED = 0x5EED_2026

CASES = {
    # (batch, seq_q, seq_k, hidden, heads)
    1: [(3, 31, 31, 120, 5), (1, 7, 50, 256, 2)],
    # (batch, heads, seq_q, seq_k, head_dim, block_rows, block_cols)
    3: [(2, 3, 65, 65, 48, 32, 48), (1, 2, 3, 190, 24, 16, 64), (1, 1, 33, 33, 16, 33, 1)],
}
