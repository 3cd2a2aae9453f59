"""Warp-level PTX emulator: ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 and
mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, with registers as real 32-bit words (two fp16 halves,
lo = first element) and shared memory as a flat array of 16-bit words addressed in elements.

Layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type", "ldmatrix"):
  groupID g = lane / 4, threadID_in_group t = lane % 4
  A (16x16, row): a0 = A[g][2t,2t+1]  a1 = A[g+8][2t,2t+1]  a2 = A[g][2t+8,+9]  a3 = A[g+8][2t+8,+9]
  B (16x8, col):  b0 = B[2t,2t+1][g]  b1 = B[2t+8,2t+9][g]
  C/D (16x8):     c0,c1 = C[g][2t,2t+1]  c2,c3 = C[g+8][2t,2t+1]
  ldmatrix .x4: lanes 8i..8i+7 give the addresses of rows 0..7 of matrix i (8 consecutive b16 each, 16-byte
  aligned); lane l gets in r[i] M_i[l/4][2(l%4)], M_i[l/4][2(l%4)+1] (.trans: M_i^T, i.e. M_i[2(l%4)][l/4],
  M_i[2(l%4)+1][l/4]).
"""
import numpy as np

LANES = np.arange(32)
G = LANES // 4
TQ = LANES % 4


def f16_bits(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def bits_f(x):
    return np.asarray(x, dtype=np.uint16).view(np.float16).astype(np.float64)


def pack(lo, hi):
    """Half<T>::pack: two floats -> one 32-bit register, lo in the low half (per lane arrays)."""
    return f16_bits(lo).astype(np.uint32) | (f16_bits(hi).astype(np.uint32) << 16)


def unpack(r):
    r = np.asarray(r, dtype=np.uint32)
    return bits_f((r & 0xFFFF).astype(np.uint16)), bits_f((r >> 16).astype(np.uint16))


class Smem:
    """Shared memory as 16-bit words; records ldmatrix bank conflicts and misaligned accesses."""

    def __init__(self, n_elems):
        self.w = np.zeros(n_elems, dtype=np.uint16)
        self.events = []

    def store_matrix(self, base, ld, mat):
        r, c = mat.shape
        for i in range(r):
            self.w[base + i * ld: base + i * ld + c] = f16_bits(mat[i])

    def read_matrix(self, base, ld, rows, cols):
        return np.stack([bits_f(self.w[base + i * ld: base + i * ld + cols]) for i in range(rows)])

    def _check(self, addr, width, region, what):
        """Each lane's access of `width` 16-bit words: aligned to its size, and inside `region` (lo, hi) if given."""
        if np.any(addr % width):
            self.events.append(f"MISALIGNED {what}: {addr[addr % width != 0]}")
        if region is not None and (np.any(addr < region[0]) or np.any(addr + width > region[1])):
            self.events.append(f"OUT OF REGION {what}")

    def ldmatrix_x4(self, addr, trans=False, region=None, what=""):
        addr = np.asarray(addr, dtype=np.int64)
        assert addr.shape == (32,)
        self._check(addr, 8, region, f"ldmatrix row address (16 B) in {what}")
        # bank conflicts: each of the 4 phases (one matrix, 8 rows of 16 B) should hit 8 distinct 16-byte groups
        for i in range(4):
            groups = (addr[8 * i: 8 * i + 8] * 2 // 16) % 8
            if len(set(groups.tolist())) != 8:
                self.events.append(f"bank conflict ldmatrix matrix {i} in {what}: groups {groups.tolist()}")
        mats = [np.stack([self.w[addr[8 * i + r]: addr[8 * i + r] + 8] for r in range(8)]) for i in range(4)]
        regs = np.zeros((32, 4), dtype=np.uint32)
        for i, m in enumerate(mats):
            if trans:
                m = m.T
            lo = m[G, 2 * TQ].astype(np.uint32)
            hi = m[G, 2 * TQ + 1].astype(np.uint32)
            regs[:, i] = lo | (hi << 16)
        return regs

    def store_u32(self, addr, val, region=None, what=""):
        """Each lane stores one 32-bit register at element address addr (must be 4-byte aligned)."""
        addr = np.asarray(addr, dtype=np.int64)
        self._check(addr, 2, region, f"32-bit shared store in {what}")
        words = (addr // 2) % 32
        if len(set(words.tolist())) != 32:
            self.events.append(f"bank conflict 32-bit store in {what}")
        val = np.asarray(val, dtype=np.uint32)
        self.w[addr] = (val & 0xFFFF).astype(np.uint16)
        self.w[addr + 1] = (val >> 16).astype(np.uint16)


def frag_a_matrix(a):
    """a: (32, 4) uint32 -> the 16x16 A matrix it encodes."""
    A = np.full((16, 16), np.nan)
    for reg, (dr, dc) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
        lo, hi = unpack(a[:, reg])
        A[G + dr, 2 * TQ + dc] = lo
        A[G + dr, 2 * TQ + dc + 1] = hi
    assert not np.isnan(A).any()
    return A


def frag_b_matrix(b0, b1):
    B = np.full((16, 8), np.nan)
    for reg, dk in ((b0, 0), (b1, 8)):
        lo, hi = unpack(reg)
        B[2 * TQ + dk, G] = lo
        B[2 * TQ + dk + 1, G] = hi
    assert not np.isnan(B).any()
    return B


def c_to_matrix(c):
    """c: (32, 4) float -> 16x8."""
    C = np.full((16, 8), np.nan)
    C[G, 2 * TQ] = c[:, 0]
    C[G, 2 * TQ + 1] = c[:, 1]
    C[G + 8, 2 * TQ] = c[:, 2]
    C[G + 8, 2 * TQ + 1] = c[:, 3]
    return C


def mma16816(d, a, b0, b1):
    """d (32, 4) float32 accumulators updated in place: D = A B + C."""
    A, B, C = frag_a_matrix(a), frag_b_matrix(b0, b1), c_to_matrix(d)
    D = (A @ B + C).astype(np.float32)
    d[:, 0] = D[G, 2 * TQ]
    d[:, 1] = D[G, 2 * TQ + 1]
    d[:, 2] = D[G + 8, 2 * TQ]
    d[:, 3] = D[G + 8, 2 * TQ + 1]
