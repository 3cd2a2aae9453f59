"""The trusted side: the checks, the reference implementations, records, timing and the sandbox.

Never in the worker's view (common/ is): student code cannot read or change what judges it.
"""
