"""`python -m task6.test`: task 6's checks, which live on the trusted side (checks/task6/test.py) and run
your code in a worker process. `--help` lists the options."""

from checks.task6.test import main

if __name__ == "__main__":
    raise SystemExit(main())
