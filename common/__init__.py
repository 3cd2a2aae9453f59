"""The worker's view of the kit: the code given to students and the worker's side of the protocol.

Everything in this folder is copied into the sandboxed worker where student code runs (harness/view.py),
so nothing here imports harness/ or grader/, the trusted side (tests/test_tasks.py checks it).
"""
