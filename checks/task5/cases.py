"""Task 5's public cases: the shapes its checks run (checks/task5/test.py), each list with what it covers, what
every output is held to (ATOL, RTOL) and how many requests a benchmark times (REPS): here, not in measure.py, so that
generation.py need not import measure.py, which imports it (tests/test_tree.py refuses the cycle).

The hidden cases add to them (grader/hidden.py). A shape is a tuple, as each list's comment says.
"""

ATOL, RTOL = 2e-5, 1e-4  # what every output is held to, checked or timed
REPS = 5  # timed requests per benchmark

# (batch, heads, max_seq, pos, n_new, head_dim): rows pos .. pos + n_new - 1 are written. pos is an int
# (every sequence), or one position per sequence, passed as int32 on the GPU (read by the kernel): a
# sequence whose rows would not fit (pos < 0 or pos + n_new > max_seq) writes nothing.
CACHE_CASES = [(1, 1, 8, 0, 1, 128), (2, 3, 50, 49, 1, 64), (2, 2, 40, 0, 33, 80), (1, 2, 300, 17, 129, 17),
               (4, 8, 64, 5, 1, 128), (3, 2, 40, (0, 39, 17), 1, 64), (2, 3, 50, (10, 45), 5, 32),
               (4, 2, 40, (5, 40, -1, 36), 4, 48)]
# (batch, heads, max_seq, length, head_dim): positions length .. max_seq - 1 hold NaN
DECODE_CASES = [(1, 1, 8, 1, 128), (1, 1, 8, 2, 64), (2, 3, 100, 31, 128), (2, 3, 100, 32, 128),
                (2, 3, 100, 33, 128), (1, 2, 200, 63, 64), (1, 2, 200, 64, 64), (1, 2, 200, 65, 64),
                (1, 1, 4100, 4097, 128), (2, 2, 300, 300, 80), (1, 3, 150, 129, 17), (1, 2, 70, 50, 32),
                (2, 2, 90, 77, 12), (1, 2, 60, 41, 4), (1, 1, 40, 37, 3), (8, 32, 300, 257, 128)]
# (batch, heads, max_seq, length, head_dim, splits); splits 0: the launcher's choice
SPLIT_CASES = [(1, 1, 8, 1, 128, 64), (1, 1, 8, 2, 64, 3), (2, 3, 100, 33, 128, 2), (1, 2, 200, 65, 64, 7),
               (1, 1, 4100, 4097, 128, 64), (1, 1, 4100, 4097, 128, 0), (2, 2, 300, 300, 80, 3),
               (1, 3, 150, 129, 17, 5), (1, 1, 40, 37, 3, 2), (1, 2, 9000, 8999, 128, 0), (8, 32, 300, 257, 128, 2)]
# Grouped-query attention and padding: (batch, heads, kv_heads, max_seq, length, head_dim, key_start).
# kv_heads divides heads (query head h reads cache head h // (heads // kv_heads)); a block serves up to
# MAX_QUERIES (4 in the reference) query heads of a group, so 6, 8, 12 and 32 per cache head take several
# blocks. key_start: each sequence's first valid position (left padding; at most length - 1) or None.
# length: an int, or one per sequence, passed as int32 on the GPU (read by the kernel; a sequence whose
# length or key_start is out of range must come out NaN).
GROUPED_DECODE_CASES = [(2, 8, 4, 100, 33, 128, None), (1, 8, 2, 200, 65, 64, None), (2, 16, 2, 70, 50, 32, None),
                        (2, 6, 1, 90, 77, 12, None), (1, 12, 1, 150, 129, 17, None), (1, 12, 3, 60, 41, 4, None),
                        (1, 32, 1, 300, 257, 128, None), (4, 8, 2, 64, 40, 64, (0, 35, 12, 39)),
                        (2, 6, 3, 600, 513, 80, (0, 500)), (1, 9, 3, 120, 100, 64, None),
                        (3, 4, 4, 100, (1, 100, 57), 64, None), (4, 8, 2, 300, (257, 3, 300, 130), 128, (0, 2, 299, 100)),
                        (3, 2, 2, 50, (20, 0, 51), 32, None), (2, 6, 3, 64, (64, 30), 80, (63, 31))]
# the same with splits: (..., splits); 0 lets the launcher choose
GROUPED_SPLIT_CASES = [(2, 8, 4, 100, 33, 128, None, 2), (1, 16, 2, 4100, 4097, 128, None, 0),
                       (1, 12, 1, 150, 129, 17, None, 5), (3, 8, 2, 600, 600, 64, (0, 300, 599), 7),
                       (3, 8, 2, 2000, (1999, 17, 600), 128, None, 0), (2, 4, 4, 300, (300, 5), 64, (0, 4), 7),
                       (2, 2, 2, 100, (0, 50), 64, None, 3)]
# Step 5 (optional), a paged cache: (batch, kv_heads, page_size, max_pages, pos per sequence, n_new, head_dim) for
# the update, rows that cross pages and a sequence whose rows do not fit included; (batch, heads, kv_heads,
# page_size, max_pages, length per sequence, head_dim, key_start, splits) for the decode, which must give what
# the contiguous decode gives on the same rows, bit for bit (a length out of range: NaN in both).
PAGED_UPDATE_CASES = [(3, 2, 16, 4, (0, 15, 47), 1, 64), (2, 4, 8, 4, (5, 20), 9, 32), (2, 2, 16, 4, (60, 3), 5, 16)]
PAGED_DECODE_CASES = [(3, 4, 4, 16, 3, (1, 40, 33), 64, None, 1), (2, 8, 2, 16, 7, (100, 17), 128, (0, 5), 0),
                      (4, 6, 3, 32, 3, (64, 1, 90, 65), 80, None, 3), (2, 4, 1, 1, 8, (7, 3), 32, None, 1),
                      (2, 4, 4, 64, 4, (200, 0), 12, None, 1), (1, 32, 8, 16, 257, (4097,), 128, None, 0)]
# Step 6 (optional), the cache in bf16 and fp16 (kernels/decode_half.cu), each case in both types: the update as
# CACHE_CASES' (a copy: exact), and the decode as GROUPED_SPLIT_CASES' (splits 1: none), against float64 on the
# same 16-bit values within what the type allows (checks/task4/measure.py's half_allowance: twice SDPA's own error on
# them, or half a unit in the last place). head_dim 8 to 128 and odd ones (which the kernel reads a value at a
# time), lengths per sequence with one out of range (NaN), padding, groups, and long caches split.
HALF_UPDATE_CASES = [(2, 3, 50, 49, 1, 64), (1, 2, 300, 17, 129, 17), (3, 2, 40, (0, 39, 17), 1, 64),
                     (4, 2, 40, (5, 40, -1, 36), 4, 48)]
HALF_DECODE_CASES = [(1, 1, 1, 8, 1, 128, None, 1), (2, 3, 3, 100, 33, 128, None, 1), (1, 2, 2, 200, 65, 64, None, 1),
                     (1, 3, 3, 150, 129, 17, None, 1), (2, 8, 2, 200, 65, 64, None, 1), (1, 12, 3, 60, 41, 8, None, 1),
                     (2, 6, 3, 600, 513, 80, (0, 500), 3), (1, 1, 1, 4100, 4097, 128, None, 0),
                     (4, 8, 2, 300, (257, 3, 300, 130), 128, (0, 2, 299, 100), 1), (3, 2, 2, 50, (20, 0, 51), 32, None, 1),
                     (3, 8, 2, 2000, (1999, 17, 600), 96, None, 0), (2, 4, 4, 300, (300, 5), 40, (0, 4), 7)]
# (hidden, heads, max_seq, prompt_len, steps): steps that end exactly at a full cache included
LAYER_CASES = [(256, 4, 80, 50, 30), (256, 4, 40, 1, 20), (4096, 32, 48, 33, 15)]
# (rows, in_features, out_features): one token per sequence, widths off the kernel's 16-byte loads and its 16 rows
# of a block, down to the smallest k it takes, and one of the handout model's (qkv at batch 4); in float32 (4 values
# a load) and in bf16 and fp16 (8 values a load: task 6's 16-bit model)
LINEAR_CASES = [(1, 4, 1), (3, 68, 33), (5, 260, 100), (8, 2052, 17), (4, 4096, 12288)]
LINEAR_HALF_CASES = [(1, 8, 1), (3, 72, 33), (5, 264, 100), (8, 2056, 17), (4, 4096, 12288)]
