"""pytest plugin: ``--dpool`` runs pytest-xdist's test workers as dpool tasks.

Loaded by pytest on every run (the ``pytest11`` entry point ``dpool``), so at import it
adds two options and nothing else: without ``--dpool`` a run is unchanged and pays no
import of dpool's runtime. With it (and ``-n``/``--numprocesses``):

- ``-n auto`` / ``-n logical`` mean the CPU count of the cluster (``dpool.cpu_count()``:
  this machine's on the embedded runtime, every node's with ``DPOOL_ADDRESS`` set);
- every test worker is a dpool task started at once (see ``_controller``), on the
  embedded runtime or on the cluster's nodes, with the test files shipped there as the
  working directory (pytest's rootdir);
- ``--dpool-resources '{"GPU": 1}'`` asks that much per test worker.

It never patches xdist: it uses xdist's hooks (``pytest_xdist_auto_num_workers``,
``pytest_xdist_setupnodes``, ``pytest_configure_node``, ``pytest_xdist_getremotemodule``)
and execnet's gateway specs.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dpool", "dpool: run pytest-xdist's test workers on dpool")
    group.addoption(
        "--dpool", action="store_true", default=False,
        help="run the test workers of -n/--numprocesses as dpool tasks: on this machine, or "
             "on the cluster's nodes when DPOOL_ADDRESS is set (-n auto: the cluster's "
             "CPUs).")
    group.addoption(
        "--dpool-resources", default=None, metavar="JSON",
        help='resources each test worker asks dpool for, as JSON, e.g. \'{"GPU": 1}\'.')
    group.addoption(
        "--dpool-start-timeout", type=float, default=120.0, metavar="SECONDS",
        help="how long a test worker may wait for a dpool worker to start it (default "
             "120).")


def _active(config: pytest.Config) -> bool:
    """``--dpool`` given, in the controller (an xdist worker has ``workerinput``)."""
    return bool(config.getoption("dpool", False)) and not hasattr(config, "workerinput")


def parse_resources(text: Optional[str]) -> Optional[dict]:
    """``--dpool-resources``' JSON as ``{name: positive number}``; UsageError if not."""
    if text is None:
        return None
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise pytest.UsageError(f"--dpool-resources is not JSON: {exc}") from None
    if not isinstance(value, dict) or not value:
        raise pytest.UsageError(
            f'--dpool-resources must be a JSON object such as {{"GPU": 1}}, got {text!r}')
    for name, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
            raise pytest.UsageError(
                f"--dpool-resources: {name!r} must be a positive number, got {amount!r}")
    return value


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> Optional[int]:
    if not _active(config):
        return None
    from dpool.pool import cpu_count

    return cpu_count()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _active(config):
        return
    if not config.pluginmanager.hasplugin("xdist"):
        raise pytest.UsageError("--dpool runs pytest-xdist's test workers: install "
                                "pytest-xdist (pip install pytest-xdist)")
    resources = parse_resources(config.getoption("dpool_resources"))
    if resources is not None:
        import inspect

        from dpool.executor import ProcessPoolExecutor

        if "resources" not in inspect.signature(ProcessPoolExecutor).parameters:
            raise pytest.UsageError(
                "--dpool-resources needs a dpool whose ProcessPoolExecutor accepts "
                "resources= (per-task resources); this one does not")
    if config.getoption("dist", "no") == "no" or not config.getoption("tx", None):
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            "--dpool has no effect without -n/--numprocesses (or --tx popen)"), stacklevel=2)
        return
    import execnet
    from xdist.workermanage import parse_tx_spec_config

    specs = parse_tx_spec_config(config)
    for spec in map(execnet.XSpec, specs):
        if not spec.popen or spec.via or spec.chdir or spec.python:
            raise pytest.UsageError(
                f"--dpool starts the test workers itself: use -n N instead of --tx {spec}")
    if os.environ.get("DPOOL_ADDRESS"):
        from dpool.pool import cpu_count

        n, cpus = len(specs), cpu_count()
        if n > cpus:  # each test worker holds a CPU: the others would never start
            raise pytest.UsageError(
                f"-n {n} asks for more test workers than the cluster has CPUs ({cpus}): "
                f"use -n auto or at most -n {cpus}")
        _check_shipped(config)
    timeout = config.getoption("dpool_start_timeout")
    config.pluginmanager.register(_DpoolXdist(config, resources, timeout), "dpool-xdist")


class _DpoolXdist:
    """The hooks of a ``--dpool`` run's controller (registered by ``pytest_configure``)."""

    def __init__(self, config: pytest.Config, resources: Optional[dict],
                 timeout: float) -> None:
        self.config = config
        self.resources = resources
        self.timeout = timeout
        self.backend: Any = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config: pytest.Config, specs: list) -> None:
        import execnet

        from dpool.testing._controller import Backend

        rootdir = str(config.rootpath)
        self.backend = Backend(rootdir, self.resources, self.timeout, _marker(config))
        self.backend.start(len(specs))
        for i, spec in enumerate(specs):
            python = self.backend.bridge_command(str(spec.id))
            new = execnet.XSpec(f"popen//python={python}//id={spec.id}")
            if spec.execmodel:
                new = execnet.XSpec(f"execmodel={spec.execmodel}//{new}")
            specs[i] = new

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["dpool_xdist"] = {"root": str(self.config.rootpath)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_getremotemodule(self) -> Any:
        from dpool.testing import _remote

        return _remote

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _paths(config: pytest.Config) -> list[str]:
    """The invocation directory and the existing paths among the arguments, absolute."""
    cwd = str(config.invocation_params.dir)
    out = [cwd]
    for arg in config.args:
        path = os.path.join(cwd, arg.split("::")[0])
        if os.path.exists(path):
            out.append(os.path.abspath(path))
    return out


def _check_shipped(config: pytest.Config) -> None:
    """In cluster mode the nodes get pytest's rootdir as dpool ships it, which leaves out
    virtual environments, caches and version control: running from, or naming tests in,
    such a directory would run something else on the nodes. Say so instead."""
    from dpool.protocol import workdir as _workdir

    root = str(config.rootpath)
    for path in _paths(config):
        if not _under(path, root):
            continue
        parts = os.path.relpath(path, root).split(os.sep)
        here = root
        for part in parts:
            if part in ("", "."):
                continue
            here = os.path.join(here, part)
            if part in _workdir.SKIP_DIRS or os.path.exists(os.path.join(here, "pyvenv.cfg")):
                raise pytest.UsageError(
                    f"--dpool ships pytest's rootdir {root} to the cluster's nodes without "
                    f"{here} (dpool skips virtual environments, caches and version "
                    f"control), but the tests to run are in it: run pytest with a rootdir "
                    f"that holds them (a pytest.ini / pyproject.toml [tool.pytest.ini_options]"
                    f" there, or --rootdir)")


def _marker(config: pytest.Config) -> Optional[str]:
    """A file under rootdir that a node's copy of it must hold: the first file named on
    the command line, else the ini file (a test worker checks it runs in the right
    directory)."""
    root = str(config.rootpath)
    candidates = [p for p in _paths(config)[1:] if os.path.isfile(p)]
    if config.inipath is not None:
        candidates.append(str(config.inipath))
    for path in candidates:
        if _under(path, root) and path != root:
            return os.path.relpath(path, root)
    return None
