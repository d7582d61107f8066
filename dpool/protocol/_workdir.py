"""The driver's code follows its tasks: its working directory, packed by content hash.

A task's function may live in the user's own modules, importable on the driver and
absent on another host. In cluster mode the driver packs its working directory (the
user's project) into a zip archive, skipping what is not code to ship -- version control
(``.git``, ``.hg``, ``.svn``), virtual environments (any directory holding a
``pyvenv.cfg``, and ``.venv``/``venv``), caches (``__pycache__``, ``.tox``, ``.nox``,
``.mypy_cache``, ``.pytest_cache``, ``.ruff_cache``), ``node_modules``, and files over
``$DPOOL_WORKING_DIR_FILE_LIMIT`` bytes (default 16 MiB) -- and names it by the SHA-256
of the paths and contents, so an unchanged project is sent once and a changed one is
seen by the next run. Nodes unpack it into a cache and start that driver's workers in
it, with it first on ``sys.path`` (entries of the driver's ``sys.path`` under the
directory map into the copy). The node a driver attaches to over its unix socket is on
the driver's host and uses the directory itself.

``$DPOOL_WORKING_DIR`` (or the executor keyword ``working_dir=``) picks another
directory; ``off`` ships nothing. A project bigger than ``$DPOOL_WORKING_DIR_LIMIT``
(default 256 MiB) raises ``dpool.Error`` saying how to change either.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
from typing import Optional

from dpool.errors import Error

SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".tox", ".nox", ".mypy_cache",
                        ".pytest_cache", ".ruff_cache", "node_modules", ".venv", "venv",
                        ".eggs"})
DEFAULT_FILE_LIMIT = 16 << 20
DEFAULT_TOTAL_LIMIT = 256 << 20


def _limit(name: str, default: int) -> int:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw else default
    except ValueError:
        raise Error(f"${name}={raw!r} is not a number of bytes") from None


def chosen(working_dir: Optional[str] = None) -> Optional[str]:
    """The directory to ship (None: ship nothing)."""
    value = working_dir if working_dir is not None else os.environ.get("DPOOL_WORKING_DIR")
    if value is not None and value.strip().lower() in ("", "off", "none", "0", "false"):
        return None
    path = os.path.abspath(value if value else os.getcwd())
    if not os.path.isdir(path):
        raise Error(f"working directory to ship {path!r} is not a directory "
                    "(DPOOL_WORKING_DIR / working_dir=)")
    return path


def _files(root: str, file_limit: int) -> list[tuple[str, str]]:
    """(relative path, absolute path) of the files to ship, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS
                             and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))
                             and not os.path.islink(os.path.join(dirpath, d)))
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError:
                continue  # a dangling link, or removed meanwhile
            if not stat.S_ISREG(st.st_mode) or st.st_size > file_limit:
                continue
            out.append((os.path.relpath(full, root), full))
    out.sort()
    return out


_last: dict[str, tuple] = {}  # root -> (files' signature, digest, archive): the last package


def package(root: str) -> tuple[str, bytes]:
    """(content digest, zip archive) of ``root``'s files to ship. Unchanged files (same
    paths, sizes and modification times as last time) are not read again."""
    file_limit = _limit("DPOOL_WORKING_DIR_FILE_LIMIT", DEFAULT_FILE_LIMIT)
    total_limit = _limit("DPOOL_WORKING_DIR_LIMIT", DEFAULT_TOTAL_LIMIT)
    files = _files(root, file_limit)
    signature = []
    total = 0
    for rel, full in files:
        st = os.stat(full)
        signature.append((rel, st.st_size, st.st_mtime_ns, st.st_mode))
        total += st.st_size
        if total > total_limit:
            raise Error(
                f"the working directory {root} holds more than {total_limit >> 20} MiB of "
                f"files to ship to the cluster's nodes: run from your project's directory, "
                f"set DPOOL_WORKING_DIR to it (or to 'off' to ship nothing), or raise "
                f"DPOOL_WORKING_DIR_LIMIT (bytes)")
    last = _last.get(root)
    if last is not None and last[0] == signature:
        return last[1], last[2]
    digest = hashlib.sha256()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for rel, full in files:
            with open(full, "rb") as f:
                data = f.read()
            executable = os.access(full, os.X_OK)
            digest.update(rel.encode() + b"\0" + (b"x" if executable else b"-") + b"\0")
            digest.update(hashlib.sha256(data).digest())
            info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if executable else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    result = digest.hexdigest()[:32], buf.getvalue()
    _last[root] = (signature, *result)
    return result


def map_path(path: str, root: str, local_root: str) -> str:
    """``path`` under ``root`` (the driver's directory) as it is under ``local_root``."""
    if path == root:
        return local_root
    if path.startswith(root.rstrip("/") + "/"):
        return os.path.join(local_root, os.path.relpath(path, root))
    return path
