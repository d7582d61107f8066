"""dpool under other libraries' parallel APIs.

- ``dpool.integrations.joblib``: joblib's ``"dpool"`` backend, so ``Parallel(...)`` and
  scikit-learn's ``n_jobs`` run on dpool (``dpool.register_joblib()`` registers it);
  ``_joblib_batch``: how a joblib batch travels as one dpool task (large arrays stored
  once per ``Parallel`` call) and what runs it in the worker.

Importing this package imports none of those libraries: ``dpool.register_joblib`` is
one of dpool's public names, and ``import dpool`` must stay cheap.
"""

from __future__ import annotations

__all__ = ["register_joblib"]


def register_joblib(make_default: bool = False) -> None:
    """Register joblib's ``"dpool"`` backend, so that ``Parallel`` runs on dpool.

        import dpool, joblib
        dpool.register_joblib()
        with joblib.parallel_config(backend="dpool", n_jobs=-1):
            search.fit(X, y)        # scikit-learn's n_jobs, on dpool's workers

    ``n_jobs=-1`` means the runtime's CPUs (the cluster's with ``DPOOL_ADDRESS``).
    ``make_default=True`` makes it joblib's default backend too (what ``python -m dpool
    run --joblib`` does), so that code that never names a backend runs on dpool.
    Importing ``dpool.integrations.joblib`` registers the backend as well. Raises
    ``ImportError`` when joblib is not installed (``pip install 'dpool[joblib]'``).
    """
    try:
        import joblib  # noqa: F401 - only to say clearly what is missing
    except ImportError as exc:
        raise ImportError("dpool.register_joblib() needs joblib: pip install joblib "
                          "(or pip install 'dpool[joblib]')") from exc
    from dpool.integrations import joblib as backend

    backend.register(make_default=make_default)
