"""python -m task2.compile [--solution]: build the softmax, GEMM and attention kernels."""

import sys

from common.build import compile_main

if __name__ == "__main__":
    sys.exit(compile_main(2))
