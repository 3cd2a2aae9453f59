"""python notes/tools/timeline.py [grader options]: `python -m grader`, each test's lines also time-stamped as they come.

The grader shows the tasks' output in task order; this writes every line when its test printed it,
with the seconds since the start and the task, to timeline.log in $OUT (or /tmp), so the phases of
a grading (builds, untimed parts side by side, timed parts one at a time) can be read off
(notes/grading-time.md). Run it from the checkout: PYTHONPATH=. python notes/tools/timeline.py --solution
"""

import os
import sys
import time

import grader.schedule as schedule
from grader.__main__ import main

T0 = time.perf_counter()
LOG = open(os.path.join(os.environ.get("OUT", "/tmp"), "timeline.log"), "w")
_say, _finish = schedule.InOrder.say, schedule.InOrder.finish


def say(self, task, text):
    LOG.write(f"{time.perf_counter() - T0:8.2f} [{task}] {text.rstrip()}\n")
    LOG.flush()
    _say(self, task, text)


def finish(self, task):
    LOG.write(f"{time.perf_counter() - T0:8.2f} [{task}] FINISHED\n")
    LOG.flush()
    _finish(self, task)


schedule.InOrder.say, schedule.InOrder.finish = say, finish
sys.exit(main(sys.argv[1:]))
