"""Task 5's checks (the trusted side): `python -m task5.test` runs test.py."""
