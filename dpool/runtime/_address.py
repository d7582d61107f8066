"""Where the cluster is: ``DPOOL_ADDRESS``/``DPOOL_TOKEN`` and this host's record of it.

``dpool start`` writes a record of what it started on this host (addresses, the token,
the node's unix socket, process ids) to ``<state dir>/cluster.json``, readable only by
the user. The state dir is ``$DPOOL_STATE_DIR``, else ``$XDG_RUNTIME_DIR/dpool``, else
``/tmp/dpool-<uid>``. ``DPOOL_ADDRESS=auto`` reads the address and token from it, and a
driver whose address names the node of this host attaches over its unix socket.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

from dpool.errors import Error
from dpool.protocol import parse_hostport


def state_dir() -> str:
    explicit = os.environ.get("DPOOL_STATE_DIR")
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "dpool")
    return os.path.join(tempfile.gettempdir(), f"dpool-{os.getuid()}")


def record_path() -> str:
    return os.path.join(state_dir(), "cluster.json")


def ensure_state_dir() -> str:
    """The state dir, created private if missing; refused (``dpool.Error``) unless it is a
    real directory of this user's that nobody else may write: under a shared ``/tmp``
    another user could otherwise plant a record (an address and token of theirs: the
    driver would run their pickles) or symlinks to files of ours."""
    d = state_dir()
    os.makedirs(d, mode=0o700, exist_ok=True)
    _check_private(d, directory=True)
    return d


def _check_private(path: str, directory: bool) -> None:
    st = os.lstat(path)
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not kind_ok or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise Error(f"{path} is not a private {'directory' if directory else 'file'} of "
                    f"this user (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): "
                    "refusing to use it; remove it, or set DPOOL_STATE_DIR")


def read_record() -> Optional[dict]:
    path = record_path()
    try:
        _check_private(os.path.dirname(path), directory=True)
        _check_private(path, directory=False)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return None
    with os.fdopen(fd) as f:
        try:
            return json.load(f)
        except ValueError:
            return None


def write_record(record: dict) -> None:
    ensure_state_dir()
    tmp = record_path() + ".tmp"
    try:
        os.unlink(tmp)  # whatever is there (a symlink included) is replaced, never followed
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=2)
    os.replace(tmp, record_path())


def remove_record() -> None:
    try:
        os.unlink(record_path())
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class Target:
    """Where a driver connects: the node's TCP address, and its unix socket if local;
    ``alternates``: the other nodes ``DPOOL_ADDRESS`` listed (``HOST:PORT,HOST:PORT``),
    where a driver over TCP moves first when its node dies (``_move``)."""

    host: str
    port: int
    token: bytes
    unix_path: Optional[str] = None
    alternates: tuple = ()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def resolve(address: str, token: Optional[str] = None) -> Target:
    """The node a driver attaches to for ``address`` (``DPOOL_ADDRESS``'s value).

    The token comes from ``token``, else ``$DPOOL_TOKEN``, else this host's record when
    it describes the same cluster. ``address`` may list several nodes, comma-separated:
    the driver attaches to the first; the others are where it moves if that one dies.
    """
    record = read_record()
    first, *others = [a.strip() for a in address.split(",")] if "," in address else [address]
    alternates = tuple(f"{h}:{p}" for h, p in map(parse_hostport, others))
    address = first
    if address.strip().lower() == "auto":
        if record is None:
            raise Error(
                f"DPOOL_ADDRESS=auto, but no cluster was started on this host (no "
                f"{record_path()}): run `dpool start --head`, or set DPOOL_ADDRESS=HOST:PORT")
        address = record["address"]
    host, port = parse_hostport(address)
    tok = token if token is not None else os.environ.get("DPOOL_TOKEN")
    unix_path = None
    if record is not None and _same_cluster(record, host, port):
        unix_path = record.get("node", {}).get("unix_path")
        if tok is None:
            tok = record.get("token")
    if not tok:
        raise Error(f"no token for the cluster at {host}:{port}: set DPOOL_TOKEN to the "
                    "token `dpool start --head` printed")
    if unix_path and not os.path.exists(unix_path):
        unix_path = None
    return Target(host, port, tok.encode(), unix_path, alternates)


def _same_cluster(record: dict[str, Any], host: str, port: int) -> bool:
    addrs = {record.get("address"), record.get("node", {}).get("address")}
    return f"{host}:{port}" in addrs
