"""The executable store's low-severity findings of issue 37 (items 6-9): a planted
directory is really deleted, leftover temporary files count and show, refused directories
are never written into, subfolders are checked too, ``cache info`` says off with exit 1,
and key errors say what is wrong with the key."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from conftest import _child_env, counter
from xlanb.base.config import config
from xlanb.runtime import store as exe_store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "cd" + "0" * 62


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A store of this test's own: cache dir and signing key under ``tmp_path``."""
    monkeypatch.setattr(config, "store_dir", str(tmp_path / "cache"))
    monkeypatch.setattr(config, "store_key_file", str(tmp_path / "config" / "xlanb" / "store-key"))
    monkeypatch.setattr(exe_store, "_rejected", [])
    monkeypatch.setattr(exe_store, "_write_failed", [])
    return tmp_path


def _cli(*args) -> subprocess.CompletedProcess:
    env = _child_env({"XLANB_STORE_DIR": config.store_dir, "XLANB_STORE_KEY": config.store_key_file})
    return subprocess.run([sys.executable, "-m", "xlanb.store", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _plant_dir(path: str) -> None:
    os.makedirs(os.path.join(path, "inner"))
    with open(os.path.join(path, "inner", "f"), "w") as f:
        f.write("x")


def test_a_directory_planted_at_an_entrys_path_is_deleted_and_the_store_stays_writable(store):
    path = exe_store._path(KEY)
    _plant_dir(path)
    before = counter("PersistentCacheRejected")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert exe_store.load(KEY, 0) is None
        assert not os.path.exists(path), "reported deleted, still there"
        _plant_dir(path)  # planted again, right before a write
        exe_store._write(path, KEY, b"body")
    assert counter("PersistentCacheRejected") - before == 2
    msgs = [str(x.message) for x in w]
    assert any("rejected and deleted" in m for m in msgs), msgs
    assert not any("cannot write" in m for m in msgs), msgs  # the store is not unwritable
    assert os.path.isfile(path) and exe_store._read_verified(path, KEY) == b"body"


def test_leftover_temporary_files_count_toward_the_cap_and_show_in_info(store, monkeypatch):
    exe_store._write(exe_store._path(KEY), KEY, b"x" * 100)
    root = exe_store._root_of(exe_store._path(KEY))
    dead = os.path.join(os.path.dirname(exe_store._path(KEY)), ".tmp-dead")
    fresh = os.path.join(os.path.dirname(exe_store._path(KEY)), ".tmp-writing")
    for p, mtime in ((dead, 1000), (fresh, None)):
        with open(p, "wb") as f:
            f.write(b"t" * 5000)
        if mtime:
            os.utime(p, (mtime, mtime))
    found = exe_store.entries(root)
    assert dead in [e.path for e in found] and fresh not in [e.path for e in found]
    info = _cli("info")
    assert info.returncode == 0, info.stderr
    assert "leftover temporary files: 1, 4.9 KiB" in info.stdout, info.stdout
    # over the cap, the leftover goes first; the write in progress is left alone
    monkeypatch.setattr(exe_store, "_usage", {})
    monkeypatch.setattr(config, "store_max_bytes", 3000)
    exe_store._write(exe_store._path("ef" + "0" * 62), "ef" + "0" * 62, b"y" * 100)
    assert not os.path.exists(dead) and os.path.exists(fresh)
    assert os.path.exists(exe_store._path(KEY))


def test_a_refused_directory_is_not_written_into(store):
    cache = store / "open"
    cache.mkdir()
    os.chmod(cache, 0o777)
    config.store_dir = str(cache)
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        assert exe_store.directory() is None
    assert os.listdir(cache) == [], "created inside a refused directory"
    info = _cli("info")
    assert info.returncode == 1 and "status:   off:" in info.stdout, (info.stdout, info.stderr)


def test_a_world_writable_subfolder_inside_a_private_root_refuses_the_store(store):
    exe_store._write(exe_store._path(KEY), KEY, b"body")
    shard = os.path.dirname(exe_store._path(KEY))
    os.chmod(shard, 0o777)
    assert exe_store.dir_problem(config.store_dir) == \
        f"{shard} is writable by group or others (mode 0777)"
    exe_store._refusals.clear()
    with pytest.warns(RuntimeWarning, match=f"{shard} is writable by group or others"):
        assert exe_store.directory() is None


@pytest.mark.parametrize("shape,expected", [
    ("64 bytes", "not an xlanb store key (64 bytes, not 32)"),
    ("empty", "not an xlanb store key (0 bytes, not 32)"),
    ("directory", "a directory, not a file"),
])
def test_a_bad_key_file_is_described_as_it_is(store, shape, expected):
    key = config.store_key_file
    os.makedirs(os.path.dirname(key), mode=0o700)
    if shape == "directory":
        os.mkdir(key, 0o700)
    else:
        fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, os.urandom(64) if shape == "64 bytes" else b"")
        os.close(fd)
    secret, why = exe_store._load_secret(key)
    assert secret is None and why == f"its signing key {key} cannot be used ({expected})", why
