"""Hidden test cases: instructor-only, left out of the student handout.

`SECRET_SEED` is mixed into every public seed when the grader passes --hidden, and
`CASES[task][part]` adds shapes to that part of the task's public list (the same tuple
layout as the part's list in checks/taskN/test.py, or checks/taskN/cases.py for tasks 4 and 5). Change the seed
each term.
"""

SECRET_SEED = 0x5EED_2026

CASES = {
    1: {"attention": [(3, 31, 31, 120, 5), (1, 7, 50, 256, 2)]},  # (batch, seq_q, seq_k, hidden, heads)
    2: {
        "softmax": [(7, 513)],  # (rows, cols)
        "gemm": [(1, 31, 65, 200)],  # (batch, m, n, k)
        "attention": [(3, 2, 45, 130, 96)],  # (batch, heads, seq_q, seq_k, head_dim)
    },
    # (batch, heads, seq_q, seq_k, head_dim, block_rows, block_cols)
    3: {"attention": [(2, 3, 65, 65, 48, 32, 48), (1, 2, 3, 190, 24, 16, 64), (1, 1, 33, 33, 16, 33, 1)],
        "backward": [(2, 2, 65, 97, 48, 32, 48), (1, 3, 33, 33, 16, 33, 5)],  # the optional backward pass
        # the optional masks (steps 9-11), as checks/task3/masks.py's MASK_CASES: windows of 2 keys, of one tile and
        # past the start; many short documents, one of one position; documents of one tile; a cap that binds
        "masks": [(1, 2, 200, 200, 24, 64, 48, True, 1, None, None), (2, 1, 130, 130, 16, 32, 32, True, 31, None, 0.7),
                  (1, 2, 160, 160, 16, 16, 16, False, None, (1,) * 10 + (150,), None),
                  (1, 1, 96, 96, 16, 32, 32, True, None, (32, 32, 32), 3.0),
                  (1, 2, 50, 1000, 16, 16, 64, True, 2000, None, 1.5), (1, 1, 128, 128, 16, 32, 32, True, 33, None, None)],
        "masks_backward": [(1, 2, 160, 160, 16, 16, 16, True, 5, (10,) * 16, None),
                           (2, 1, 130, 130, 16, 32, 32, True, 31, None, 0.7),
                           (1, 1, 128, 128, 16, 32, 32, True, 33, None, None)]},  # step 12
    4: {
        "attention": [(3, 1, 191, 191, 96), (1, 2, 5, 700, 128), (2, 1, 256, 256, 40)],  # (b, h, sq, sk, d)
        # (batch, heads, kv_heads, seq_q, seq_k, head_dim, key_start or None)
        "grouped": [(2, 10, 5, 77, 77, 48, None), (1, 24, 3, 33, 190, 128, (170,)), (3, 9, 1, 50, 50, 40, (49, 0, 17))],
        # the optional bf16/fp16 kernel, in both types: (batch, heads, kv_heads, seq_q, seq_k, head_dim, key_start)
        "half": [(1, 1, 1, 300, 8192, 64, None), (2, 6, 3, 257, 1029, 112, (0, 900)), (1, 3, 1, 1, 5000, 48, None),
                 (3, 5, 5, 191, 191, 72, None)],
        # the optional Hopper kernel, in both types, as "half"
        "hopper": [(1, 1, 1, 300, 4100, 64, None), (2, 6, 3, 257, 1029, 112, (0, 900)), (3, 5, 5, 191, 191, 72, None)],
        # the optional backward pass: (batch, heads, kv_heads, seq_q, seq_k, head_dim)
        "backward": [(2, 3, 3, 191, 250, 72), (1, 8, 2, 96, 96, 128), (3, 2, 1, 40, 33, 40)],
        # the optional 16-bit backward pass, in both types, as "backward"
        "backward_half": [(2, 3, 3, 191, 250, 72), (1, 8, 2, 96, 96, 128), (3, 2, 1, 40, 33, 24)],
        # the optional masks (steps 23-24), as checks/task4/masks.py's MASK_CASES: a window of 2 keys over grouped
        # heads and padding, a window one key past a tile, documents many and short with a cap, length 1
        "masks": [(2, 6, 3, 190, 250, 72, True, 1, None, None, (0, 120)),
                  (1, 2, 2, 400, 400, 48, True, 128, None, None, None),
                  (1, 3, 1, 220, 220, 40, False, None, (3,) * 30 + (130,), 0.8, None),
                  (2, 2, 2, 1, 1, 16, True, 0, (1,), 2.0, (0, 1))],
    },
    5: {
        # (batch, heads, max_seq, pos, n_new, head_dim); pos an int, or one per sequence (int32 on the GPU)
        "cache": [(3, 2, 70, 69, 1, 96), (1, 4, 130, 1, 128, 40), (5, 3, 33, (32, 0, 30, 33, 7), 2, 24)],
        "decode": [(3, 5, 600, 511, 96), (1, 1, 2100, 2049, 128), (2, 3, 50, 47, 24)],  # (b, h, max_seq, length, d)
        "split": [(3, 5, 600, 511, 96, 4), (1, 2, 5000, 4999, 128, 0), (1, 1, 10, 9, 40, 16)],  # (..., splits)
        # (batch, heads, kv_heads, max_seq, length, head_dim, key_start or None[, splits])
        # length an int, or one per sequence (int32 on the GPU, out of range: NaN)
        "decode grouped": [(3, 10, 5, 200, 190, 96, None), (2, 24, 3, 80, 71, 40, (70, 3)), (1, 20, 1, 50, 50, 128, None),
                           (4, 6, 2, 90, (90, 13, -2, 61), 72, (0, 12, 0, 5))],
        "split grouped": [(2, 14, 2, 3000, 2999, 64, (0, 1000), 0), (1, 9, 3, 40, 39, 24, None, 8),
                          (3, 10, 5, 1500, (1500, 700, 2), 96, (3, 0, 1), 0)],
        # (batch, kv_heads, page_size, max_pages, pos, n_new, head_dim); (batch, heads, kv_heads, page_size,
        # max_pages, lengths, head_dim, key_start, splits)
        "paged update": [(3, 3, 4, 6, (23, 0, 9), 2, 40)],
        "paged decode": [(3, 10, 5, 32, 20, (640, 33, 300), 96, (0, 30, 299), 0), (2, 6, 2, 2, 9, (17, 18), 24, None, 2)],
        # the optional bf16/fp16 cache, in both types: "half update" as "cache"; "half decode" as "split grouped"
        "half update": [(5, 3, 33, (32, 0, 30, 33, 7), 2, 24), (1, 4, 130, 1, 128, 40)],
        "half decode": [(3, 10, 5, 200, 190, 96, None, 1), (2, 24, 3, 80, 71, 40, (70, 3), 1),
                        (3, 10, 5, 1500, (1500, 700, 2), 72, (3, 0, 1), 0), (1, 2, 2, 5000, 4999, 24, None, 9)],
        # timed, reported only (checks/task5/measure.py's SHAPE_BENCHMARKS):
        # (batch, heads, kv_heads, cached tokens, head_dim)
        "shapes": [(2, 12, 12, 16384, 64), (32, 16, 16, 512, 96), (1, 1, 1, 100000, 128), (7, 6, 2, 5000, 40)],
    },
    6: {  # (hidden, heads, layers, batch, max_seq, prompt_len, steps[, kv_heads[, padding]])
        "cpu": [(40, 5, 2, 2, 30, 17, 13), (48, 6, 2, 3, 30, 11, 9, 3, (4, 0, 11))],
        "gpu": [(384, 3, 2, 2, 150, 99, 51), (128, 1, 2, 3, 70, 64, 6), (480, 12, 2, 3, 90, 50, 20, 4, (7, 0, 49)),
                (240, 6, 2, 2, 40, 21, 9, 1, (20, 3))],
        "graph": [(384, 6, 2, 3, 90, 50, 20, 2, (7, 0, 49))],
        # the optional 16-bit part, in bf16 and in fp16: heads of 120 (not a multiple of 16), a padded MQA batch
        "half": [(480, 4, 2, 2, 100, 77, 16), (384, 6, 2, 3, 90, 50, 20, 1, (7, 0, 49))],
    },
}
