"""python -m task4.compile [--solution]: build the fused FlashAttention kernel."""

import sys

from common.build import compile_main

if __name__ == "__main__":
    sys.exit(compile_main(4))
