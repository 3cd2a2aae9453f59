"""Task 6: a small decoder-only language model.

Given: not graded; edits here are not submitted.

    tokens -> embedding -> N x [ x + attention(LayerNorm(x)), then x + SwiGLU(LayerNorm(x)) ]
           -> LayerNorm -> LM head -> logits

Its weights are random, drawn from a seed, so the model says nothing sensible, but every matrix is the size of a
real one and costs what a real one costs. What you write is the attention (task6/attention.py): it gets a layer's
input and that layer's `KVCache`, and runs your kernels through `self.kernels` (task 4's for the prompt, task 5's
for the cache and each new token). On the CPU, `PyTorchKernels` (common/torch_kernels.py) plays the kernels, so
the logic can be tested anywhere.

Generation is `logits = model(prompt, cache)` once (prefill: every prompt token at once), then
`logits = model(token, cache)` per new token (decode), with `cache = model.new_cache(batch)`. `DecodeGraph`
captures one decode step as a CUDA graph and replays it for each later token: your attention must then be
capturable (see KVCache.lengths). A batch of prompts of different lengths is padded on the left:
`model.new_cache(batch, key_start)` with key_start[b] the padding tokens before sequence b's prompt (`generate`
takes it too). `Config.kv_heads` below `heads` makes a grouped-query model: query head h reads key/value head
h // (heads // kv_heads), the layout of Llama 3, Mistral and Qwen.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from common.kernel_set import KernelSet
from common.validate import check_hidden


@dataclass(frozen=True)
class Config:
    vocab: int = 8192
    hidden: int = 4096
    heads: int = 32
    layers: int = 24
    kv_heads: int | None = None  # key/value heads: None is `heads` (one per query head), fewer is grouped-query
    mlp: int = 16384  # the SwiGLU's inner width: 4 x hidden
    max_seq: int = 1124  # positions the cache holds: the prompt and every new token
    rope_base: float = 10000.0

    def __post_init__(self):
        if self.kv_heads is not None and (not isinstance(self.kv_heads, int) or self.kv_heads < 1
                                          or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads must be a positive int dividing heads = {self.heads}, got {self.kv_heads!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def key_value_heads(self) -> int:
        """How many heads k, v and the cache have (kv_heads, or heads when it is None)."""
        return self.kv_heads or self.heads

    def layer_matrix_parameters(self) -> int:
        """The weights of one layer's products: q, k, v and the output projection, and the SwiGLU's three."""
        kv_width = self.key_value_heads * self.head_dim  # what k and v each project to
        return 2 * self.hidden**2 + 2 * self.hidden * kv_width + 3 * self.hidden * self.mlp

    def parameters(self) -> int:
        per_layer = self.layer_matrix_parameters() + 4 * self.hidden  # and two LayerNorms
        return self.layers * per_layer + 2 * self.vocab * self.hidden + 2 * self.hidden

    def as_dict(self) -> dict:
        return asdict(self)


# The course's sizes: "handout" is the run in the README (about 26 GB of float32 weights), "small" the same run
# for a GPU with 16 GB, "tiny" what the CPU tests use.
SIZES = {
    "handout": Config(),
    "small": Config(hidden=2048, heads=16, layers=12, mlp=8192),
    "tiny": Config(vocab=97, hidden=32, heads=4, layers=2, mlp=128, max_seq=24),
}


class Rope:
    """Rotary position embeddings: the pair (x_i, x_{i + d/2}) of a head is turned by angle position * base^(-2i/d)."""

    def __init__(self, head_dim: int, max_seq: int, base: float, device=None, dtype=torch.float32):
        if head_dim % 2:
            raise ValueError(f"rotary embeddings turn pairs of features: head_dim must be even, got {head_dim}")
        freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angle = torch.arange(max_seq, dtype=torch.float64)[:, None] * freq[None, :]  # (max_seq, head_dim / 2)
        # Full-width tables, the sine signed for the first half: a rotation is then x * cos + swap_halves(x) * sin,
        # three kernels where the pairwise form takes seven (a decode step's time goes largely to launching small
        # kernels). (cos, then sin) in one row per position, so one gather fetches both.
        self.cos_sin = torch.cat((angle.cos(), angle.cos(), -angle.sin(), angle.sin()), dim=-1).to(device=device,
                                                                                                   dtype=dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (batch, heads, n, head_dim) at `positions` (n,), or (batch, n) for each sequence its own, -> rotated,
        a new contiguous tensor."""
        batch, _, n, _ = x.shape
        if positions.shape not in ((n,), (batch, n)):
            raise ValueError(f"positions must hold one position per token, ({n},) or ({batch}, {n}), got "
                             f"{tuple(positions.shape)}")
        cos, sin = self.cos_sin[positions].chunk(2, dim=-1)  # (n, head_dim) or (batch, n, head_dim)
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # the same for every head
        x1, x2 = x.chunk(2, dim=-1)
        return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin)


class KVCache:
    """One layer's cache: K and V of every position so far, (batch, kv_heads, max_seq, head_dim) each.

    `length` is how many positions are written: positions 0 .. length - 1 hold the rotated keys and the values of
    the tokens seen so far. A head's keys are consecutive rows, so task 5's decode kernel reads them in one
    coalesced sweep.
    `lengths` holds the same count in GPU memory, int32 (batch,), one per sequence, for the kernels and RoPE: a
    decode step replayed as a CUDA graph repeats its launches with the arguments of the step it was captured at, so
    a Python int (`length`) would stay that step's value, while `lengths` is read anew at every replay. The model
    advances it after each call (one tensor shared by every layer: during a step every layer sees the count before
    it).
    `key_start` is None, or int32 (batch,) on the cache's device for a batch padded on the left:
    sequence b's first key_start[b] positions are padding, its prompt starts after them.
    """

    def __init__(self, batch: int, config: Config, device=None, dtype=torch.float32, key_start=None,
                 lengths=None):
        shape = (batch, config.key_value_heads, config.max_seq, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device) if lengths is None else lengths
        self.key_start = key_start

    @property
    def max_seq(self) -> int:
        return self.k.shape[2]


class Linear(nn.Linear):
    """nn.Linear (no bias), which hands the few rows of a decode step to `rows_kernel` once one is set.

    A decode step multiplies one row per sequence by every weight of the model: it is bound by how
    fast the weights are read, and cuBLAS's float32 product reads them at 62-75% of the copy
    bandwidth at 4 rows (H200 and H100). SmallLM.set_linear gives every layer task 5's given
    `linear` (common/csrc/linear_rows.cu), which streams them faster. The prefill's many rows, and a
    model without one, take F.linear.
    """

    rows_kernel = None  # (x (rows, in), weight (out, in), out (rows, out)) -> None, writing out; set_linear
    max_rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if (self.rows_kernel is None or rows > self.max_rows or self.in_features * x.element_size() % 16
                or self.bias is not None):  # the kernel reads 16 bytes at a time
            return F.linear(x, self.weight, self.bias)
        out = torch.empty(*x.shape[:-1], self.out_features, device=x.device, dtype=x.dtype)
        self.rows_kernel(x.reshape(rows, self.in_features).contiguous(), self.weight, out.view(rows, self.out_features))
        return out


class Attention(nn.Module):
    """What every attention of the model shares: the four projections, the head split and merge, RoPE.

    `forward(x, cache)` takes the layer's input x (batch, n, hidden) and returns
    (batch, n, hidden); task6/attention.py writes it.
    """

    def __init__(self, config: Config, rope: Rope, kernels: KernelSet | None = None, device=None, dtype=None):
        super().__init__()
        self.heads, self.head_dim = config.heads, check_hidden(config.hidden, config.heads)
        self.kv_heads = config.key_value_heads
        # q, k and v come from one matrix: one product reads the weights at a better bandwidth than three
        width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.qkv_proj = Linear(config.hidden, width, bias=False, device=device, dtype=dtype)
        self.o_proj = Linear(config.hidden, config.hidden, bias=False, device=device, dtype=dtype)
        self.rope, self.kernels = rope, kernels

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (batch, heads, n, head_dim), k and v (batch, kv_heads, n, head_dim) of x (batch, n, hidden), each
        contiguous, before RoPE."""
        batch, n, _ = x.shape
        qkv = self.qkv_proj(x)
        if self.kv_heads == self.heads:
            qkv = qkv.view(batch, n, 3, self.heads, self.head_dim)
            return tuple(qkv.permute(2, 0, 3, 1, 4).contiguous())  # one copy; each of the three is contiguous
        q, k, v = qkv.view(batch, n, -1, self.head_dim).split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        return tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, heads, n, head_dim) -> (batch, n, hidden)"""
        batch, heads, n, head_dim = x.shape
        return x.transpose(1, 2).reshape(batch, n, heads * head_dim)


class SwiGLU(nn.Module):
    def __init__(self, config: Config, device=None, dtype=None):
        super().__init__()
        make = lambda i, o: Linear(i, o, bias=False, device=device, dtype=dtype)  # noqa: E731
        self.gate_up = make(config.hidden, 2 * config.mlp)  # the gate's rows, then the up projection's
        self.down = make(config.mlp, config.hidden)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: Config, attention: nn.Module, device=None, dtype=None):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden, device=device, dtype=dtype)
        self.attention = attention
        self.norm2 = nn.LayerNorm(config.hidden, device=device, dtype=dtype)
        self.mlp = SwiGLU(config, device, dtype)

    def forward(self, x, cache):
        x = x + self.attention(self.norm1(x), cache)
        return x + self.mlp(self.norm2(x))


class SmallLM(nn.Module):
    """The model. `attention` is the class of each layer's attention (yours: task6.attention.CachedAttention).

    `seed` draws the weights (the same seed, device and dtype give the same weights in
    any process); `device="meta"` makes a model without memory, to `share_weights` into.
    """

    def __init__(self, config: Config, attention: type, kernels: KernelSet | None = None, device=None,
                 dtype=torch.float32, seed: int | None = 0):
        super().__init__()
        check_hidden(config.hidden, config.heads)
        self.config = config
        self.rope = Rope(config.head_dim, config.max_seq, config.rope_base,
                         device=None if str(device) == "meta" else device, dtype=dtype)
        self.embed = nn.Embedding(config.vocab, config.hidden, device=device, dtype=dtype)
        self.blocks = nn.ModuleList(Block(config, attention(config, self.rope, kernels, device, dtype), device, dtype)
                                    for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.hidden, device=device, dtype=dtype)
        self.head = Linear(config.hidden, config.vocab, bias=False, device=device, dtype=dtype)
        if seed is not None and str(device) != "meta":
            self.draw_weights(seed)

    @torch.no_grad()
    def draw_weights(self, seed: int) -> None:
        """Every matrix from N(0, 1 / fan_in) (embeddings N(0, 1)), LayerNorms 1 and 0, in a fixed order. A 16-bit
        model's are drawn in float32 and rounded: the float32 model's of the same seed, in its type."""
        gen = torch.Generator(device=self.embed.weight.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if "norm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                std = 1.0 if name == "embed.weight" else 1.0 / math.sqrt(p.shape[1])
                if p.dtype in (torch.bfloat16, torch.float16):
                    p.copy_(torch.empty(p.shape, device=p.device).normal_(0.0, std, generator=gen))
                else:
                    p.normal_(0.0, std, generator=gen)

    def share_weights(self, other: SmallLM) -> SmallLM:
        """Take `other`'s weights without copying them (this model must be made on the meta device)."""
        self.load_state_dict(other.state_dict(), assign=True)
        self.rope = other.rope
        for block in self.blocks:
            block.attention.rope = other.rope
        return self

    def set_kernels(self, kernels: KernelSet) -> SmallLM:
        for block in self.blocks:
            block.attention.kernels = kernels
        return self

    def set_linear(self, rows_kernel, max_rows: int) -> SmallLM:
        """Every Linear of the model hands up to max_rows rows to rows_kernel (task 5's `linear`, with its
        `linear_max_rows()`), the decode step's products; None: F.linear everywhere."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.rows_kernel, module.max_rows = rows_kernel, max_rows
        return self

    def new_cache(self, batch: int, key_start: torch.Tensor | None = None) -> list[KVCache]:
        """An empty cache for a new generation: one KVCache per layer.

        key_start (batch,) of ints: prompts padded on the left, sequence b's first key_start[b]
        tokens padding (None: no padding). Every layer shares it, as int32 on the model's device.
        """
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        w = self.embed.weight
        if key_start is not None:
            integers = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
            if (not isinstance(key_start, torch.Tensor) or key_start.shape != (batch,) or key_start.dtype not in integers
                    or not bool(((key_start >= 0) & (key_start <= self.config.max_seq)).all())):
                got = (f"{key_start.tolist()} ({key_start.dtype})" if isinstance(key_start, torch.Tensor)
                       else type(key_start).__name__)
                raise ValueError(f"key_start must hold one int from 0 to max_seq = {self.config.max_seq} per "
                                 f"sequence, shape ({batch},), got {got}")
            key_start = key_start.to(device=w.device, dtype=torch.int32)
        lengths = torch.zeros(batch, dtype=torch.int32, device=w.device)  # shared: advanced once per call
        return [KVCache(batch, self.config, w.device, w.dtype, key_start, lengths) for _ in self.blocks]

    def forward(self, tokens: torch.Tensor, cache: list[KVCache] | None = None, last: bool = False) -> torch.Tensor:
        """tokens (batch, n) -> logits (batch, n, vocab). With a cache, the tokens come after what it holds.

        last=True: the logits of the last position only, (batch, 1, vocab), all that
        generation needs (the LM head on every prompt position would cost TTFT for nothing).
        """
        self._check(tokens, cache)
        start = cache[0].length if cache is not None else 0
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache[i])
        if cache is not None:
            stuck = [i for i, c in enumerate(cache) if c.length != start + tokens.shape[1]]
            if stuck:
                raise RuntimeError(f"after {tokens.shape[1]} token(s) from position {start}, layer {stuck[0]}'s cache "
                                   f"has length {cache[stuck[0]].length}, expected {start + tokens.shape[1]}: "
                                   "CachedAttention.forward must set cache.length to what the cache now holds")
            cache[0].lengths += tokens.shape[1]  # on the GPU, and so replayed with a captured step
        return self.head(self.norm(x[:, -1:] if last else x))

    def _check(self, tokens, cache):
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long \
                or tokens.shape[1] < 1:
            got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be (batch, n) of torch.long with n >= 1, got {got}")
        if cache is None:
            if tokens.shape[1] > self.config.max_seq:
                raise ValueError(f"{tokens.shape[1]} tokens, but RoPE covers max_seq = {self.config.max_seq} positions")
            return
        if len(cache) != len(self.blocks) or cache[0].k.shape[0] != tokens.shape[0]:
            raise ValueError(f"cache must be model.new_cache(batch) for this model and the tokens' batch "
                             f"{tokens.shape[0]}")
        start, n = cache[0].length, tokens.shape[1]
        key_start = cache[0].key_start
        if start == 0 and key_start is not None and int(key_start.max()) > n:
            raise ValueError(f"key_start says {int(key_start.max())} padding tokens, but the prompt has {n}: "
                             "a padded prompt holds its padding and then its tokens")
        if start + n > cache[0].max_seq:
            raise ValueError(f"the cache is full: it holds max_seq = {cache[0].max_seq} positions, {start} written, "
                             f"and {n} more token(s) do not fit; make the model with a larger Config.max_seq")
        if start > 0 and n > 1:
            raise ValueError(f"{n} tokens after a prompt: after the prefill, decode one token at a time "
                             "(or start a new generation with model.new_cache)")

    @staticmethod
    def clear_cache(cache: list[KVCache]) -> None:
        """Make a used cache empty for a new generation (its padding kept), in the same memory: a DecodeGraph
        captured over it stays valid."""
        for c in cache:
            c.length = 0
        cache[0].lengths.zero_()

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, steps: int, key_start: torch.Tensor | None = None,
                 graph: bool = False) -> torch.Tensor:
        """Greedy generation: prompt (batch, n) -> the `steps` new tokens (batch, steps).

        key_start (batch,): prompts of different lengths padded on the left (see new_cache).
        graph: the decode steps as one CUDA graph, captured after the prefill (see DecodeGraph).
        """
        decoder = Decoder(self, graph=graph and steps > 1)
        token = decoder.prefill(prompt, key_start)[:, -1].argmax(-1, keepdim=True)
        out = [token]
        for _ in range(steps - 1):
            token = decoder.step(token)[:, -1].argmax(-1, keepdim=True)
            out.append(token)
        return torch.cat(out, dim=1)


class Decoder:
    """A model's generations, one after another: `prefill(prompt)` starts one, `step(token)` decodes a token.

    graph=True: the decode steps replay one step captured as a CUDA graph (DecodeGraph). The cache
    is then kept from one generation to the next of the same batch, emptied (clear_cache), so the
    graph captured in the first stays valid: capturing takes a while, and an inference engine
    captures once, not once per request.
    """

    def __init__(self, model: SmallLM, graph: bool = False):
        self.model, self.graph = model, graph
        self.cache = self.step_graph = None

    def prefill(self, prompt: torch.Tensor, key_start=None, last: bool = True) -> torch.Tensor:
        """A new generation from prompt (batch, n): its logits, the last position's only with last=True."""
        reuse = (self.step_graph is not None and key_start is None and self.cache[0].key_start is None
                 and self.cache[0].k.shape[0] == prompt.shape[0])
        if reuse:
            self.model.clear_cache(self.cache)
        else:
            self.cache = self.step_graph = None  # the last generation's cache goes before the next is made
            self.cache = self.model.new_cache(prompt.shape[0], key_start)
        logits = self.model(prompt, self.cache, last=last)
        if self.graph and self.step_graph is None:
            self.step_graph = DecodeGraph(self.model, self.cache)
        return logits

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """token (batch, 1) -> logits (batch, 1, vocab); with a graph, a buffer the next step overwrites."""
        return self.step_graph(token) if self.step_graph is not None else self.model(token, self.cache, last=True)


class DecodeGraph:
    """One decode step of `model` over `cache`, captured once as a CUDA graph and replayed for each new token.

    A decode step launches hundreds of small kernels (every layer's projections, RoPE, the cache,
    attention, the MLP); launched from Python one at a time, the GPU idles while the host prepares
    the next. Captured, the whole step is one launch. Capture records the kernels without running
    them, with the arguments they had: so everything that changes from one token to the next must
    live in GPU memory (the token, in `self.token`; the positions, in cache.lengths), nothing may
    read a GPU value back to the host (it is not computed yet: CUDA refuses), and all work must
    go to the current stream. `self.logits` is the output buffer every replay overwrites.

    Made after the prefill: it runs one step first, on a side stream (a warm-up, as PyTorch asks
    before a capture: first calls allocate and initialise libraries), then takes that step back
    (its row is written again by the next real step).
    """

    def __init__(self, model: SmallLM, cache: list[KVCache]):
        if not cache or cache[0].length == 0:
            raise ValueError("DecodeGraph captures a decode step: make it after the prefill filled the cache")
        self.model, self.cache = model, cache
        self.token = torch.zeros(cache[0].k.shape[0], 1, dtype=torch.long, device=cache[0].k.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            model(self.token, cache, last=True)
        torch.cuda.current_stream().wait_stream(side)
        self._take_back_one_step()
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.logits = model(self.token, cache, last=True)  # runs the Python once, none of the GPU work
        for c in cache:
            c.length -= 1  # the Python counted a step the GPU did not run

    def _take_back_one_step(self):
        for c in self.cache:
            c.length -= 1
        self.cache[0].lengths -= 1

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        """token (batch, 1) -> logits (batch, 1, vocab): one decode step, replayed."""
        first = self.cache[0]
        if first.length >= first.max_seq:
            raise ValueError(f"the cache is full: it holds max_seq = {first.max_seq} positions, all written; make the "
                             "model with a larger Config.max_seq")
        self.token.copy_(token)
        self.graph.replay()
        for c in self.cache:
            c.length += 1
        return self.logits
