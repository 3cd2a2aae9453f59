"""Task 3's checks (the trusted side): `python -m task3.test` runs test.py."""
