"""`python -m task2.test`: task 2's checks, which live on the trusted side (checks/task2/test.py) and run
your code in a worker process. `--help` lists the options."""

from checks.task2.test import main

if __name__ == "__main__":
    raise SystemExit(main())
