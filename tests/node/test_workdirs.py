"""Packing the driver's working directory for the cluster's nodes, and unpacking it."""

from __future__ import annotations

import io
import os
import zipfile

import pytest

from dpool.errors import Error
from dpool.node._workdirs import WorkdirCache
from dpool.protocol import _workdir


def _project(root):
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("X = 1\n")
    (root / "main.py").write_text("import pkg\n")
    for skipped in (".git", "__pycache__", ".venv", "node_modules"):
        (root / skipped).mkdir()
        (root / skipped / "junk").write_text("no")
    (root / "env").mkdir()
    (root / "env" / "pyvenv.cfg").write_text("home = /usr\n")  # a venv by any name
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


def test_package_ships_code_and_skips_the_rest(tmp_path):
    root = _project(tmp_path / "p")
    digest, archive = _workdir.package(str(root))
    names = sorted(zipfile.ZipFile(io.BytesIO(archive)).namelist())
    assert names == ["main.py", "pkg/__init__.py", "run.sh"]
    cache = WorkdirCache(str(tmp_path / "cache"))
    here = cache.add(digest, archive)
    assert open(os.path.join(here, "pkg", "__init__.py")).read() == "X = 1\n"
    assert os.access(os.path.join(here, "run.sh"), os.X_OK)
    assert cache.add(digest, archive) == here == cache.path(digest)


def test_the_digest_follows_the_content(tmp_path, monkeypatch):
    root = _project(tmp_path / "p")
    d1, _ = _workdir.package(str(root))
    assert _workdir.package(str(root))[0] == d1  # unchanged: same digest
    (root / "pkg" / "__init__.py").write_text("X = 2\n")
    d2, _ = _workdir.package(str(root))
    assert d2 != d1
    (root / "__pycache__" / "more").write_text("still not shipped")
    assert _workdir.package(str(root))[0] == d2
    monkeypatch.setenv("DPOOL_WORKING_DIR_FILE_LIMIT", "3")  # bigger files are left out
    d3, archive = _workdir.package(str(root))
    assert zipfile.ZipFile(io.BytesIO(archive)).namelist() == []
    assert d3 != d2


def test_limits_and_choices(tmp_path, monkeypatch):
    root = _project(tmp_path / "p")
    monkeypatch.setenv("DPOOL_WORKING_DIR_LIMIT", "10")
    with pytest.raises(Error, match="DPOOL_WORKING_DIR_LIMIT"):
        _workdir.package(str(root))
    monkeypatch.setenv("DPOOL_WORKING_DIR", "off")
    assert _workdir.chosen() is None
    monkeypatch.setenv("DPOOL_WORKING_DIR", str(root))
    assert _workdir.chosen() == str(root)
    assert _workdir.chosen(str(root / "pkg")) == str(root / "pkg")  # the keyword wins
    with pytest.raises(Error, match="not a directory"):
        _workdir.chosen(str(root / "main.py"))


def test_map_path():
    assert _workdir.map_path("/a/b", "/a/b", "/c") == "/c"
    assert _workdir.map_path("/a/b/src", "/a/b", "/c") == "/c/src"
    assert _workdir.map_path("/a/bc", "/a/b", "/c") == "/a/bc"
    assert _workdir.map_path("/usr/lib/python3", "/a/b", "/c") == "/usr/lib/python3"


def test_an_archive_cannot_write_outside_its_directory(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("../../escaped", "x")
    cache = WorkdirCache(str(tmp_path / "cache"))
    with pytest.raises(Error, match="outside"):
        cache.add("abc123", buf.getvalue())
    assert not (tmp_path / "escaped").exists()
    assert cache.path("abc123") is None
    assert os.listdir(tmp_path / "cache") == []
