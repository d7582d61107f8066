"""dpool, the library under test. Skipped with a note while it does not
import or lacks the API a group needs."""

from __future__ import annotations

from typing import Any, ClassVar

from .base import Adapter, FuturesExecutorPeer, MpStylePool, PeerUnavailable, Unsupported

try:
    import dpool
except Exception as exc:  # the package may be mid-edit: any failure means "skip"
    raise PeerUnavailable(f"`import dpool` failed: {type(exc).__name__}: {exc}") from exc


def _require(*names: str) -> None:
    missing = [n for n in names if not hasattr(dpool, n)]
    if missing:
        raise PeerUnavailable("dpool has no " + ", ".join(f"dpool.{n}" for n in missing) + " yet")


class DpoolExecutor(FuturesExecutorPeer):
    supports_put: ClassVar[bool] = True

    @classmethod
    def check(cls) -> None:
        _require("ProcessPoolExecutor")

    def _create(self) -> Any:
        return dpool.ProcessPoolExecutor(max_workers=self.workers)

    def put(self, obj: Any) -> Any:
        if not (hasattr(dpool, "put") and hasattr(dpool, "get")):
            raise Unsupported("dpool.put/dpool.get not available yet")
        return dpool.put(obj)


class DpoolPool(MpStylePool):
    @classmethod
    def check(cls) -> None:
        _require("Pool")

    def _create(self) -> Any:
        return dpool.Pool(self.workers)


ADAPTERS: dict[str, type[Adapter]] = {
    "executor": DpoolExecutor,
    "objects": DpoolExecutor,
    "pool": DpoolPool,
}


def version() -> str:
    ver = getattr(dpool, "__version__", None)
    if ver is None:
        try:
            from importlib.metadata import version as dist_version

            ver = dist_version("dpool")
        except Exception:
            ver = "source tree"
    return str(ver)
