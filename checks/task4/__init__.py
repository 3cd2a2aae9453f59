"""Task 4's checks (the trusted side): `python -m task4.test` runs test.py."""
