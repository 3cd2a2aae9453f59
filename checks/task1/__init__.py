"""Task 1's checks (the trusted side): `python -m task1.test` runs test.py."""
