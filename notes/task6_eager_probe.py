"""Issue 31: what lengths on the GPU cost a decode step launched from Python (eager), against the int form.

python notes/task6_eager_probe.py  (a GPU with 40 GB: the handout's model)
Both attentions run the reference kernels in one process, on the same weights and cache, timed alike
(host clock around STEPS decode steps after a warm-up, median of REPS), eager and as a CUDA graph.
"""

import statistics
import time

import torch

from task5.attention import built_kernels
from task6.model import SIZES, Decoder, SmallLM
from task6.solution.attention import CachedAttention

STEPS, REPS = 50, 5


class IntAttention(CachedAttention):
    """The attention as it was before issue 31: Python ints for the positions and lengths."""

    def forward(self, x, cache):
        q, k, v = self.project(x)
        positions = torch.arange(cache.length, cache.length + x.shape[1], device=x.device)
        q, k = self.rope(q, positions), self.rope(k, positions)
        if cache.length == 0:
            out = self.prefill(q, k, v, cache)
        else:
            self.kernels.update_cache(k, v, cache.k, cache.v, cache.length)
            out = self.kernels.decode(q, cache.k, cache.v, cache.length + 1, cache.key_start)
        cache.length += x.shape[1]
        return self.o_proj(self.merge_heads(out))


def time_steps(model, graph):
    decoder = Decoder(model, graph)
    prompt = torch.randint(0, model.config.vocab, (4, 1024), device="cuda")
    times = []
    with torch.no_grad():
        for _ in range(REPS):
            token = decoder.prefill(prompt)[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(STEPS):
                token = decoder.step(token)[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) / STEPS * 1e3)
    return statistics.median(times)


def main():
    kernels = built_kernels(solution=True)
    model = SmallLM(SIZES["handout"], CachedAttention, kernels, device="cuda")
    old = SmallLM(SIZES["handout"], IntAttention, device="meta").share_weights(model).set_kernels(kernels)
    print(torch.cuda.get_device_name())
    for _ in range(2):  # twice, interleaved: drift shows
        print(f"int form, eager: {time_steps(old, False):.2f} ms per step")
        print(f"lengths on the GPU, eager: {time_steps(model, False):.2f} ms per step")
        print(f"lengths on the GPU, CUDA graph: {time_steps(model, True):.2f} ms per step")


if __name__ == "__main__":
    main()
