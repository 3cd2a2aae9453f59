"""`python -m task5.compare`: your 16-bit decode beside SDPA's and FlashInfer's (the comparison lives on the trusted
side, checks/task5/compare.py). `--help` lists the options."""

import sys

from checks.task5.compare import main

if __name__ == "__main__":
    sys.exit(main())
