"""The executable store is private, signed and bounded (issue 22), and its key covers only
what decides compiled code (issue 16, item 7).

Entries are pickles, so a file planted in the store would run code when loaded: only
regular files of this user's, signed with their key, are ever unpickled. Most tests work
on a store of their own in ``tmp_path`` (in this process, calling exe_store directly);
the end-to-end ones run a child process. Tests run as root, so "another user" is
simulated with ``os.chown`` to ``nobody``.
"""
from __future__ import annotations

import functools
import json
import os
import pickle
import re
import shutil
import stat
import subprocess
import sys
import threading
import warnings
import zlib

import pytest

import xlanb
from conftest import _child_env, counter
from xlanb.runtime import store as exe_store
from xlanb.base.config import Config, SettingError, config
from xlanb.base.formats import parse_bytes

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

NOBODY = 65534
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "ab" + "0" * 62  # any hex key: the tests write its entry themselves


class _Planted:
    """A pickle that creates ``marker`` when unpickled (what an attacker would plant)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A store of this test's own: cache dir and signing key under ``tmp_path``."""
    monkeypatch.setattr(config, "store_dir", str(tmp_path / "cache"))
    monkeypatch.setattr(config, "store_key_file", str(tmp_path / "config" / "xlanb" / "store-key"))
    monkeypatch.setattr(exe_store, "_rejected", [])  # its warn-once state
    return tmp_path


def _planted_blobs(marker) -> dict[str, bytes]:
    """The ways a planted payload can be shaped, from the old format to a well-formed
    entry signed with someone else's key."""
    body = zlib.compress(pickle.dumps(_Planted(marker)))
    return {
        "old format": body,
        "no tag": exe_store._MAGIC + bytes(exe_store._TAG_LEN) + body,
        "other key": exe_store._MAGIC + exe_store._sign(b"k" * 32, KEY, body) + body,
    }


def test_the_planted_payload_is_live(tmp_path):
    """Control: unpickling the payload does create the marker, so its absence below means
    that nothing was unpickled."""
    marker = tmp_path / "ran"
    pickle.loads(zlib.decompress(_planted_blobs(marker)["old format"]))
    assert marker.exists()


@pytest.mark.parametrize("shape", ["old format", "no tag", "other key"])
def test_planted_entry_is_never_unpickled(store, shape):
    marker = store / "ran"
    path = exe_store._path(KEY)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(_planted_blobs(marker)[shape])
    with pytest.warns(RuntimeWarning, match="not signed with your store key"):
        assert exe_store.load(KEY, 0) is None
    assert not marker.exists(), "the planted payload ran"
    assert not os.path.exists(path), "the rejected entry was kept"
    assert counter("PersistentCacheRejected") == 1
    assert counter("PersistentCacheMiss") == 1 and counter("PersistentCacheHit") == 0


def test_entry_signed_for_another_key_is_rejected(store):
    """A genuine entry copied to another key's name does not verify there."""
    path = exe_store._path(KEY)
    exe_store._write(path, KEY, b"body")
    assert bytes(exe_store._read_verified(path, KEY)) == b"body"  # control: it verifies
    other = KEY[:-1] + "1"
    shutil.copy(path, exe_store._path(other))
    with pytest.raises(exe_store._Rejected):
        exe_store._read_verified(exe_store._path(other), other)


@pytest.mark.parametrize("kind", ["foreign owner", "group writable", "symlink", "fifo", "directory"])
def test_entry_that_is_not_a_private_file_is_rejected(store, kind):
    marker = store / "ran"
    path = exe_store._path(KEY)
    exe_store._write(path, KEY, zlib.compress(pickle.dumps(_Planted(marker))))
    if kind == "foreign owner":
        os.chown(path, NOBODY, NOBODY)
    elif kind == "group writable":
        os.chmod(path, 0o620)
    elif kind == "symlink":  # a correctly signed entry elsewhere, linked in
        os.rename(path, store / "elsewhere")
        os.symlink(store / "elsewhere", path)
    elif kind == "fifo":  # must not hang the open
        os.unlink(path)
        os.mkfifo(path, 0o600)
    else:
        os.unlink(path)
        os.mkdir(path, 0o700)
    with pytest.warns(RuntimeWarning, match="rejected"):
        assert exe_store.load(KEY, 0) is None
    assert not marker.exists(), "the payload ran"
    assert counter("PersistentCacheRejected") == 1
    if kind != "directory":  # a directory is left in place (unlink cannot remove it)
        assert not os.path.lexists(path)


def test_store_is_created_private(store):
    exe_store._write(exe_store._path(KEY), KEY, b"body")
    root = exe_store.directory()
    levels = [config.store_dir, root, os.path.join(root, exe_store.env_tag()),
              os.path.dirname(exe_store._path(KEY))]
    modes = {d: stat.S_IMODE(os.stat(d).st_mode) for d in levels}
    assert all(m == 0o700 for m in modes.values()), modes
    assert stat.S_IMODE(os.stat(exe_store._path(KEY)).st_mode) == 0o600
    key_file = config.store_key_file
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(key_file)).st_mode) == 0o700
    assert not key_file.startswith(config.store_dir)
    assert os.path.getsize(key_file) == 32


@pytest.mark.parametrize("level", ["cache dir", "store root"])
@pytest.mark.parametrize("problem", ["0o777", "0o1777", "0o770", "foreign owner"])
def test_directory_others_can_write_is_refused(store, level, problem):
    d = config.store_dir if level == "cache dir" else os.path.join(config.store_dir, exe_store._DIR)
    os.makedirs(d, 0o700)
    if problem == "foreign owner":
        os.chown(d, NOBODY, NOBODY)
    else:
        os.chmod(d, int(problem, 8))
    match = "owned by uid 65534" if problem == "foreign owner" else "writable by group or others"
    with pytest.warns(RuntimeWarning, match=re.escape(f"store is turned off: {d} is {match}")):
        assert exe_store.directory() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert exe_store.directory() is None
        assert exe_store.load(KEY, 0) is None
        exe_store.store(KEY, object())
    assert not os.path.exists(config.store_key_file), "made a key for a refused store"
    assert counter("PersistentCacheMiss") == 0 and counter("PersistentCacheRejected") == 0


def test_private_directory_is_accepted(store):
    os.makedirs(config.store_dir, 0o755)  # readable by others is fine, as for ssh
    os.makedirs(os.path.dirname(config.store_key_file), 0o700)  # (a missing one is said)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert exe_store.directory() == os.path.join(config.store_dir, exe_store._DIR)


@pytest.mark.parametrize("problem", ["0o644", "foreign owner", "short"])
def test_unsafe_key_file_turns_the_store_off(store, problem):
    key_file = config.store_key_file
    os.makedirs(os.path.dirname(key_file))
    with open(key_file, "wb") as f:
        f.write(b"k" * (8 if problem == "short" else 32))
    os.chmod(key_file, 0o644 if problem == "0o644" else 0o600)
    if problem == "foreign owner":
        os.chown(key_file, NOBODY, NOBODY)
    with pytest.warns(RuntimeWarning, match="signing key .* cannot be used"):
        assert exe_store.directory() is None


def test_key_file_location(monkeypatch, tmp_path):
    monkeypatch.delenv("XLANB_STORE_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert Config().store_key_file == str(tmp_path / "xdg" / "xlanb" / "store-key")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Config().store_key_file == str(tmp_path / "home" / ".config" / "xlanb" / "store-key")
    monkeypatch.setenv("XLANB_STORE_KEY", str(tmp_path / "k"))
    assert Config().store_key_file == str(tmp_path / "k")


def test_a_key_file_in_a_missing_folder_says_it_made_the_folder(store):
    """Issue 46: ``XLANB_STORE_KEY`` (here the fixture's key path) in a folder that does
    not exist made the folders silently; a mistyped path went unnoticed."""
    top = os.path.join(str(store), "config")
    with pytest.warns(UserWarning, match=re.escape(f"created the folder {top} (0700)")):
        key = exe_store._read_or_create_secret(config.store_key_file)
    assert oct(os.stat(top).st_mode & 0o777) == "0o700"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the folder is there now: nothing more to say
        assert exe_store._read_or_create_secret(config.store_key_file) == key


def test_racing_key_creation_keeps_one_key(store):
    """The key is linked into place, never replaced: whoever links first wins, and every
    racer reads that key."""
    barrier = threading.Barrier(8)
    got = []

    def create():
        barrier.wait()
        got.append(exe_store._read_or_create_secret(config.store_key_file))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1
    assert exe_store._read_or_create_secret(config.store_key_file) == got[0]
    assert os.listdir(os.path.dirname(config.store_key_file)) == ["store-key"]  # no temp left


# ---------------------------------------------------------------------------------------
# The cap

def test_max_bytes_setting(monkeypatch):
    monkeypatch.delenv("XLANB_STORE_MAX_BYTES", raising=False)
    assert Config().store_max_bytes == 2 << 30
    monkeypatch.setenv("XLANB_STORE_MAX_BYTES", "500M")
    assert Config().store_max_bytes == 500 << 20
    assert parse_bytes("4096") == 4096 and parse_bytes("1.5K") == 1536 and parse_bytes("2GiB") == 2 << 30
    monkeypatch.setenv("XLANB_STORE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="XLANB_STORE_MAX_BYTES"):
        Config()


def _plant_stale(root, rel: str, size: int, mtime: int) -> str:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"x" * size)
    os.utime(path, (mtime, mtime))
    return path


def test_cap_evicts_other_versions_first_then_least_recently_used(store, monkeypatch):
    body = b"b" * 1000
    size = len(exe_store._MAGIC) + exe_store._TAG_LEN + len(body)
    monkeypatch.setattr(config, "store_max_bytes", size * 11 // 2)  # room for 5.5 entries
    root = exe_store.directory()
    keys = {name: name * 64 for name in "abcdfg"}  # a..g: hex keys

    def write(name):
        exe_store._write(exe_store._path(keys[name]), keys[name], body)
        assert sum(e.size for e in exe_store.entries(root)) <= config.store_max_bytes

    def left():
        names = {v: k for k, v in keys.items()}
        return sorted(names.get(os.path.basename(e.path), os.path.basename(e.path))
                      for e in exe_store.entries(root))

    # entries of another environment and of the old flat layout, used more recently
    _plant_stale(root, f"{'0' * 16}/88/{'8' * 64}", size, 9000)
    _plant_stale(root, f"99/{'9' * 64}", size, 8000)
    for name, mtime in zip("abc", (1000, 3000, 2000)):
        write(name)
        os.utime(exe_store._path(keys[name]), (mtime, mtime))
    assert len(left()) == 5
    assert exe_store._read_verified(exe_store._path(keys["a"]), keys["a"]) is not None  # a load
    assert os.stat(exe_store._path(keys["a"])).st_mtime > 3000  # refreshes the LRU clock
    write("d")  # over the cap: the other versions go, though used later than a, b, c
    assert left() == ["a", "b", "c", "d"]
    write("f")
    write("g")  # over again: now the least recently used: c (2000), then b (3000)
    assert left() == ["a", "d", "f", "g"]


def test_cap_holds_across_processes_first_write_scans(store, monkeypatch):
    """A process that finds the store already over the cap trims it at its first write."""
    monkeypatch.setattr(config, "store_max_bytes", 10_000)
    root = exe_store.directory()
    for i in range(30):
        _plant_stale(root, f"{exe_store.env_tag()}/{i:02x}/{i:02x}{'0' * 62}", 1000, 1000 + i)
    exe_store._write(exe_store._path(KEY), KEY, b"body")
    found = exe_store.entries(root)
    assert sum(e.size for e in found) <= 10_000
    assert exe_store._path(KEY) in {e.path for e in found}  # the newest stays


# ---------------------------------------------------------------------------------------
# The key (issue 16, item 7)

def test_key_sources_exist():
    """Every declared source is in the tree: a module that moved must be renamed here,
    or edits to it would keep stale executables."""
    for rel in exe_store.KEY_SOURCES:
        assert os.path.exists(os.path.join(exe_store._ROOT, rel)), rel
    files = exe_store._key_files(exe_store._ROOT)
    assert any("lowering" + os.sep in f for f in files)
    assert not any(f.endswith(("metrics.py", "display.py", "cache.py")) for f in files)


def test_key_covers_the_lowerings_and_not_the_rest(tmp_path, monkeypatch):
    copy = tmp_path / "xlanb"
    shutil.copytree(exe_store._ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    original = exe_store._source_digest
    digest = original.__wrapped__
    assert digest(str(copy)) == exe_store._source_digest()  # same sources, same digest
    base = exe_store.key(b"graph", 0, None)

    def key_with_tree():
        monkeypatch.setattr(exe_store, "_source_digest", functools.partial(digest, str(copy)))
        return exe_store.key(b"graph", 0, None)

    assert key_with_tree() == base
    metrics_py = copy / "base" / "metrics.py"  # a docstring edit outside the lowerings
    metrics_py.write_text(metrics_py.read_text().replace('"""', '"""Edited. ', 1))
    assert key_with_tree() == base
    lowering = copy / "lowering" / "aten_elementwise.py"  # a lowering edit
    lowering.write_text(lowering.read_text() + "\nEDITED = True\n")
    assert key_with_tree() != base
    monkeypatch.setattr(exe_store, "FORMAT_VERSION", exe_store.FORMAT_VERSION + 1)
    assert digest(exe_store._ROOT) != original()  # the format version counts


# ---------------------------------------------------------------------------------------
# End to end, in child processes

SCRIPT = """
import json, os, warnings
warnings.simplefilter("ignore")
import torch, xlanb
from xlanb import metrics
torch.manual_seed(0)
x = torch.randn(3, 6)
xlanb.set_mode("lazy")
a = torch.tanh(x.to("xla") * 2).sum(0)
xlanb.sync()
xlanb.set_mode("eager")
b = (x.to("xla") * 3).exp()
values = {"a": a.tolist(), "b": b.tolist()}  # eager's new ops compile (or load) as they are read
names = ("PersistentCacheHit", "PersistentCacheMiss", "PersistentCacheRejected")
print(json.dumps({"counters": {n: metrics.counter_value(n) or 0 for n in names}, **values}))
"""


def _entry_files(cache) -> list[str]:
    return [os.path.join(r, f) for r, _, fs in os.walk(cache) for f in fs]


def _run(env, *, warn=False) -> tuple[dict, str]:
    script = SCRIPT.replace('warnings.simplefilter("ignore")', 'warnings.simplefilter("default")') \
        if warn else SCRIPT
    proc = subprocess.run([sys.executable, "-c", script], env=_child_env(env), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_planted_store_does_not_run_code_end_to_end(tmp_path):
    """The review's reproduction: run once, replace every entry with a payload, run again."""
    env = {"XLANB_STORE_DIR": str(tmp_path / "cache"), "XLANB_STORE_KEY": str(tmp_path / "key")}
    first, _ = _run(env)
    entries = _entry_files(tmp_path / "cache")
    assert len(entries) >= 2, entries
    marker = tmp_path / "ran"
    for path in entries:
        with open(path, "wb") as f:
            f.write(_planted_blobs(marker)["no tag"])
    second, err = _run(env, warn=True)
    assert not marker.exists(), "the planted payload ran"
    c = second["counters"]
    assert c["PersistentCacheRejected"] == len(entries) and c["PersistentCacheHit"] == 0, c
    assert err.count("rejected and deleted an executable-store entry") == 1, err[-3000:]
    assert (second["a"], second["b"]) == (first["a"], first["b"])
    third, _ = _run(env)  # the second run wrote good entries back
    assert third["counters"]["PersistentCacheHit"] == len(entries), third["counters"]


def test_world_writable_cache_dir_is_refused_and_the_program_runs(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    key = tmp_path / "key"
    got, err = _run({"XLANB_STORE_DIR": str(cache), "XLANB_STORE_KEY": str(key)}, warn=True)
    assert err.count("the executable store is turned off") == 1, err[-3000:]
    assert "writable by group or others (mode 0777)" in err
    c = got["counters"]
    assert c == {"PersistentCacheHit": 0, "PersistentCacheMiss": 0, "PersistentCacheRejected": 0}, c
    assert not _entry_files(cache) and not key.exists()
    ok, _ = _run({"XLANB_STORE_DIR": str(tmp_path / "private"), "XLANB_STORE_KEY": str(key)})
    assert (got["a"], got["b"]) == (ok["a"], ok["b"])  # same results as with a store


# ---------------------------------------------------------------------------------------
# python -m xlanb.store

def _cli(store, *args) -> subprocess.CompletedProcess:
    env = _child_env({"XLANB_STORE_DIR": config.store_dir, "XLANB_STORE_KEY": config.store_key_file})
    return subprocess.run([sys.executable, "-m", "xlanb.store", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_info_prune_clear(store):
    root = os.path.join(config.store_dir, exe_store._DIR)
    info = _cli(store, "info")
    assert info.returncode == 0, info.stderr
    assert f"store:    {root}" in info.stdout and "status:   on" in info.stdout
    assert "entries:  0, 0 B" in info.stdout
    assert not os.path.exists(config.store_key_file), "info made a key"

    for i, name in enumerate("abc"):
        exe_store._write(exe_store._path(name * 64), name * 64, b"x" * 1000)
        os.utime(exe_store._path(name * 64), (1000 + i, 1000 + i))
    stale = _plant_stale(root, f"{'0' * 16}/ee/{'e' * 64}", 1000, 9000)
    leftover = _plant_stale(root, f"{exe_store.env_tag()}/aa/.tmp-dead", 10, 1000)
    info = _cli(store, "info")
    assert info.returncode == 0 and "entries:  4," in info.stdout, info.stdout
    assert "other versions: 1, 1000 B" in info.stdout, info.stdout

    prune = _cli(store, "prune", "--max-bytes", "2100")  # room for two current entries
    assert prune.returncode == 0, prune.stderr
    assert "deleted 1 entries of other versions" in prune.stdout, prune.stdout
    assert "1 least recently used" in prune.stdout and "1 leftover temporary files" in prune.stdout
    assert not os.path.exists(stale) and not os.path.exists(leftover)
    assert sorted(os.path.basename(e.path)[0] for e in exe_store.entries(root)) == ["b", "c"]

    clear = _cli(store, "clear")
    assert clear.returncode == 0 and "deleted 2 entries" in clear.stdout, clear.stdout
    assert exe_store.entries(root) == [] and os.path.isdir(root)


def test_cli_refuses_a_store_others_can_write(store):
    exe_store._write(exe_store._path(KEY), KEY, b"body")
    os.chmod(config.store_dir, 0o777)
    for command in ("prune", "clear"):
        proc = _cli(store, command)
        assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
        assert "writable by group or others" in proc.stderr
    assert os.path.exists(exe_store._path(KEY)), "touched a refused store"
    info = _cli(store, "info")
    assert info.returncode == 1 and "status:   off:" in info.stdout, info.stdout  # as prune, clear


def test_cli_usage_errors():
    for args in ((), ("nonsense",), ("prune", "--max-bytes", "lots")):
        proc = subprocess.run([sys.executable, "-m", "xlanb.store", *args], cwd=REPO,
                              env=_child_env(None), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "usage: python -m xlanb.store" in proc.stderr


def test_the_store_answers_to_its_first_names(store, tmp_path, monkeypatch):
    """The store was once called the cache (issue 44 made "store" its one word): the old
    variables, settings and command still work, and the new names win over the old."""
    old = tmp_path / "old"
    monkeypatch.delenv("XLANB_STORE_DIR", raising=False)
    monkeypatch.delenv("XLANB_STORE_MAX_BYTES", raising=False)
    monkeypatch.setenv("XLANB_CACHE_DIR", str(old))
    monkeypatch.setenv("XLANB_CACHE_MAX_BYTES", "3M")
    c = Config()
    assert (c.store_dir, c.store_max_bytes) == (str(old), 3 << 20)
    monkeypatch.setenv("XLANB_CACHE_MAX_BYTES", "lots")  # an error names what was set
    with pytest.raises(SettingError, match="XLANB_CACHE_MAX_BYTES"):
        Config()
    monkeypatch.setenv("XLANB_STORE_DIR", "")  # the new name, set, wins: the store is off
    monkeypatch.setenv("XLANB_STORE_MAX_BYTES", "5M")
    c = Config()
    assert (c.store_dir, c.store_max_bytes) == (None, 5 << 20)
    c.cache_dir, c.cache_max_bytes, c.cache_readonly = str(old), "7M", "1"
    assert (c.store_dir, c.store_max_bytes, c.store_readonly) == (str(old), 7 << 20, True)
    assert (c.cache_dir, c.cache_max_bytes, c.cache_readonly) == (str(old), 7 << 20, True)

    env = _child_env({"XLANB_CACHE_DIR": config.store_dir, "XLANB_STORE_KEY": config.store_key_file})
    del env["XLANB_STORE_DIR"]  # the policy turns the store off by its new name
    info = subprocess.run([sys.executable, "-m", "xlanb.cache", "info"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert f"store:    {os.path.join(config.store_dir, exe_store._DIR)}" in info.stdout
