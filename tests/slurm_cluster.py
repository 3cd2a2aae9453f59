"""A one-node Slurm cluster for the tests, from Debian's packages (slurmctld slurmd slurm-client munge).

Its daemons run as root from a folder of the test's own (configuration, state, logs); munged is
started as the munge user when it is not running. Every wait is bounded. `start` returns the
environment under which sbatch, squeue and scontrol talk to it, or raises Unavailable with the
reason the tests then skip with.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

PROGRAMS = ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "munged", "munge")
INSTALL = "apt-get install --no-install-recommends slurmctld slurmd slurm-client munge"


class Unavailable(Exception):
    pass


def _run(*cmd, env=None, timeout=30):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def _munge() -> None:
    if _run("sh", "-c", "munge -n | unmunge").returncode == 0:
        return
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    started = _run("runuser", "-u", "munge", "--", "munged")
    for _ in range(50):
        if _run("sh", "-c", "munge -n | unmunge").returncode == 0:
            return
        time.sleep(0.1)
    raise Unavailable(f"munged did not start: {started.stderr.strip() or started.stdout.strip()}")


def _node_line(host: str) -> str:
    found = _run("slurmd", "-C").stdout.splitlines()
    node = next((line for line in found if line.startswith("NodeName=")), None)
    if node is None:
        raise Unavailable("slurmd -C did not describe this machine")
    words = [w for w in node.split() if not w.startswith(("NodeName=", "UpTime="))]
    return f"NodeName={host} NodeAddr=127.0.0.1 {' '.join(words)} Gres=gpu:1 State=UNKNOWN"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(folder: Path, host: str) -> Path:
    """slurm.conf and gres.conf for one node that is its own controller (a GPU declared on /dev/null).

    KillWait: the seconds between SIGTERM and SIGKILL when a job reaches its time limit or is cancelled. A
    stopped grading removes its scratch copy before it exits (grader/grading.py gives its grader 15 s to end),
    which on a busy machine took more than the 5 s this was; a job whose processes have exited ends at once.
    """
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    conf = folder / "slurm.conf"
    conf.write_text(f"""ClusterName=kit
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=cred_expire=30
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/log/jobcomp.txt
ReturnToService=2
MinJobAge=600
KillWait=30
InactiveLimit=0
JobRequeue=1
{_node_line(host)}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    (folder / "gres.conf").write_text("Name=gpu File=/dev/null\n")
    return conf


@contextmanager
def cluster(folder: Path):
    """A running one-node cluster for the duration of the block; its environment (SLURM_CONF) is yielded."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        raise Unavailable(f"Slurm is not installed ({', '.join(missing)} missing; Debian: {INSTALL})")
    if os.geteuid() != 0:
        raise Unavailable("a one-node Slurm needs root here (slurmd runs jobs as their users)")
    _munge()
    host = socket.gethostname().split(".")[0]
    env = dict(os.environ, SLURM_CONF=str(write_config(folder, host)))
    daemons = []
    try:
        for cmd in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", host]):
            daemons.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = _run("sinfo", "-h", "-o", "%t", env=env).stdout.strip()
            if any(d.poll() is not None for d in daemons):
                state = "a daemon exited"
                break
            if state.startswith("idle"):
                break
            time.sleep(0.3)
        else:
            state = "no answer"
        if not state.startswith("idle"):
            logs = "".join((folder / "log" / f).read_text()[-600:] for f in ("slurmctld.log", "slurmd.log")
                           if (folder / "log" / f).exists())
            raise Unavailable(f"the one-node Slurm did not become idle within 30 s (sinfo: {state!r}); {logs}")
        yield env
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
