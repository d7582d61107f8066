"""An ``sshd`` on loopback addresses for the SSH launcher's tests (Debian's
``openssh-server``; ``../shared/REAL_COMPONENTS.md``): a host key and a client key made
here, one port, several listen addresses, and each address made a "host" of its own by a
``Match LocalAddress`` block that sets its state folder (``DPOOL_STATE_DIR``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


class SshUnavailable(Exception):
    pass


@dataclass
class Sshd:
    dir: Path
    port: int
    key: Path
    proc: subprocess.Popen

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_sshd(d: Path, ips: list, port: int, env: dict) -> Sshd:
    """``sshd`` on ``ips`` at ``port``; sessions get ``env`` (PYTHONPATH, ...) and, per
    address, ``DPOOL_STATE_DIR=d/state-<ip>``."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd) or shutil.which("ssh") is None or \
            shutil.which("ssh-keygen") is None:
        raise SshUnavailable("openssh-server is not installed here (apt-get install "
                             "openssh-server)")
    d.mkdir(parents=True, exist_ok=True)
    os.makedirs("/run/sshd", exist_ok=True)
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
                       check=True, capture_output=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    os.chmod(d / "client_key", 0o600)
    sets = " ".join(f"{k}={v}" for k, v in env.items())
    lines = [f"Port {port}", *(f"ListenAddress {ip}" for ip in ips),
             f"HostKey {d / 'host_key'}", "PermitRootLogin prohibit-password",
             "PasswordAuthentication no", "UsePAM no", "StrictModes no",
             f"AuthorizedKeysFile {d / 'authorized_keys'}", f"PidFile {d / 'sshd.pid'}",
             "LogLevel ERROR"]
    for ip in ips:
        lines += [f"Match LocalAddress {ip}",
                  f"    SetEnv {sets} DPOOL_STATE_DIR={d / ('state-' + ip)}"]
    conf = d / "sshd_config"
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([sshd, "-D", "-f", str(conf), "-E", str(d / "sshd.log")])
    s = Sshd(d, port, d / "client_key", proc)
    deadline = time.monotonic() + 10
    while True:
        if proc.poll() is not None:
            raise SshUnavailable(f"sshd exited: {(d / 'sshd.log').read_text()[-500:]}")
        try:
            with socket.create_connection((ips[0], port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                s.stop()
                raise SshUnavailable("sshd did not start listening") from None
            time.sleep(0.05)
    return s
