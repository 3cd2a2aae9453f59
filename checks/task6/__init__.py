"""Task 6's checks (the trusted side): `python -m task6.test` runs test.py."""
