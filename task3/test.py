"""`python -m task3.test`: task 3's checks, which live on the trusted side (checks/task3/test.py) and run
your code in a worker process. `--help` lists the options."""

from checks.task3.test import main

if __name__ == "__main__":
    raise SystemExit(main())
