"""`python -m task5.test`: task 5's checks, which live on the trusted side (checks/task5/test.py) and run
your code in a worker process. `--help` lists the options."""

from checks.task5.test import main

if __name__ == "__main__":
    raise SystemExit(main())
