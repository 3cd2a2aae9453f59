"""Task 5's handout generation (batch 16, prompt 1024, hidden 4096, 32 heads, 100 steps): TTFT and TBT of your
cached layer in the worker, every output checked against float64, then nn.MultiheadAttention and the same layer over
SDPA (SdpaKernels) timed here on the same clock. Run by measure.run_benchmarks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from harness import bench
from harness.checks import compare, exact_float32, within
from common.kernel_set import hidden_keys
from common.layer import mha_weights
from harness.attention_math import causal_mask
from harness.sandbox import WorkerError
from task5.attention import TASK4_DID_NOT_BUILD
from checks.task5.cases import ATOL, REPS, RTOL

HANDOUT = dict(batch=16, prompt=1024, max_seq=2048, hidden=4096, heads=32, steps=100)


class SdpaKernels:
    """PyTorch's SDPA as the kernel set (common/kernel_set.py) of the same cached layer: the trusted side's
    baseline, the cache updated in place. It checks nothing of its inputs (the checks make them)."""

    def attention(self, q, k, v, causal, key_start=None, *, window_left=None, softcap=None):
        if window_left is not None or softcap is not None:
            raise ValueError("the SDPA baseline takes no masks beyond causal (window_left, softcap)")
        gqa = k.shape[1] != q.shape[1]
        if key_start is None and not (causal and q.shape[2] != k.shape[2]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        # SDPA's is_causal aligns the queries with the first keys; here they are the last ones, so the mask is ours
        hidden, padded = hidden_keys(q.shape[2], k.shape[2], causal, None if key_start is None else key_start.long(),
                                     q.device)
        if padded is not None:
            hidden = hidden & ~padded  # a padding query sees every key (a finite row), then its row is zeros
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=~hidden, enable_gqa=gqa)
        return out if padded is None else out.masked_fill(padded, 0.0)

    def update_cache(self, k_new, v_new, k_cache, v_cache, pos):
        n = k_new.shape[2]
        if not isinstance(pos, torch.Tensor):
            k_cache[:, :, pos:pos + n], v_cache[:, :, pos:pos + n] = k_new, v_new
            return
        for b, p in enumerate(pos.tolist()):
            k_cache[b, :, p:p + n], v_cache[b, :, p:p + n] = k_new[b], v_new[b]

    def decode(self, q, k_cache, v_cache, length, key_start=None):
        if not isinstance(length, torch.Tensor):
            return self.attention(q, k_cache[:, :, :length], v_cache[:, :, :length], False, key_start)
        return torch.cat([self.attention(q[b:b + 1], k_cache[b:b + 1, :, :end], v_cache[b:b + 1, :, :end], False,
                                         None if key_start is None else key_start[b:b + 1])
                          for b, end in enumerate(length.tolist())])


def generation_inputs(rng_seed):
    g = HANDOUT
    gen = torch.Generator(device="cuda").manual_seed(rng_seed)
    x = torch.randn(g["batch"], g["prompt"] + g["steps"], g["hidden"], device="cuda", generator=gen)
    return x[:, :g["prompt"]].contiguous(), x[:, g["prompt"]:].contiguous(), x


PREFILL_WRONG = "prefill output"  # how check_generation's message starts when the prompt's outputs are wrong


def check_generation(reference, x, out_prompt, out_steps):
    """The handout run's outputs against float64 nn.MultiheadAttention on the whole sequence."""
    g = HANDOUT
    seq = g["prompt"] + g["steps"]
    with torch.no_grad(), exact_float32():
        x64 = x.double()
        expected, _ = reference(x64, x64, x64, attn_mask=causal_mask(seq, seq, "cuda"), need_weights=False)
    atol = ATOL * float(expected.abs().max())
    for name, got, want in ((PREFILL_WRONG, out_prompt, expected[:, :g["prompt"]]),
                            ("decode steps' output", out_steps, expected[:, g["prompt"]:])):
        if within(got, want, atol=atol, rtol=RTOL):  # on the GPU: compare copies half a gigabyte to the CPU
            continue
        result = compare(got, want, atol=atol, rtol=RTOL, name=name)
        if not result.passed:
            raise AssertionError(result.message)


def time_student_generation(worker, prefill: str = "task4"):
    """TTFT and TBT of your layer in the worker, every output checked: (ttft, tbt, prefill) with the Timings
    and what the prompt ran, or a message. prefill "pytorch": the prompt's attention in plain PyTorch (your
    Task 4 kernel failed the layer's checks); a Task 4 kernel that is wrong only at this size is run once,
    then replaced the same way, so Task 5's timings do not wait for it."""
    g = HANDOUT
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(g["hidden"], g["heads"], bias=False, batch_first=True)
    weights = [w.cuda() for w in mha_weights(mha)]
    reference = mha.to("cuda", torch.float64)
    worker.call("make_layer", g["hidden"], g["heads"], g["max_seq"], weights, prefill)
    ttft, tbt = [], []
    try:
        for rep in range(REPS - 2):
            prompt, steps, x = generation_inputs(rep)
            out_prompt = torch.full((g["batch"], g["prompt"], g["hidden"]), math.nan, device="cuda")
            out_steps = torch.full((g["batch"], g["steps"], g["hidden"]), math.nan, device="cuda")
            ttft.append(bench.host_clock(lambda: worker.call("prefill", prompt, out_prompt), reps=1, per_request=1))
            tbt.append(bench.host_clock(lambda: worker.call("steps", steps, out_steps), reps=1,
                                        per_request=g["steps"]))
            check_generation(reference, x, out_prompt, out_steps)
    except AssertionError as err:
        if prefill == "task4" and str(err).startswith(PREFILL_WRONG):
            return time_student_generation(worker, "pytorch")
        return str(err)
    except WorkerError as err:
        if prefill == "task4" and TASK4_DID_NOT_BUILD in err.message:
            return time_student_generation(worker, "pytorch")
        return f"raised {err.kind}: {err.message}"
    return median_of(ttft), median_of(tbt), prefill


def median_of(timings):
    return sorted(timings, key=lambda t: t.median_ms)[len(timings) // 2]


def generation_result(student):
    """The handout's numbers: TTFT and TBT against nn.MultiheadAttention and SDPA over the same cache."""
    if isinstance(student, str):
        return False, student, {}
    ttft, tbt, prefill = student
    g = HANDOUT
    by = "" if prefill == "task4" else " (TTFT with a prefill in plain PyTorch: your Task 4 kernel's was wrong)"
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(g["hidden"], g["heads"], bias=False, batch_first=True, device="cuda")
    prompt, steps, x = generation_inputs(0)
    mask = causal_mask(g["prompt"], g["prompt"], "cuda")

    def time_mha_prompt():
        with torch.no_grad(), exact_float32():
            run = lambda: (mha(prompt, prompt, prompt, attn_mask=mask, need_weights=False),  # noqa: E731
                           torch.cuda.synchronize())
            run()
            return bench.host_clock(run, reps=3, per_request=1)

    def time_mha_recompute():
        """nn.MultiheadAttention over every token so far, for every 10th step: no cache, the whole sequence."""
        samples = []
        with torch.no_grad(), exact_float32():
            for t in range(0, g["steps"], 10):
                seen = x[:, :g["prompt"] + t + 1]
                m = causal_mask(seen.shape[1], seen.shape[1], "cuda")
                run = lambda: (mha(seen, seen, seen, attn_mask=m, need_weights=False),  # noqa: E731
                               torch.cuda.synchronize())
                run()
                samples.append(bench.host_clock(run, reps=1, per_request=1).median_ms)
        return sum(samples) / len(samples)

    def time_sdpa_layer():
        from task5.attention import CachedMultiHeadAttention

        layer = CachedMultiHeadAttention(g["hidden"], g["heads"], g["max_seq"], device="cuda", kernels=SdpaKernels())
        layer.load_from_torch(mha)
        with torch.no_grad(), exact_float32():
            layer.prefill(prompt)
            t_prefill = bench.host_clock(lambda: (layer.prefill(prompt), torch.cuda.synchronize()), reps=3,
                                         per_request=1)

            def run_steps():
                for i in range(g["steps"]):
                    layer.step(steps[:, i:i + 1])
                torch.cuda.synchronize()
            t_steps = bench.host_clock(run_steps, reps=3, per_request=g["steps"], before=lambda: layer.prefill(prompt))
        return t_prefill, t_steps

    t_mha = bench.or_out_of_memory(time_mha_prompt)
    recompute_ms = bench.or_out_of_memory(time_mha_recompute)
    sdpa = bench.or_out_of_memory(time_sdpa_layer)
    torch.cuda.empty_cache()
    metrics = {"ttft_ms": ttft.median_ms, "tbt_ms": tbt.median_ms}
    message = (f"batch {g['batch']} prompt {g['prompt']} hidden {g['hidden']} heads {g['heads']}, "
               f"{g['steps']} steps: TTFT {ttft.median_ms:.2f} ms{by}, TBT {tbt.median_ms:.3f} ms")
    if not isinstance(t_mha, str):
        metrics |= {"ttft_mha_ms": t_mha.median_ms, "ttft_speedup_vs_mha": t_mha.median_ms / ttft.median_ms}
        message += (f"; nn.MultiheadAttention on the prompt {t_mha.median_ms:.2f} ms "
                    f"({metrics['ttft_speedup_vs_mha']:.2f}x)")
    if not isinstance(recompute_ms, str):
        metrics |= {"tbt_recompute_ms": recompute_ms, "tbt_speedup_vs_recompute": recompute_ms / tbt.median_ms}
        message += (f"; recomputing nn.MultiheadAttention over every token per step {recompute_ms:.2f} ms "
                    f"({metrics['tbt_speedup_vs_recompute']:.1f}x)")
    if not isinstance(sdpa, str):
        t_prefill, t_steps = sdpa
        metrics |= {"ttft_sdpa_ms": t_prefill.median_ms, "tbt_sdpa_ms": t_steps.median_ms,
                    "tbt_speedup_vs_sdpa": t_steps.median_ms / tbt.median_ms}
        message += (f"; SDPA over the same cache: TTFT {t_prefill.median_ms:.2f} ms, TBT {t_steps.median_ms:.3f} ms "
                    f"({metrics['tbt_speedup_vs_sdpa']:.2f}x)")
    return True, message, metrics
