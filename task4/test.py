"""`python -m task4.test`: task 4's checks, which live on the trusted side (checks/task4/test.py) and run
your code in a worker process. `--help` lists the options."""

from checks.task4.test import main

if __name__ == "__main__":
    raise SystemExit(main())
