"""The worker ends quietly when the checks end first: nothing of the kit's own reads like the student's fault."""

import os
import socket
import subprocess
import sys

from common import wire
from tests.conftest import REPO


def test_a_worker_whose_checks_hung_up_before_its_answer_ends_without_a_traceback():
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-m", "common.worker", str(theirs.fileno()), "1"], cwd=REPO,
                            pass_fds=[theirs.fileno()], stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    theirs.close()
    # a large answer to a request the checks no longer wait for: the worker's send meets a closed socket
    wire.send_frame(ours, wire.encode_request({"op": "keep", "name": "x", "value": None}))
    wire.send_frame(ours, wire.encode_request({"op": "drop", "name": "y"}))
    ours.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
