"""`python -m task7.test`: task 7's checks, which live on the trusted side (checks/task7/test.py) and run
your code in a worker process. `--help` lists the options."""

from checks.task7.test import main

if __name__ == "__main__":
    raise SystemExit(main())
