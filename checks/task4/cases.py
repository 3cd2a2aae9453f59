"""Task 4's public cases: the shapes its checks run (checks/task4/test.py), each list with what it covers.

The hidden cases add to them (grader/hidden.py). A shape is a tuple, as each list's comment says.
"""

# (batch, heads, seq_q, seq_k, head_dim)
CASES = [
    (1, 1, 1, 1, 32),
    (2, 3, 1, 257, 64),
    (2, 2, 63, 63, 64),
    (1, 2, 64, 64, 64),
    (2, 2, 65, 65, 64),
    (1, 3, 127, 127, 128),
    (1, 2, 128, 128, 128),
    (1, 2, 129, 129, 128),
    (2, 2, 100, 300, 80),
    (1, 2, 300, 520, 64),  # causal: query tiles past the first, each shifted by seq_k - seq_q
    (1, 2, 300, 300, 80),
    (1, 2, 200, 200, 72),
    (1, 2, 150, 150, 88),
    (1, 2, 131, 131, 85),
    (2, 1, 96, 160, 99),
    (1, 1, 77, 77, 17),
    (1, 2, 1000, 1000, 32),
]

# Grouped-query attention and padding: (batch, heads, kv_heads, seq_q, seq_k, head_dim, key_start).
# kv_heads divides heads (query head h reads key/value head h // (heads // kv_heads)); key_start is
# each sequence's first valid key (left padding) or None. Group sizes 1, 2, 3, 4, 8 and MQA, head
# counts that are not powers of two; padding that leaves whole tiles, one key, or no key at all.
GROUPED_CASES = [
    (2, 8, 4, 65, 65, 64, None),
    (1, 8, 2, 129, 129, 128, None),
    (1, 16, 2, 100, 300, 80, None),
    (2, 6, 1, 70, 70, 64, None),  # MQA
    (1, 12, 3, 131, 131, 85, None),
    (1, 12, 4, 64, 64, 72, None),
    (4, 4, 2, 40, 40, 64, (0, 35, 12, 39)),  # prompts of 40, 5, 28 and 1 tokens
    (2, 4, 4, 150, 150, 96, (0, 129)),
    (3, 4, 1, 30, 200, 64, (0, 180, 199)),  # seq_q < seq_k: some queries are padding, one is not
    (2, 2, 2, 9, 9, 32, (9, 0)),  # the first sequence is padding throughout: all zeros
]

# Scores large enough that exp() overflows unless the running maximum is subtracted (float16's range ends at
# 65504, float32's exp2 at 2^128): q scaled by this many times.
LARGE_SCORES = ((2, 2, 2, 150, 150, 64, None), 25.0)
# The optional bf16/fp16 kernel (steps 8-11), run in both 16-bit types: (batch, heads, kv_heads, seq_q, seq_k,
# head_dim, key_start). Lengths that are not multiples of its tiles (64 queries, 64 keys), head_dim 32 to 128 and
# odd ones, seq_q != seq_k, grouped heads, padding.
HALF_CASES = [
    (1, 1, 1, 1, 1, 64, None),
    (2, 4, 4, 100, 100, 64, None),
    (2, 4, 2, 77, 131, 128, None),
    (1, 8, 8, 200, 333, 128, None),
    (3, 2, 1, 65, 65, 32, None),
    (2, 3, 3, 129, 257, 80, None),
    (1, 4, 4, 513, 1000, 96, None),
    (2, 2, 2, 17, 40, 40, None),
    (1, 2, 2, 50, 50, 33, None),
    (1, 4, 4, 1, 300, 128, None),
    (2, 4, 4, 90, 90, 64, (0, 37)),
    (2, 4, 2, 30, 100, 128, (5, 99)),
    (1, 2, 2, 300, 517, 128, None),  # above head_dim 96, blocks of 256 rows: two, the second partial
    (2, 2, 1, 600, 700, 128, (0, 450)),  # padding that skips more than a block of queries
]
# The optional Hopper kernel (steps 17-22), run in both 16-bit types, as HALF_CASES: lengths around its tiles (128
# queries; 192 keys up to head_dim 64, 128 above) and past its ring of K/V stages (3 in the reference, 2 in the
# skeleton), head_dim 64 and 128 (one and two panels) and between (the second panel partly zeros), head_dims the
# binding pads to a multiple of 8, grouped heads, padding.
HOPPER_CASES = [
    (1, 1, 1, 1, 1, 64, None),
    (2, 4, 4, 128, 128, 64, None),
    (2, 4, 2, 129, 255, 128, None),
    (1, 8, 8, 300, 1000, 128, None),  # eight K/V tiles: every stage of the ring reused, 2 or 3 stages
    (1, 4, 2, 193, 1000, 64, None),  # head_dim 64's 192-key tiles: six, the last partial, every stage reused
    (3, 2, 1, 127, 127, 32, None),
    (2, 3, 3, 257, 513, 80, None),
    (1, 4, 4, 1, 300, 96, None),
    (1, 2, 2, 300, 100, 64, None),  # more queries than keys (not causal)
    (1, 2, 2, 50, 50, 33, None),  # padded to 40 by the binding
    (1, 2, 2, 40, 70, 4, None),  # padded to 8
    (2, 2, 2, 70, 90, 124, None),  # padded to 128
    (2, 4, 4, 90, 90, 64, (0, 37)),
    (2, 4, 2, 30, 200, 128, (5, 199)),
    (2, 2, 1, 600, 700, 128, (0, 450)),  # padding that skips more than a block of queries
    # more blocks of rows than an H100/H200 has SMs (132): PERSISTENT's blocks walk several, the ring, Q's buffers and
    # the turns carried on from one to the next; padded rows that see no key skipped on the way (320 blocks of rows)
    (2, 32, 8, 600, 600, 64, (0, 300)),
    (3, 24, 24, 200, 450, 128, None),  # 144 blocks of rows at head_dim 128 (one Q buffer)
]
# The Hopper kernel's tensors as a caller may hand them, 2 bytes off a 16-byte boundary (TMA reads aligned rows only,
# so the binding copies them): (which tensors, shape, causal), in bfloat16.
HOPPER_SHIFTED_CASES = [
    (("q", "k", "v", "out"), (1, 2, 1, 70, 90, 64, None), False),
    (("out",), (2, 2, 2, 129, 129, 128, None), True),
]
# The optional backward part (steps 12-16): (batch, heads, kv_heads, seq_q, seq_k, head_dim), each causal and not
# (causal needs seq_q <= seq_k). Lengths around the 64-row tiles, seq_q != seq_k both ways, grouped heads (dK and dV
# add up over the query heads that share them), head_dim 17 to 128.
BACKWARD_CASES = [
    (1, 1, 1, 1, 1, 32),
    (2, 2, 2, 63, 63, 64),
    (1, 2, 2, 64, 64, 64),
    (2, 2, 2, 65, 65, 64),
    (1, 2, 2, 129, 129, 128),
    (1, 2, 2, 100, 300, 80),  # causal: the first keys' tiles see every query, the last ones few
    (1, 2, 2, 300, 100, 64),  # more queries than keys (not causal)
    (2, 4, 2, 77, 131, 96),
    (1, 6, 1, 70, 70, 64),  # MQA: six query heads add into one dK, dV
    (1, 2, 2, 131, 131, 85),
    (1, 1, 1, 77, 77, 17),
    (1, 2, 2, 1, 257, 128),
    (1, 2, 2, 520, 520, 64),
]
# Every score very negative (q + 4, k - 4: about -128 at head_dim 64): L is too, and exp(0 - L) overflows float32, so a
# key past seq_k (a zero row of K, score 0) that is not masked turns dQ into NaN. A partial last tile of keys.
# float32 holds scores of -128 to about 1e-5, so what is computed from them is held to NEGATIVE_TOLERANCE x the
# largest |expected| of each tensor, or to twice plain float32 PyTorch's own largest error on the same inputs
# (measured in the same check) where that is more (a NaN, or a wrong step, is far outside either).
BACKWARD_NEGATIVE = ((1, 2, 2, 50, 100, 64), 4.0)
NEGATIVE_TOLERANCE = 1e-3
# The optional 16-bit backward part (steps 27-30), run in both types: (batch, heads, kv_heads, seq_q, seq_k, head_dim),
# each causal and not (causal needs seq_q <= seq_k). Lengths around its tiles (128 keys a block, 32 queries a tile),
# seq_q != seq_k both ways, grouped heads down to one key/value head, head_dim 64 and 128 (its two tile widths) and
# between, one the binding pads to a multiple of 8 (33), a query of length 1.
BACKWARD_HALF_CASES = [
    (1, 1, 1, 1, 1, 64),
    (2, 2, 2, 100, 100, 64),
    (1, 2, 2, 127, 129, 128),
    (2, 4, 2, 77, 131, 96),
    (1, 6, 1, 70, 70, 64),  # MQA: six query heads add into one dK, dV
    (1, 2, 2, 300, 100, 64),  # more queries than keys (not causal)
    (1, 3, 1, 130, 250, 40),
    (1, 2, 2, 77, 131, 33),  # padded to 40 by the binding
    (1, 2, 2, 1, 257, 128),
    (1, 2, 2, 520, 520, 128),  # five key blocks, 17 query tiles: every stage of Q and dO reused
]
# Every score very negative, as BACKWARD_NEGATIVE, in 16 bits: a key past seq_k that is not masked makes dQ NaN.
BACKWARD_HALF_NEGATIVE = ((1, 2, 2, 50, 200, 64), 4.0)
