"""Task 5's stand-in kernels: the cache's update and the decode (contiguous, paged, 16-bit), the linear rows."""

from __future__ import annotations

import contextlib
import math

import torch


from harness.attention_math import expand_kv_heads
from tests.stand_in.gpu import BYTES_PER_S, launched, run_kernel
from tests.stand_in.kernels import (StandInKernels, attention_in_torch, check_cuda_float32, check_dim, check_finite,
                                    check_key_start, check_no_overlap, check_per_sequence, overlaps, with_padding)


class Task5Kernels(StandInKernels):
    """task5/binding.cpp's `update_cache`, `decode` and `splits_for` (and step 6's `update_cache_half` and
    `decode_half`), computed in PyTorch."""

    MAX_SPLITS = 256
    half = None  # during a call of step 6's: the cache's 16-bit type, which every tensor of the call must have

    def _check_type(self, t, name):
        if self.half is None:
            return check_cuda_float32(t, name)
        if getattr(t, "on_host", False):
            raise RuntimeError(f"{name} must be a CUDA tensor, got one on cpu (move it with .cuda())")
        if t.dtype != self.half:
            raise RuntimeError(f"{name} must be {str(self.half)[6:]} like k_cache, got {str(t.dtype)[6:]}")
        if not t.is_contiguous():
            raise RuntimeError(f"{name} must be contiguous (call .contiguous() first)")

    @contextlib.contextmanager
    def _half_call(self, k_cache):
        """A call of step 6's: the binding's cache_type first, then the float32 call's checks for that type."""
        if k_cache.dtype not in (torch.bfloat16, torch.float16):
            raise RuntimeError(f"k_cache must be bfloat16 or float16 for the 16-bit cache (update_cache_half, "
                               f"decode_half), got {str(k_cache.dtype)[6:]} (a float32 cache goes to update_cache "
                               "and decode)")
        self.half = k_cache.dtype
        try:
            yield
        finally:
            self.half = None

    def _check_cache(self, k_cache, v_cache):
        self._check_type(k_cache, "k_cache")
        check_dim(k_cache, "k_cache", 4)
        self._check_type(v_cache, "v_cache")
        if v_cache.shape != k_cache.shape:
            raise RuntimeError(f"v_cache must have k_cache's shape {list(k_cache.shape)} (batch, heads, max_seq, "
                               f"head_dim), got {list(v_cache.shape)}")
        if overlaps(k_cache, v_cache):
            raise RuntimeError("k_cache and v_cache must not share memory")
        if k_cache.shape[3] > self.max_head_dim():
            raise RuntimeError(f"head_dim (k_cache.size(3)) must be at most {self.max_head_dim()}, "
                               f"got {k_cache.shape[3]}")

    def _check_matches(self, t, name, k_cache, what):
        self._check_type(t, name)
        check_dim(t, name, 4)
        if (t.shape[0], t.shape[1], t.shape[3]) != (k_cache.shape[0], k_cache.shape[1], k_cache.shape[3]):
            raise RuntimeError(f"{name} must be {what} with the cache's batch, heads and head_dim (k_cache is "
                               f"{list(k_cache.shape)}), got {list(t.shape)}")

    @launched
    def update_cache(self, k_new, v_new, k_cache, v_cache, pos):
        self._check_cache(k_cache, v_cache)
        self._check_matches(k_new, "k_new", k_cache, "(batch, heads, n_new, head_dim)")
        if v_new.shape != k_new.shape:
            raise RuntimeError(f"v_new must have k_new's shape {list(k_new.shape)}, got {list(v_new.shape)}")
        n_new, max_seq = k_new.shape[2], k_cache.shape[2]
        if isinstance(pos, torch.Tensor):  # one position per sequence, read by the kernel: no fit, no write
            check_per_sequence(pos, "pos", "the first new position", k_cache.shape[0])
            with self.work(2 * k_new.nbytes / BYTES_PER_S):
                if self.behaviour.update_rows_late:
                    return self._update_late(k_new, v_new, k_cache, v_cache, pos.tolist())
                for b, p in enumerate(pos.tolist()):
                    if 0 <= p <= max_seq - n_new:
                        k_cache[b, :, p:p + n_new], v_cache[b, :, p:p + n_new] = k_new[b], v_new[b]
            return
        if pos < 0:
            raise RuntimeError(f"pos must be at least 0, got {pos}")
        if pos + n_new > max_seq:
            raise RuntimeError(f"pos + n_new must be at most max_seq: the cache holds {max_seq} positions, and "
                               f"writing {n_new} at pos {pos} would end at {pos + n_new}")
        with self.work(2 * k_new.nbytes / BYTES_PER_S):
            if self.behaviour.update_rows_late:
                return self._update_late(k_new, v_new, k_cache, v_cache, [pos] * k_cache.shape[0])
            k_cache[:, :, pos:pos + n_new] = k_new
            v_cache[:, :, pos:pos + n_new] = v_new

    def _update_late(self, k_new, v_new, k_cache, v_cache, pos):
        """Behaviour.update_rows_late: new row t of head bh at flat row bh * max_seq + pos[b] + t + late of the
        cache's memory, whatever lies there (the next head's rows; past the end, the guard band); a sequence
        whose rows do not fit writes nothing."""
        late, (batch, heads, max_seq, d), n_new = self.behaviour.update_rows_late, k_cache.shape, k_new.shape[2]
        assert late > 0, "update_rows_late is a count of rows late (> 0)"
        for cache, new in ((k_cache, k_new), (v_cache, v_new)):
            memory = torch.empty(0, dtype=cache.dtype).set_(cache.untyped_storage(), cache.storage_offset(),
                                                            (batch * heads * max_seq + late, d))
            per_head = new.reshape(batch * heads, n_new, d)
            for bh in range(batch * heads):
                p = pos[bh // heads]
                if 0 <= p <= max_seq - n_new:
                    at = bh * max_seq + p + late
                    memory[at:at + n_new] = per_head[bh]

    @launched
    def update_cache_half(self, k_new, v_new, k_cache, v_cache, pos):
        kept = [c.clone() for c in (k_cache, v_cache)] if self.behaviour.half == "unwritten" else None
        with self._half_call(k_cache):
            self.update_cache.__wrapped__(self, k_new, v_new, k_cache, v_cache, pos)
        if kept is not None:
            k_cache.copy_(kept[0])
            v_cache.copy_(kept[1])

    @launched
    def decode_half(self, q, k_cache, v_cache, out, length, scale, splits=0, key_start=None):
        """Step 6's decode: the float32 decode's checks for the cache's type, computed in float32, written in it."""
        with self._half_call(k_cache):
            kept = out.clone() if self.behaviour.half == "unwritten" else None
            self.decode.__wrapped__(self, q, k_cache, v_cache, out, length, scale, splits, key_start)
        if self.behaviour.half == "wrong":
            out.mul_(1.01)
        elif kept is not None:
            out.copy_(kept)

    def has_half(self):
        return True

    @launched
    def decode(self, q, k_cache, v_cache, out, length, scale, splits=0, key_start=None):
        self._check_cache(k_cache, v_cache)
        self._check_type(q, "q")
        check_dim(q, "q", 4)
        if q.shape[0] != k_cache.shape[0] or q.shape[3] != k_cache.shape[3]:
            raise RuntimeError(f"q must be (batch, heads, 1, head_dim) with the cache's batch ({k_cache.shape[0]}) and "
                               f"head_dim ({k_cache.shape[3]}), got {list(q.shape)}")
        heads, kv_heads = q.shape[1], k_cache.shape[1]
        if heads % kv_heads:
            raise RuntimeError(f"the cache's heads (kv_heads = k_cache.size(1)) must divide q's heads: each group of "
                               f"heads / kv_heads query heads shares one key/value head; got heads = {heads} and "
                               f"kv_heads = {kv_heads}")
        if q.shape[2] != 1:
            raise RuntimeError(f"q must hold one query per (batch, head) (q.size(2) == 1), got shape {list(q.shape)}")
        self._check_type(out, "out")
        if out.shape != q.shape:
            raise RuntimeError(f"out must have q's shape {list(q.shape)}, got {list(out.shape)}")
        per_sequence = isinstance(length, torch.Tensor)
        if per_sequence:
            check_per_sequence(length, "length", "the positions of the cache written so far", q.shape[0])
        elif not 1 <= length <= k_cache.shape[2]:
            raise RuntimeError(f"length must be between 1 and max_seq = {k_cache.shape[2]} (the positions of the "
                               f"cache written so far), got {length}")
        if not 0 <= splits <= self.MAX_SPLITS:
            raise RuntimeError(f"splits must be between 0 (let the launcher choose) and {self.MAX_SPLITS}, "
                               f"got {splits}")
        check_finite(scale)
        for t, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
            check_no_overlap(out, "out", t, name)
        row_bytes = k_cache.element_size() * k_cache.shape[3]  # as stored: 16-bit rows take half the time
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()  # 16-bit ones computed in float32
        short = int(self.behaviour.decode_one_short)

        def attend(q, k, v):  # no row at all: 0 / 0, as a kernel's O / l
            return (attention_in_torch(q, k, v, False, self.applied(scale)) if k.shape[-2]
                    else torch.full_like(q, math.nan))
        if per_sequence:  # each sequence over its own rows; a length or key_start out of range gives NaN
            if key_start is not None:
                check_per_sequence(key_start, "key_start", "one first valid key", q.shape[0])
            starts = [0] * q.shape[0] if key_start is None else key_start.tolist()
            with self.work(2 * k_cache[..., 0].numel() * row_bytes / BYTES_PER_S):
                for b, (end, first) in enumerate(zip(length.tolist(), starts)):
                    if not 0 <= first < end <= k_cache.shape[2]:
                        self.write(out[b:b + 1], torch.full_like(q[b:b + 1], math.nan))
                        continue
                    k, v = (expand_kv_heads(c[b:b + 1, :, first:end - short], heads) for c in (k_cache, v_cache))
                    self.write(out[b:b + 1], attend(q[b:b + 1], k, v))
            return
        check_key_start(key_start, q.shape[0], length - 1, "length - 1")
        with self.work(2 * k_cache[:, :, :length, 0].numel() * row_bytes / BYTES_PER_S):  # K, V once, each head once
            k, v = (expand_kv_heads(c[:, :, :length - short], heads) for c in (k_cache, v_cache))
            self.write(out, with_padding(attend, q, k, v, key_start))

    def _check_pages_type(self, k_pages, half: bool):
        """The binding's pages_type: float32 pools for step 5's functions, 16-bit ones for step 7's."""
        sixteen = k_pages.dtype in (torch.bfloat16, torch.float16)
        if not half and sixteen:
            raise RuntimeError(f"k_pages must be float32 for update_cache_paged and decode_paged, got "
                               f"{str(k_pages.dtype)[6:]} (a bfloat16 or float16 pool goes to update_cache_paged_half "
                               "and decode_paged_half: README, Task 5, step 7)")
        if half and not sixteen:
            raise RuntimeError(f"k_pages must be bfloat16 or float16 for the 16-bit paged cache "
                               f"(update_cache_paged_half, decode_paged_half), got {str(k_pages.dtype)[6:]} (a "
                               "float32 pool goes to update_cache_paged and decode_paged)")
        if not half:
            check_cuda_float32(k_pages, "k_pages")
        page_size = k_pages.shape[2]
        if page_size & (page_size - 1):
            raise RuntimeError(f"page_size (k_pages.size(2)) must be a power of two, got {page_size}")

    @launched
    def update_cache_paged(self, k_new, v_new, k_pages, v_pages, block_table, pos, half=False):
        """task5/binding.cpp's update_cache_paged: each new row into the page its block table names."""
        self._check_pages_type(k_pages, half)
        for row, name in ((k_new, "k_new"), (v_new, "v_new")):
            if half and row.dtype != k_pages.dtype:
                raise RuntimeError(f"{name} must be {str(k_pages.dtype)[6:]} like k_pages, got {str(row.dtype)[6:]}")
        check_per_sequence(pos, "pos", "the first new position", block_table.shape[0])
        page_size, max_pages, n_new = k_pages.shape[2], block_table.shape[1], k_new.shape[2]
        with self.work(2 * k_new.nbytes / BYTES_PER_S):
            for b, p in enumerate(pos.tolist()):
                if not 0 <= p <= max_pages * page_size - n_new:
                    continue
                for t in range(n_new):
                    page = int(block_table[b, (p + t) // page_size])
                    if 0 <= page < k_pages.shape[0]:
                        k_pages[page, :, (p + t) % page_size] = k_new[b, :, t]
                        v_pages[page, :, (p + t) % page_size] = v_new[b, :, t]

    @launched
    def decode_paged(self, q, k_pages, v_pages, out, block_table, length, scale, splits=0, key_start=None,
                     half=False):
        """task5/binding.cpp's decode_paged: the pages gathered into a contiguous cache, then decode; a sequence
        whose table names a page outside the pool for a row it holds gets NaN (its length taken as 0)."""
        self._check_pages_type(k_pages, half)
        check_per_sequence(length, "length", "the positions of the cache written so far", block_table.shape[0])
        page_size, num_pages = k_pages.shape[2], k_pages.shape[0]
        lengths = length.tolist()
        k, v = (pages[block_table.clamp(0, num_pages - 1).long()] for pages in (k_pages, v_pages))
        k, v = (t.permute(0, 2, 1, 3, 4).flatten(2, 3).contiguous() for t in (k, v))  # (batch, kv_heads, rows, d)
        for b, end in enumerate(lengths):
            used = block_table[b, :max(0, -(-end // page_size))]
            if bool(((used < 0) | (used >= num_pages)).any()):
                lengths[b] = 0
        if half and self.behaviour.paged_half == "wrong":  # each sequence's last row read from its first
            for b, end in enumerate(lengths):
                if end > 1:
                    k[b, :, end - 1], v[b, :, end - 1] = k[b, :, 0], v[b, :, 0]
        fixed = torch.tensor(lengths, dtype=torch.int32)
        fixed.on_host = False
        decode = self.decode_half if half else self.decode
        run_kernel(lambda: decode.__wrapped__(self, q, k, v, out, fixed, scale, splits, key_start), (), {})

    @launched
    def update_cache_paged_half(self, k_new, v_new, k_pages, v_pages, block_table, pos):
        """Step 7's: update_cache_paged for a pool of 16-bit values."""
        self.update_cache_paged.__wrapped__(self, k_new, v_new, k_pages, v_pages, block_table, pos, half=True)

    @launched
    def decode_paged_half(self, q, k_pages, v_pages, out, block_table, length, scale, splits=0, key_start=None):
        """Step 7's: decode_paged over a pool of 16-bit values (step 6's decode on the gathered rows)."""
        self.decode_paged.__wrapped__(self, q, k_pages, v_pages, out, block_table, length, scale, splits, key_start,
                                      half=True)

    def splits_for(self, batch, heads, kv_heads, max_length, head_dim):
        return max(1, min(self.MAX_SPLITS, max_length // 512))

    @launched
    def linear(self, x, weight, out):
        """The given product of a decode step's rows with a weight (common/csrc/linear_rows.cu), in float32 or in
        the weight's 16-bit type."""
        if weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise RuntimeError(f"weight must be float32, bfloat16 or float16, got {str(weight.dtype)[6:]}")
        for t, name in ((weight, "weight"), (x, "x"), (out, "out")):
            if weight.dtype == torch.float32:
                check_cuda_float32(t, name)
            elif getattr(t, "on_host", False):
                raise RuntimeError(f"{name} must be a CUDA tensor, got one on cpu (move it with .cuda())")
            elif t.dtype != weight.dtype:
                raise RuntimeError(f"{name} must be {str(weight.dtype)[6:]} like weight, got {str(t.dtype)[6:]}")
            elif not t.is_contiguous():
                raise RuntimeError(f"{name} must be contiguous (call .contiguous() first)")
        for t, name in ((x, "x"), (weight, "weight"), (out, "out")):
            check_dim(t, name, 2)
        if not 1 <= x.shape[0] <= self.linear_max_rows():
            raise RuntimeError(f"x must hold 1 to {self.linear_max_rows()} rows (one token per sequence), got shape "
                               f"{list(x.shape)}")
        per_load = 16 // x.element_size()
        if weight.shape[1] != x.shape[1] or x.shape[1] % per_load:
            raise RuntimeError(f"weight must be (out_features, {x.shape[1]}) and in_features a multiple of "
                               f"{per_load}, got {list(weight.shape)}")
        if tuple(out.shape) != (x.shape[0], weight.shape[0]):
            raise RuntimeError(f"out must be (rows, out_features) = {[x.shape[0], weight.shape[0]]}, got {list(out.shape)}")
        out.copy_(x.float() @ weight.float().t())  # float32 sums, rounded once to the type

    def linear_max_rows(self):
        return 8

    def max_head_dim(self):
        return 128

    def max_splits(self):
        return self.MAX_SPLITS
