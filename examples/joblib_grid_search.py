"""A scikit-learn grid search on dpool, through joblib's "dpool" backend.

    python examples/joblib_grid_search.py                     # on this machine
    DPOOL_ADDRESS=host:6380 DPOOL_TOKEN=... python examples/joblib_grid_search.py
                                                              # on the cluster's CPUs

The scikit-learn code is unchanged: ``n_jobs=-1`` asks joblib for every CPU, and
``parallel_config(backend="dpool")`` says where they are (this machine's, or the
cluster's with ``DPOOL_ADDRESS``). ``X`` and ``y`` go into dpool's shared-memory store
once and every fit maps them without a copy. The same search is then run with joblib's
default backend, loky, to show that both find the same model.
"""

import os
import time

from joblib import parallel_config
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC

import dpool

QUICK = os.environ.get("DPOOL_EXAMPLE_QUICK") == "1"  # (the test suite's smaller run)


def search(backend):
    X, y = load_digits(return_X_y=True)
    if QUICK:
        X, y = X[:300], y[:300]
    grid = {"C": [0.1, 1, 10, 100], "gamma": [1e-4, 1e-3, 1e-2]}
    gs = GridSearchCV(SVC(), grid, cv=3 if QUICK else 5, n_jobs=-1)
    t0 = time.perf_counter()
    with parallel_config(backend=backend):
        gs.fit(X, y)
    return gs, time.perf_counter() - t0


if __name__ == "__main__":
    dpool.register_joblib()
    where = os.environ.get("DPOOL_ADDRESS") or "this machine"
    ours, t_ours = search("dpool")
    print(f"dpool on {where} ({dpool.cpu_count()} CPUs): best {ours.best_params_}, "
          f"accuracy {ours.best_score_:.3f}, {t_ours:.2f} s")
    theirs, t_theirs = search("loky")
    print(f"loky on this machine: best {theirs.best_params_}, "
          f"accuracy {theirs.best_score_:.3f}, {t_theirs:.2f} s")
    print(f"same best parameters as loky: {ours.best_params_ == theirs.best_params_}")
