"""python -m task7.inference_ref [--prompt TEXT] [--max-new-tokens N] [--model PATH] [--llama]

GPT-2 (or with --llama a Llama-family model) writes text with the model's own attention, and prints
the text and the time per token:
the baseline for python -m task7.inference, which runs your kernels instead.
"""

from task7.inference import parser, run


def main(argv=None) -> int:
    return run(parser("python -m task7.inference_ref", __doc__).parse_args(argv), own_attention=True)


if __name__ == "__main__":
    raise SystemExit(main())
