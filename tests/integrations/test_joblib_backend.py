"""joblib's "dpool" backend on the embedded runtime, differential against loky: the same
``Parallel`` calls and scikit-learn fits run under both backends and must give the same
results, raise the same exceptions, and leave no worker behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

joblib = pytest.importorskip("joblib")
np = pytest.importorskip("numpy")

from joblib import Parallel, delayed, parallel_config  # noqa: E402

import dpool  # noqa: E402
from dpool.integrations import joblib as dpool_joblib  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("loky", "dpool")


def _shutdown_loky() -> None:
    from joblib.externals.loky import reusable_executor

    ex = reusable_executor._executor
    if ex is not None:
        ex.shutdown(wait=True, kill_workers=True)


def _loky_pids():
    from joblib.externals.loky import reusable_executor

    ex = reusable_executor._executor
    procs = getattr(ex, "_processes", None)
    return None if not procs else frozenset(procs)


@pytest.fixture(scope="module", autouse=True)
def warm_loky():
    """loky's workers start once for the module (each start costs seconds here): they
    are there before any test's leak check looks, and stopped after the last test."""
    Parallel(n_jobs=2, backend="loky")(delayed(square)(i) for i in range(4))
    yield
    _shutdown_loky()


@pytest.fixture(autouse=True)
def warm_executors_closed():
    """Both backends keep an executor warm between calls: close dpool's, and loky's if
    the test replaced its workers (an abort kills them), before the leak check
    (tests/conftest.py) looks for processes left behind."""
    before = _loky_pids()
    yield
    dpool_joblib.close_executor(wait=True)
    if _loky_pids() != before:
        _shutdown_loky()


def both(fn):
    """``{backend: fn()}`` with ``fn`` run under each backend."""
    out = {}
    for name in BACKENDS:
        with parallel_config(backend=name):
            out[name] = fn()
    return out


# -- task functions (module level: loky pickles them by reference) -----------------------
def square(x):
    return x * x


def slow_square(x):
    time.sleep(0.002 * (x % 5))
    return x * x


class Boom(Exception):
    pass


def fail_on(x, bad):
    if x == bad:
        raise Boom(f"task {x} failed")
    return x


def sleep_for(s):
    time.sleep(s)
    return s


def whoami(_):
    return os.getpid()


def nap_pid(_):
    time.sleep(0.05)
    return os.getpid()


def inner_sum(n):
    # a Parallel inside a task: with dpool it runs on the task's worker group
    from joblib.parallel import get_active_backend

    backend = type(get_active_backend()[0]).__name__
    return backend, sum(Parallel(n_jobs=2)(delayed(square)(i) for i in range(n)))


def array_sum(a, i):
    return float(a.sum()) + i


def scribble(a):
    a[0] = -1.0  # dpool maps arguments copy-on-write: the driver's array stays
    return float(a[0])


# -- results and order ---------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    {},
    {"batch_size": 1},
    {"batch_size": 7, "pre_dispatch": "all"},
    {"pre_dispatch": 3},
    {"return_as": "generator"},
])
def test_same_results_in_the_same_order_as_loky(kwargs):
    out = both(lambda: list(Parallel(n_jobs=2, **kwargs)(
        delayed(slow_square)(i) for i in range(60))))
    assert out["dpool"] == out["loky"] == [i * i for i in range(60)]


def test_generator_unordered_gives_every_result_once():
    gen = Parallel(n_jobs=2, backend="dpool", return_as="generator_unordered")(
        delayed(sleep_for)(s) for s in (0.4, 0.0, 0.0, 0.0))
    first = next(gen)
    assert first == 0.0  # the long task does not hold the others back
    assert sorted([first, *gen]) == [0.0, 0.0, 0.0, 0.4]


def test_a_generator_is_lazy():
    consumed = []

    def tasks():
        for i in range(200):
            consumed.append(i)
            yield delayed(square)(i)

    gen = Parallel(n_jobs=2, backend="dpool", return_as="generator", batch_size=1,
                   pre_dispatch=4)(tasks())
    assert next(gen) == 0
    assert len(consumed) < 200  # dispatched as results come back, not all at once
    assert list(gen) == [i * i for i in range(1, 200)]


def test_auto_batching_grows_the_batches_for_short_tasks():
    with parallel_config(backend="dpool", n_jobs=2):
        with Parallel() as p:
            assert p(delayed(square)(i) for i in range(3000)) == [i * i for i in range(3000)]
            assert p._backend.compute_batch_size() > 1
            assert p.n_dispatched_batches < 3000


# -- errors, timeout, abort ----------------------------------------------------------------
def test_an_exception_has_the_same_type_and_the_workers_traceback():
    errors = {}
    for name in BACKENDS:
        with pytest.raises(Boom, match="task 13 failed") as info:
            Parallel(n_jobs=2, backend=name)(delayed(fail_on)(i, 13) for i in range(40))
        errors[name] = info.value
    cause = errors["dpool"].__cause__
    assert cause is not None and "in fail_on" in str(cause), cause
    assert 'raise Boom(f"task {x} failed")' in str(cause)
    assert type(errors["dpool"]) is type(errors["loky"])


def test_an_error_aborts_the_rest_without_waiting_for_it():
    t0 = time.monotonic()
    with pytest.raises(Boom):
        Parallel(n_jobs=2, backend="dpool", batch_size=1)(
            [delayed(fail_on)(0, 0), *[delayed(sleep_for)(20) for _ in range(4)]])
    assert time.monotonic() - t0 < 10


def test_timeout_raises_timeout_error_like_loky():
    import multiprocessing

    raised = {}
    for name in BACKENDS:
        t0 = time.monotonic()
        with pytest.raises(multiprocessing.TimeoutError) as info:  # joblib's choice
            Parallel(n_jobs=2, backend=name, timeout=0.5)(
                delayed(sleep_for)(s) for s in (0.0, 20, 0.0))
        assert time.monotonic() - t0 < 10, name
        raised[name] = type(info.value)
    assert raised["dpool"] is raised["loky"]
    # the backend still works after an abort
    assert Parallel(n_jobs=2, backend="dpool")(delayed(square)(i) for i in range(5)) == \
        [0, 1, 4, 9, 16]


def test_a_pickling_error_is_raised_to_the_caller():
    import threading

    with pytest.raises(TypeError, match="lock"):
        Parallel(n_jobs=2, backend="dpool")(
            delayed(square)(threading.Lock()) for _ in range(3))


def test_unknown_backend_arguments_are_refused():
    with pytest.raises(TypeError, match="no_such_option"):
        with parallel_config(backend="dpool", no_such_option=1):
            pass


# -- callbacks: progress and lazy dispatch go through the done-callbacks -------------------
def test_progress_callbacks_report_every_task(capsys):
    out = Parallel(n_jobs=2, backend="dpool", verbose=50, batch_size=1)(
        delayed(square)(i) for i in range(12))
    assert out == [i * i for i in range(12)]
    captured = capsys.readouterr()
    err = captured.out + captured.err
    assert "Using backend DpoolBackend with 2 concurrent workers." in err
    assert "Done  12 out of  12" in err or "Done 12 out of 12" in err, err


def test_a_managed_parallel_reuses_its_workers():
    with Parallel(n_jobs=2, backend="dpool", batch_size=1) as p:
        first = set(p(delayed(whoami)(i) for i in range(8)))
        second = set(p(delayed(whoami)(i) for i in range(8)))
    assert first and first == second and os.getpid() not in first
    # and a later call (the reusable executor) as well
    assert set(Parallel(n_jobs=2, backend="dpool", batch_size=1)(
        delayed(whoami)(i) for i in range(8))) <= first


# -- nesting, n_jobs -----------------------------------------------------------------------
def test_nested_parallel_runs_on_dpool_without_deadlock():
    # more outer tasks than workers, each waiting on inner tasks of the same pool: a
    # blocked task must give its slot back or this never ends
    out = Parallel(n_jobs=2, backend="dpool", batch_size=1)(
        delayed(inner_sum)(n) for n in range(2, 8))
    assert out == [("DpoolBackend", sum(i * i for i in range(n))) for n in range(2, 8)]


def test_n_jobs_minus_one_is_the_runtimes_cpus():
    with parallel_config(backend="dpool"):
        assert joblib.effective_n_jobs(-1) == dpool.cpu_count()
        assert joblib.effective_n_jobs(-2) == max(dpool.cpu_count() - 1, 1)
        assert joblib.effective_n_jobs(3) == 3
    pids = set(Parallel(n_jobs=-1, backend="dpool", batch_size=1)(
        delayed(nap_pid)(i) for i in range(4 * dpool.cpu_count())))
    assert 1 <= len(pids) <= dpool.cpu_count()


def test_n_jobs_one_runs_in_this_process():
    assert Parallel(n_jobs=1, backend="dpool")(delayed(whoami)(i) for i in range(3)) == \
        [os.getpid()] * 3


# -- large arguments -----------------------------------------------------------------------
def test_a_large_array_is_stored_once_per_call(monkeypatch):
    puts = []
    real_put = dpool_joblib.put
    monkeypatch.setattr(dpool_joblib, "put", lambda v: puts.append(v.nbytes) or real_put(v))
    a = np.arange(300_000, dtype=np.float64)  # 2.4 MB
    out = Parallel(n_jobs=2, backend="dpool", batch_size=1)(
        delayed(array_sum)(a, i) for i in range(10))
    assert out == [float(a.sum()) + i for i in range(10)]
    assert puts == [a.nbytes]
    # arguments are writable in the task (loky's memmaps are read-only), copy-on-write
    assert Parallel(n_jobs=2, backend="dpool")(delayed(scribble)(a) for _ in range(2)) == \
        [-1.0, -1.0]
    assert a[0] == 0.0


def test_an_array_changed_between_dispatches_is_sent_again():
    a = np.zeros(100_000)

    def tasks():
        for i in range(4):
            a[:] = i
            yield delayed(array_sum)(a, 0)

    out = Parallel(n_jobs=2, backend="dpool", batch_size=1, pre_dispatch=1)(tasks())
    # joblib takes tasks from the generator a few at a time: each value the array had
    # when its task was dispatched, never one it did not have
    assert set(out) <= {float(i * a.size) for i in range(4)} and out[0] == 0.0


def _counting_puts(monkeypatch) -> list:
    puts: list = []
    real_put = dpool_joblib.put
    monkeypatch.setattr(dpool_joblib, "put", lambda v: puts.append(v.nbytes) or real_put(v))
    return puts


def array_checksum(a, i):
    return float((a * np.arange(1, a.shape[-1] + 1)).sum()) + i  # depends on the layout


def test_arrays_from_the_store_threshold_and_strided_views_are_stored_once(monkeypatch):
    """An array that would go through shared memory anyway (>= 256 KiB, below joblib's
    "1M") and a strided view (load_digits' X is a column slice) are stored once per
    call, not written to a segment of their own with every batch; the results are
    loky's."""
    puts = _counting_puts(monkeypatch)
    mid = np.arange(40_000, dtype=np.float64)  # 320 KB
    strided = np.arange(2_000 * 65, dtype=np.float64).reshape(2_000, 65)[:, :64]  # 1 MB
    assert not (strided.flags.c_contiguous or strided.flags.f_contiguous)
    for a in (mid, strided):
        out = both(lambda a=a: Parallel(n_jobs=2, batch_size=1)(
            delayed(array_checksum)(a, i) for i in range(8)))
        assert out["dpool"] == out["loky"]
    assert puts == [mid.nbytes, strided.nbytes]


def test_max_nbytes_none_sends_arrays_with_each_batch(monkeypatch):
    puts = _counting_puts(monkeypatch)
    a = np.arange(40_000, dtype=np.float64)
    out = Parallel(n_jobs=2, backend="dpool", batch_size=1, max_nbytes=None)(
        delayed(array_sum)(a, i) for i in range(4))
    assert out == [float(a.sum()) + i for i in range(4)] and puts == []


def test_a_strided_view_changed_between_dispatches_is_sent_again(monkeypatch):
    puts = _counting_puts(monkeypatch)
    base = np.zeros((1_000, 65))
    view = base[:, :64]  # 512 KB, not contiguous

    def tasks():
        for i in range(4):
            base[:] = i
            yield delayed(array_sum)(view, 0)

    out = Parallel(n_jobs=2, backend="dpool", batch_size=1, pre_dispatch=1)(tasks())
    assert set(out) <= {float(i * view.size) for i in range(4)} and out[0] == 0.0
    assert len(puts) == len(set(out))  # stored again whenever its values changed


def test_the_stored_copy_is_compared_bit_for_bit():
    same = dpool_joblib._same_bytes
    a = np.zeros((300, 9))[:, :8]
    b = np.ascontiguousarray(a)
    assert same(a, b, np)
    a[0, 0] = np.nan
    b[0, 0] = np.nan
    assert same(a, b, np)  # a NaN equals itself
    a[0, 0] = -0.0
    b[0, 0] = 0.0
    assert not same(a, b, np)  # -0.0 == 0.0 in value, not in bits
    assert not same(a, b.astype(np.float32), np)


# -- scikit-learn --------------------------------------------------------------------------
def _data():
    from sklearn.datasets import make_classification

    return make_classification(n_samples=240, n_features=12, n_informative=6,
                               random_state=0)


def test_grid_search_fits_as_with_loky():
    pytest.importorskip("sklearn")
    from sklearn.model_selection import GridSearchCV
    from sklearn.tree import DecisionTreeClassifier

    X, y = _data()

    def fit():
        gs = GridSearchCV(DecisionTreeClassifier(random_state=0),
                          {"max_depth": [2, 4, 8], "min_samples_leaf": [1, 5]},
                          cv=3, n_jobs=-1)
        gs.fit(X, y)
        return gs

    out = both(fit)
    assert out["dpool"].best_params_ == out["loky"].best_params_
    np.testing.assert_array_equal(out["dpool"].cv_results_["mean_test_score"],
                                  out["loky"].cv_results_["mean_test_score"])
    np.testing.assert_array_equal(out["dpool"].predict(X), out["loky"].predict(X))


def test_cross_val_score_and_random_forest_as_with_loky():
    pytest.importorskip("sklearn")
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    X, y = _data()
    scores = both(lambda: cross_val_score(LogisticRegression(max_iter=500), X, y, cv=4,
                                          n_jobs=2))
    np.testing.assert_array_equal(scores["dpool"], scores["loky"])
    forests = both(lambda: RandomForestClassifier(n_estimators=16, random_state=0,
                                                  n_jobs=-1).fit(X, y))
    np.testing.assert_array_equal(forests["dpool"].predict_proba(X),
                                  forests["loky"].predict_proba(X))


# -- registration and `python -m dpool run` ------------------------------------------------
def _python(code: str, *args: str, env: dict | None = None, cwd: Path | None = None):
    return subprocess.run([sys.executable, *args, "-c", code] if not args else
                          [sys.executable, *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=cwd)


def test_import_dpool_does_not_import_joblib_and_register_joblib_does():
    code = textwrap.dedent("""
        import sys, dpool
        assert "joblib" not in sys.modules
        dpool.register_joblib()
        from joblib.parallel import BACKENDS
        print(BACKENDS["dpool"].__name__)
    """)
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["DpoolBackend"]


SCRIPT = textwrap.dedent("""
    from joblib import Parallel, delayed
    from joblib.parallel import get_active_backend

    def square(x):
        return x * x

    if __name__ == "__main__":
        print(type(get_active_backend()[0]).__name__)
        print(Parallel(n_jobs=2)(delayed(square)(i) for i in range(5)))
""")


@pytest.mark.parametrize("how, expected", [
    ((), "LokyBackend"),
    (("--joblib",), "DpoolBackend"),
    ("env", "DpoolBackend"),
])
def test_dpool_run_uses_the_backend_when_asked(tmp_path, how, expected):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("DPOOL_JOBLIB", None)
    flags: tuple = ()
    if how == "env":
        env["DPOOL_JOBLIB"] = "1"
    else:
        flags = how
    out = subprocess.run([sys.executable, "-m", "dpool", "run", *flags, str(script)],
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [expected, "[0, 1, 4, 9, 16]"]


def test_dpool_run_refuses_a_bad_dpool_joblib_value(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), DPOOL_JOBLIB="maybe")
    out = subprocess.run([sys.executable, "-m", "dpool", "run", str(script)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "DPOOL_JOBLIB" in out.stderr
    assert "ran" not in out.stdout


def test_the_example_runs(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), DPOOL_EXAMPLE_QUICK="1")
    env.pop("DPOOL_ADDRESS", None)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "joblib_grid_search.py")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "same best parameters as loky: True" in out.stdout, out.stdout
