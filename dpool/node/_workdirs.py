"""A node's cache of drivers' shipped working directories (``protocol._workdir``).

``<state dir>/workdirs/<digest>/``: each archive unpacked once (into a temporary
directory, then renamed into place, so a half-unpacked tree is never used), kept while
the node runs and removed when it stops. Archives come from the drivers attached here and,
for tasks spilled from other nodes, from the control store.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import threading
import zipfile
from typing import Optional

from dpool.errors import Error


class WorkdirCache:
    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()

    def path(self, digest: str) -> Optional[str]:
        p = os.path.join(self.root, digest)
        return p if os.path.isdir(p) else None

    def add(self, digest: str, archive: bytes) -> str:
        """Unpack ``archive`` as ``digest`` (once); its directory."""
        if not digest.isalnum():
            raise Error(f"bad working-directory digest {digest!r}")
        with self._lock:
            done = self.path(digest)
            if done is not None:
                return done
            tmp = tempfile.mkdtemp(prefix=f".{digest}-", dir=self.root)
            try:
                with zipfile.ZipFile(io.BytesIO(archive)) as zf:
                    for info in zf.infolist():
                        target = os.path.realpath(os.path.join(tmp, info.filename))
                        if not target.startswith(os.path.realpath(tmp) + os.sep):
                            raise Error(f"working-directory archive {digest} has a path "
                                        f"outside it: {info.filename!r}")
                        zf.extract(info, tmp)
                        mode = (info.external_attr >> 16) & 0o777
                        if mode:
                            os.chmod(target, mode)
                final = os.path.join(self.root, digest)
                os.rename(tmp, final)
                return final
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
