"""python -m task5.compile [--solution]: build the KV-cache and decode kernels."""

import sys

from common.build import compile_main

if __name__ == "__main__":
    sys.exit(compile_main(5))
