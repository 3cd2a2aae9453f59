"""Task 7's checks (the trusted side): `python -m task7.test` runs test.py."""
