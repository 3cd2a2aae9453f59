"""python -m task7.inference [--prompt TEXT] [--max-new-tokens N] [--model PATH] [--llama] [--solution]

GPT-2 (or with --llama a Llama-family model) writes text with your kernels as its attention (task7/attention.py; your
Task 4 and 5 kernels on a GPU, PyTorch in their place on the CPU), and prints the text and the time per token.
`python -m task7.inference_ref` does the same with the model's own attention.
Weights: --model PATH (a folder from save_pretrained), else the Hugging Face cache, else the
usual download of `gpt2`, or with --llama of HuggingFaceTB/SmolLM2-135M (a Llama-family model:
9 query heads over 3 key/value heads).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

import torch

from common.impl import add_solution_flag
from task7 import gpt2


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[2])
    p.add_argument("--prompt", default=gpt2.DEFAULT_PROMPT, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=40, metavar="N", help="tokens to generate (default 40)")
    p.add_argument("--model", metavar="PATH", help="a folder holding the model (config.json, weights, tokenizer)")
    p.add_argument("--llama", action="store_true",
                   help=f"a Llama-family model, {gpt2.LLAMA_CHECKPOINT} (grouped-query attention), instead of GPT-2")
    return p


def generate(model, tokenizer, prompt: str, new_tokens: int) -> tuple[str, float]:
    """(the text, ms per new token): greedy, timed with the host clock around the whole generation."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    gpt2.greedy(model, ids, 2)  # warm-up: builds, caches
    sync()
    start = time.perf_counter()
    out = gpt2.greedy(model, ids, new_tokens)
    sync()
    ms = (time.perf_counter() - start) * 1e3 / new_tokens
    return tokenizer.decode(out[0]), ms


def run(args, own_attention: bool) -> int:
    if args.max_new_tokens < 1:
        print(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}", file=sys.stderr)
        return 2
    try:
        model, tokenizer = gpt2.pretrained(args.model, name=gpt2.LLAMA_CHECKPOINT if args.llama else "gpt2")
    except gpt2.WeightsMissing as err:
        print(err, file=sys.stderr)
        return 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    if own_attention:
        how = f"the model's own attention ({model.config._attn_implementation})"
    else:
        from common.torch_kernels import PyTorchKernels
        from task5.attention import built_kernels

        solution = getattr(args, "solution", False)
        module = importlib.import_module("task7.solution.attention" if solution else "task7.attention")
        try:
            kernels = built_kernels(solution) if device == "cuda" else PyTorchKernels()
        except RuntimeError as err:  # a kernel that does not build: its task and the compiler's words
            print(err, file=sys.stderr)
            return 1
        gpt2.use_kernels(model, module.kernel_attention, kernels)
        how = ("the reference kernels" if solution else "your kernels") if device == "cuda" else \
            "your attention function, with PyTorch in place of the kernels (no GPU)"
    try:
        text, ms = generate(model, tokenizer, args.prompt, args.max_new_tokens)
    except NotImplementedError as err:
        print(f"not implemented yet: {err}", file=sys.stderr)
        return 1
    print(text)
    print(f"\n{args.max_new_tokens} tokens, {ms:.2f} ms per token on {device}, with {how}")
    return 0


def main(argv=None) -> int:
    p = parser("python -m task7.inference", __doc__)
    add_solution_flag(p, 7, "the reference solution's attention function",
                      "python -m task7.inference runs your own attention function")
    return run(p.parse_args(argv), own_attention=False)


if __name__ == "__main__":
    raise SystemExit(main())
