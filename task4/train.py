"""A small model that trains through your kernels: the backward part's last check (README, Task 4, steps 12-16).

Given: not graded; edits here are not submitted.

A causal language model of a few attention layers learns to copy: each sequence is PREFIX random tokens, a
separator, then the same tokens again, and the loss counts the copied half only. No position of the second half
can be predicted without attending back to the first, so the loss falls only if the gradients that flow through
attention are right. The same model, weights and batches are trained twice: once with `attention` from your
kernels (`flash_attention_trainable`, whose backward is kernels/attention_backward.cu), once with PyTorch's
scaled_dot_product_attention; python -m task4.test compares the two loss curves step by step. With the 16-bit
backward part (steps 27-30) the same training runs again in bf16 (autocast: the weights and Adam stay float32, the
products and attention run in bf16), through your 16-bit kernels and through SDPA's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    layers: int
    hidden: int
    heads: int
    prefix: int  # random tokens to copy; a sequence is prefix + 1 + prefix tokens
    batch: int
    steps: int
    lr: float
    vocab: int = 16  # token 0 is the separator, 1..vocab-1 the tokens copied


# head_dim 64 and 255 positions: the backward kernels' tiles see partial tiles and the causal diagonal.
TRAINING = Config(layers=2, hidden=256, heads=4, prefix=127, batch=16, steps=300, lr=1e-3)
SEPARATOR = 0


class Block(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.heads = config.heads
        self.norm1, self.norm2 = nn.LayerNorm(config.hidden), nn.LayerNorm(config.hidden)
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden, bias=False)
        self.out = nn.Linear(config.hidden, config.hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(config.hidden, 4 * config.hidden), nn.GELU(),
                                 nn.Linear(4 * config.hidden, config.hidden))

    def forward(self, x, attention):
        batch, seq, hidden = x.shape
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        y = attention(q.contiguous(), k.contiguous(), v.contiguous())  # (batch, heads, seq, head_dim), causal
        x = x + self.out(y.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.mlp(self.norm2(x))


class CopyModel(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        seq = 2 * config.prefix + 1
        self.embed = nn.Embedding(config.vocab, config.hidden)
        # Fixed sinusoidal positions: "the token prefix + 1 places back" is then one linear map of the position at
        # every position, learned once. With learned positions each place learns it apart, and 300 steps were not
        # enough (measured on an H200: 2.94 -> 2.61, chance 2.71).
        self.register_buffer("position", sinusoidal_positions(seq, config.hidden), persistent=False)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab, bias=False)

    def forward(self, tokens, attention):
        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x, attention)
        return self.head(self.norm(x))


def sinusoidal_positions(seq: int, hidden: int) -> torch.Tensor:
    """(seq, hidden): sin and cos of each position at hidden / 2 frequencies (Vaswani et al., 2017)."""
    position = torch.arange(seq, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float32) * (-math.log(10000.0) / hidden))
    table = torch.zeros(seq, hidden)
    table[:, 0::2], table[:, 1::2] = torch.sin(position * frequency), torch.cos(position * frequency)
    return table


def batch_of(config: Config, step: int, seed: int, device) -> torch.Tensor:
    """Step `step`'s sequences, (batch, 2 prefix + 1): the same on every device and in every process."""
    generator = torch.Generator().manual_seed(seed * 100_003 + step)
    prefix = torch.randint(1, config.vocab, (config.batch, config.prefix), generator=generator)
    separator = torch.full((config.batch, 1), SEPARATOR)
    return torch.cat([prefix, separator, prefix], dim=1).to(device)


def train(attention, config: Config, seed: int, device, steps: int | None = None,
          dtype: torch.dtype = torch.float32) -> list[float]:
    """Trains a fresh model (its weights from `seed`) for config.steps steps (or `steps`) of Adam with
    attention(q, k, v), causal; the loss of every step. dtype bfloat16: the forward pass under autocast, so
    attention gets bf16 q, k and v and its backward a bf16 gradient (no loss scaling: bf16 has float32's range)."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype: float32 or bfloat16 expected, got {dtype}")
    torch.manual_seed(seed)
    model = CopyModel(config).to(device)  # drawn on the CPU, then moved: the same weights everywhere
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    copied = slice(config.prefix, 2 * config.prefix)  # the positions whose next token is a copied one
    where = next(model.parameters()).device.type  # autocast's device: where the weights are
    losses = []
    for step in range(config.steps if steps is None else steps):
        tokens = batch_of(config, step, seed, device)
        with torch.autocast(where, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            logits = model(tokens[:, :-1], attention)
            loss = F.cross_entropy(logits[:, copied].reshape(-1, config.vocab).float(),
                                   tokens[:, copied.start + 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # waits for the step: a clock around train() covers every step whole
    return losses


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def chance_loss(config: Config) -> float:
    """The loss of a model that guesses: the copied tokens are uniform over vocab - 1 values."""
    return math.log(config.vocab - 1)


def write_curves(curves: dict[str, list[float]], path: str = "task4-training.csv",
                 dtype: torch.dtype = torch.float32) -> list[str]:
    """The loss curves (trained in `dtype`) as a CSV (step, one column each) and, when matplotlib is installed, a
    plot beside it; the paths written."""
    import csv

    names = list(curves)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *names])
        writer.writerows([step, *(curves[n][step] for n in names)] for step in range(len(curves[names[0]])))
    written = [path]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, style in zip(names, ("-", "--")):
        ax.plot(curves[name], style, label=name)
    ax.set_xlabel("training step")
    ax.set_ylabel("loss on the copied tokens")
    ax.set_yscale("log")
    ax.set_title(f"copy task, {TRAINING.layers} layers, hidden {TRAINING.hidden}, {TRAINING.heads} heads, "
                 f"{str(dtype)[6:]}")
    ax.legend()
    fig.tight_layout()
    png = path.rsplit(".", 1)[0] + ".png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return written + [png]
