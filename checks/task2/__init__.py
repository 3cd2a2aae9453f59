"""Task 2's checks (the trusted side): `python -m task2.test` runs test.py."""
