"""joblib's "dpool" backend on a loopback cluster (two nodes, their own stores): a driver
with ``DPOOL_ADDRESS`` runs ``Parallel(n_jobs=-1)`` and a scikit-learn grid search over
the cluster's CPUs, with the same results as on one process."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from tests.cluster.conftest import start_cluster, stop_cluster

# looked up, not imported: importing scikit-learn takes ~2 s in every xdist worker
pytestmark = pytest.mark.skipif(
    not (importlib.util.find_spec("joblib") and importlib.util.find_spec("sklearn")),
    reason="needs joblib and scikit-learn (the test extra)")

SCRIPT = textwrap.dedent("""
    import collections, os, sys, time
    import joblib
    from joblib import Parallel, delayed, parallel_config
    from sklearn.datasets import make_classification
    from sklearn.model_selection import GridSearchCV
    from sklearn.tree import DecisionTreeClassifier
    import dpool

    def where(i):
        time.sleep(0.2)
        return i * i, os.environ.get("DPOOL_NODE_ID")

    def search(n_jobs):
        # X is 640 KB: stored once per call, pulled once by each node that needs it
        X, y = make_classification(n_samples=2000, n_features=40, random_state=0)
        gs = GridSearchCV(DecisionTreeClassifier(random_state=0),
                          {"max_depth": [3, 6], "min_samples_leaf": [1, 10]}, cv=3,
                          n_jobs=n_jobs)
        return gs.fit(X, y)

    if __name__ == "__main__":
        dpool.register_joblib()
        with parallel_config(backend="dpool"):
            print(joblib.effective_n_jobs(-1))
            out = Parallel(n_jobs=-1, batch_size=1)(delayed(where)(i) for i in range(16))
            print([v for v, _ in out])
            nodes = collections.Counter(n for _, n in out)
            sys.stderr.write(f"NODES {dict(nodes)}\\n")
            spread = search(-1)
        alone = search(1)
        print(spread.best_params_ == alone.best_params_,
              list(spread.cv_results_["mean_test_score"])
              == list(alone.cv_results_["mean_test_score"]))
""")


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("joblib"), n_nodes=2)
    try:
        yield c
    finally:
        stop_cluster(c)


def test_parallel_and_a_grid_search_spread_over_the_nodes(cluster2, tmp_path):
    out = cluster2.run_script(SCRIPT, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "4"  # n_jobs=-1: the cluster's CPUs (2 nodes x 2)
    assert lines[1] == str([i * i for i in range(16)])
    assert lines[2] == "True True"
    used = eval([x for x in out.stderr.splitlines() if x.startswith("NODES ")][-1][6:])  # noqa: S307
    assert len(used) == 2, used
    assert set(used) <= {n.address for n in cluster2.nodes}
