"""`python -m task5.tune`: task 5's tuner (its plans live on the trusted side, checks/task5/tune.py).
`--help` lists the options."""

import sys

from checks.task5.tune import main

if __name__ == "__main__":
    sys.exit(main())
