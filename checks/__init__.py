"""The trusted side of each task: its checks, measurements and tuning plans (checks/taskN/), which run
the student's code in a worker and never in their own process. `python -m taskN.test` and `python -m
taskN.tune` are thin entry points in the task folders; the worker never sees this folder."""
