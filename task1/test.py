"""`python -m task1.test`: task 1's checks, which live on the trusted side (checks/task1/test.py) and run
your code in a worker process. `--help` lists the options."""

from checks.task1.test import main

if __name__ == "__main__":
    raise SystemExit(main())
