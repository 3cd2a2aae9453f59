"""`python -m task4.tune`: task 4's tuner (its plans live on the trusted side, checks/task4/tune.py).
`--help` lists the options."""

import sys

from checks.task4.tune import main

if __name__ == "__main__":
    sys.exit(main())
