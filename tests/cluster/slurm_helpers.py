"""A one-host Slurm for the launcher's tests: Debian's ``munge``, ``slurmctld``, ``slurmd``
and ``slurm-client``, configured in a temporary folder (``../shared/REAL_COMPONENTS.md``).
``start_slurm(dir)`` returns a ``Slurm`` (its ``env`` has ``SLURM_CONF``) or raises
``SlurmUnavailable`` saying why; ``stop()`` stops every daemon it started."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

_CONF = """\
ClusterName=dpooltest
SlurmctldHost=localhost(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=localhost NodeHostname=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class SlurmUnavailable(Exception):
    pass


@dataclass
class Slurm:
    dir: Path
    env: dict
    procs: list = field(default_factory=list)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_slurm(d: Path, cpus: int = 2) -> Slurm:
    missing = [b for b in ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sinfo")
               if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        raise SlurmUnavailable(f"Slurm is not installed here (missing {', '.join(missing)}; "
                               "apt-get install slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        raise SlurmUnavailable("the one-host Slurm runs as root (SlurmUser=root)")
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o755)  # (munged refuses a socket folder others cannot traverse)
    for sub in ("state", "spool"):
        (d / sub).mkdir(exist_ok=True)
    munged = shutil.which("munged") or "/usr/sbin/munged"
    mungekey = shutil.which("mungekey") or "/usr/sbin/mungekey"
    subprocess.run([mungekey, "-c", "-k", str(d / "munge.key")], check=True,
                   capture_output=True)
    os.chmod(d / "munge.key", 0o600)
    conf = d / "slurm.conf"
    conf.write_text(_CONF.format(d=d, cpus=cpus, ctld_port=_free_port(), d_port=_free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    s = Slurm(d, env)
    try:
        s.procs.append(subprocess.Popen(
            [munged, "-F", f"--socket={d}/munge.sock", f"--key-file={d}/munge.key",
             f"--pid-file={d}/munged.pid", f"--seed-file={d}/munge.seed",
             f"--log-file={d}/munged.log", "--force"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: (d / "munge.sock").exists(), 10, "munged did not start")
        ctld = shutil.which("slurmctld") or "/usr/sbin/slurmctld"
        slurmd = shutil.which("slurmd") or "/usr/sbin/slurmd"
        s.procs.append(subprocess.Popen([ctld, "-D", "-f", str(conf)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        s.procs.append(subprocess.Popen([slurmd, "-D", "-f", str(conf), "-N", "localhost"],
                                        env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL))

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                 text=True, timeout=10)
            return out.returncode == 0 and out.stdout.strip() in ("idle", "mixed")

        _wait(idle, 30, "the Slurm node did not come up (see slurmctld.log, slurmd.log in "
                        f"{d})")
    except BaseException:
        s.stop()
        raise
    return s


def _wait(cond, timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SlurmUnavailable(why)
        time.sleep(0.1)
