"""``dpool.progress``: the same items, order and exceptions as without it, for futures,
map/imap iterators and AsyncResults; tqdm's bar, and the plain line without tqdm;
``python -m dpool run --progress``."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from concurrent.futures import as_completed

import pytest

import dpool
from dpool import Pool, ProcessPoolExecutor
from dpool.observe import _progress


def slow_square(x):
    time.sleep(0.002 * (x % 3))
    return x * x


def fail_on_3(x):
    if x == 3:
        raise KeyError(x)
    return x


@pytest.fixture(params=["tqdm", "plain"])
def bar_kind(request, monkeypatch):
    if request.param == "plain":
        monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    else:
        pytest.importorskip("tqdm")
    return request.param


def _bar_of(kind):
    return _progress.PlainBar if kind == "plain" else _progress._TqdmBar


def test_futures_keep_their_order_and_failures_are_counted(bar_kind):
    out = io.StringIO()
    with ProcessPoolExecutor(2) as ex:
        fs = [ex.submit(fail_on_3, i) for i in range(8)]
        seen = list(dpool.progress(fs, desc="work", file=out))
    assert seen == fs  # the same objects, in the same order, each done
    assert all(f.done() for f in seen)
    text = out.getvalue()
    assert "8/8" in text and "work" in text
    assert ("1 failed" in text) if bar_kind == "plain" else ("failed=1" in text)


def test_map_imap_and_as_completed_yield_what_they_would(bar_kind):
    xs = list(range(30))
    with Pool(2) as pool:
        expected = [x * x for x in xs]
        out = io.StringIO()
        assert list(dpool.progress(pool.imap(slow_square, xs), total=30, file=out)) == expected
        assert "30/30" in out.getvalue()
        got = list(dpool.progress(pool.imap_unordered(slow_square, xs), file=io.StringIO()))
        assert sorted(got) == expected
    with ProcessPoolExecutor(2) as ex:
        assert list(dpool.progress(ex.map(slow_square, xs), file=io.StringIO())) == expected
        fs = [ex.submit(slow_square, x) for x in xs]
        done = list(dpool.progress(as_completed(fs), total=len(fs), file=io.StringIO()))
        assert set(done) == set(fs)


def test_an_exception_from_the_iterator_passes_through(bar_kind):
    out = io.StringIO()
    with Pool(2) as pool:
        it = dpool.progress(pool.imap(fail_on_3, range(6)), total=6, file=out)
        assert [next(it) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(KeyError):
            next(it)
    assert ("1 failed" in out.getvalue()) if bar_kind == "plain" else True


def test_async_results_are_returned_once_ready(bar_kind):
    with Pool(2) as pool:
        out = io.StringIO()
        ar = pool.map_async(slow_square, range(40), chunksize=4)
        assert dpool.progress(ar, file=out) is ar
        assert ar.ready() and ar.get(0) == [x * x for x in range(40)]
        assert "10/10" in out.getvalue()  # ten chunks
        one = pool.apply_async(fail_on_3, (3,))
        out = io.StringIO()
        assert dpool.progress(one, file=out) is one
        with pytest.raises(KeyError):
            one.get(0)
        assert ("1 failed" in out.getvalue()) if bar_kind == "plain" \
            else ("1/1" in out.getvalue())


def test_a_map_result_counts_the_chunks_done_before_the_bar_started(bar_kind):
    """The bar's total is every chunk of the map, not those left when it starts (it said
    9/9 when a chunk finished before ``progress`` was called)."""
    with Pool(2) as pool:
        ar = pool.map_async(slow_square, range(40), chunksize=4)
        ar.wait(30)  # all ten done before the bar starts
        out = io.StringIO()
        assert dpool.progress(ar, file=out) is ar
        assert "10/10" in out.getvalue() and "/9" not in out.getvalue()


def test_the_bar_drawn_is_the_one_asked_for(bar_kind):
    bar = _progress.make_bar(3, "x", io.StringIO())
    assert isinstance(bar, _bar_of(bar_kind))
    bar.close()


def test_plain_line_shows_rate_and_eta():
    out = io.StringIO()
    bar = _progress.PlainBar(4, "job", out, interval=0)
    bar.update(1)
    bar.update(1, failed=1)
    bar.close()
    # What a terminal shows after the last \r: the line, then the blanks that erase what
    # a longer line before it left (the rate, and so the width, changes between draws).
    last = out.getvalue().rstrip("\n").split("\r")[-1]
    assert last.startswith("job: 2/4 [ 50%]") and "tasks/s" in last and "ETA" in last
    assert last.rstrip(" ").endswith("1 failed")


def test_bad_input_is_a_type_error():
    with pytest.raises(TypeError, match="progress"):
        dpool.progress(42)


SCRIPT = """
from concurrent.futures import ProcessPoolExecutor
import time

def f(x):
    time.sleep(0.2)
    if x == 5:
        raise ValueError(x)
    return x

if __name__ == "__main__":
    with ProcessPoolExecutor(2) as ex:
        fs = [ex.submit(f, i) for i in range(8)]
        print(sum(fut.result() for fut in fs if fut.exception() is None))
"""


@pytest.mark.timeout(120)
def test_run_progress_shows_a_live_line_for_an_unmodified_script(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in __import__("os").environ.items() if k != "DPOOL_ADDRESS"}
    # bytes, decoded here: text=True reads with universal newlines, which turn the live
    # line's "\r" into "\n" (every redraw would look like a line of its own)
    out = subprocess.run([sys.executable, "-m", "dpool", "run", "--progress", str(script)],
                         capture_output=True, timeout=100, env=env, cwd=tmp_path)
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    assert out.returncode == 0, stderr
    assert stdout.strip() == str(sum(range(8)) - 5)  # the program's own output
    assert stderr.endswith("\n") and stderr.count("\n") == 1, repr(stderr)  # one line
    final = stderr.strip().split("\r")[-1].strip()
    assert final.startswith("dpool: 7 done, 0 running, 0 queued, 1 failed"), repr(stderr)
    assert "CPUs used" in final
