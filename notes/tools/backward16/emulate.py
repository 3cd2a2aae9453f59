"""bwd16.cu's block and tile logic on the CPU, in float64 (issue 58): the same key blocks, query tiles, first tile
of a causal block, masks, L = +inf past seq_q, zero rows past seq_k and per-tile dQ additions, with whole-tile
PyTorch products in place of the warps' mma fragments. What it checks is the arithmetic of indices and masks (not
the fragment layouts, which only the device run can): python notes/tools/backward16/emulate.py"""
import math

import torch

from bwd16 import CHECKS  # the device harness's cases


def emulate(q, k, v, out, dout, lse, causal, scale, block_m, block_n=128):
    b, h, seq_q, d = q.shape
    kvh, seq_k = k.shape[1], k.shape[2]
    group, causal_offset = h // kvh, seq_k - seq_q
    delta = (out * dout).sum(-1)
    dq_accum = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for x in range(b * kvh):  # blockIdx.x
        batch, kv_head = divmod(x, kvh)
        for y in range(math.ceil(seq_k / block_n)):  # blockIdx.y
            n0 = y * block_n
            k_tile = torch.zeros(block_n, d, dtype=q.dtype)
            v_tile = torch.zeros(block_n, d, dtype=q.dtype)
            valid = min(block_n, seq_k - n0)
            k_tile[:valid], v_tile[:valid] = k[batch, kv_head, n0:n0 + valid], v[batch, kv_head, n0:n0 + valid]
            first_tile = max(0, n0 - causal_offset) // block_m if causal else 0
            tiles_per_head = max(0, math.ceil(seq_q / block_m) - first_tile)
            dk_acc, dv_acc = torch.zeros(block_n, d, dtype=q.dtype), torch.zeros(block_n, d, dtype=q.dtype)
            for i in range(group * tiles_per_head):
                head = kv_head * group + i // tiles_per_head
                m0 = (first_tile + i % tiles_per_head) * block_m
                rows = min(block_m, seq_q - m0)
                q_tile, do_tile = torch.zeros(block_m, d, dtype=q.dtype), torch.zeros(block_m, d, dtype=q.dtype)
                q_tile[:rows], do_tile[:rows] = q[batch, head, m0:m0 + rows], dout[batch, head, m0:m0 + rows]
                lse_t = torch.full((block_m,), math.inf, dtype=q.dtype)
                delta_t = torch.zeros(block_m, dtype=q.dtype)
                lse_t[:rows], delta_t[:rows] = lse[batch, head, m0:m0 + rows], delta[batch, head, m0:m0 + rows]
                st = k_tile @ q_tile.T  # keys x queries
                pt = torch.exp(st * scale - lse_t[None, :])
                masked = n0 + block_n > seq_k or (causal and n0 + block_n - 1 > m0 + causal_offset)
                if masked:
                    key = n0 + torch.arange(block_n)[:, None]
                    query = torch.arange(block_m)[None, :]
                    drop = (key >= seq_k) | ((key > m0 + query + causal_offset) if causal else False)
                    pt = pt.masked_fill(drop, 0.0)
                dst = pt * (v_tile @ do_tile.T - delta_t[None, :])
                dv_acc += pt @ do_tile
                dk_acc += dst @ q_tile
                dq_tile = dst.T @ k_tile
                dq_accum[batch, head, m0:m0 + rows] += dq_tile[:rows]
            dk[batch, kv_head, n0:n0 + valid] = scale * dk_acc[:valid]
            dv[batch, kv_head, n0:n0 + valid] = dv_acc[:valid]
    return scale * dq_accum, dk, dv


def main():
    torch.manual_seed(0)
    worst = 0.0
    for case in CHECKS:
        b, h, kvh, sq, sk, d, causal, magnitude = case
        for block_m in (32, 64):
            q = (torch.randn(b, h, sq, d, dtype=torch.float64) * magnitude).requires_grad_()
            k, v = (torch.randn(b, kvh, sk, d, dtype=torch.float64).requires_grad_() for _ in range(2))
            dout = torch.randn(b, h, sq, d, dtype=torch.float64)
            scale = d ** -0.5
            s = q @ k.repeat_interleave(h // kvh, 1).transpose(-1, -2) * scale
            if causal:
                s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(sk - sq + 1), -math.inf)
            lse = torch.logsumexp(s, -1)
            out = torch.softmax(s, -1) @ v.repeat_interleave(h // kvh, 1)
            expected = torch.autograd.grad(out, (q, k, v), dout)
            got = emulate(q.detach(), k.detach(), v.detach(), out.detach(), dout, lse.detach(), causal, scale, block_m)
            errors = [((g - e).abs().max() / e.abs().max()).item() for g, e in zip(got, expected)]
            worst = max(worst, *errors)
            print(f"{case} block_m {block_m}: relative errors dq {errors[0]:.1e} dk {errors[1]:.1e} dv {errors[2]:.1e}")
    print(f"worst {worst:.1e}: {'ok' if worst < 1e-10 else 'WRONG'}")


if __name__ == "__main__":
    main()
