"""Executables persist across processes in xlanb's executable store: a second process
running the same script reads them (whole graphs and single-op executables) without
lowering anything, and the metrics say so. ``XLANB_STORE_DIR=""`` turns it off."""
from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

SCRIPT = """
import json, warnings
warnings.simplefilter("ignore")
import torch, xlanb
from xlanb import metrics
torch.manual_seed(0)
w = torch.randn(6, 5)
x = torch.randn(3, 6)
metrics.clear()
xlanb.set_mode("lazy")                      # one whole graph
a = torch.tanh(x.to("xla") @ w.to("xla")).sum(0)
xlanb.sync()
xlanb.set_mode("eager")                     # single-op executables
b = (x.to("xla") * 3).exp()
xlanb.set_mode("opbyop")                    # single-op executables via a sync
c = (x.to("xla") - 1).abs().sum()
xlanb.sync()
names = ("PersistentCacheHit", "PersistentCacheMiss", "UncachedCompile", "OpCompile",
         "EagerRunCompile")
lowerings = sum((metrics.metric_data(n) or (0,))[0] for n in ("LowerTime", "OpLowerTime"))
g = xlanb.graphs()[0]
print(json.dumps({"counters": {n: metrics.counter_value(n) or 0 for n in names},
                  "lowerings": lowerings, "hlo": g.hlo(), "optimized": g.hlo(optimized=True),
                  "a": a.tolist(), "b": b.tolist(), "c": c.item()}))
"""


def _run(python_child, env):
    out = python_child(SCRIPT, env)
    return json.loads(out.strip().splitlines()[-1])


def _files_under(path) -> list[str]:
    found = []
    for root, _dirs, files in os.walk(path):
        found += [os.path.join(root, f) for f in files]
    return found


def test_second_process_reads_persistent_cache(python_child, tmp_path):
    cache = tmp_path / "cache"
    env = {"XLANB_STORE_DIR": str(cache), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    first = _run(python_child, env)
    c1 = first["counters"]
    assert c1["UncachedCompile"] >= 1 and c1["OpCompile"] >= 1, c1
    assert c1["EagerRunCompile"] == 1, c1  # eager's new ops: one run, one quick graph
    assert c1["PersistentCacheMiss"] >= 1 and c1["PersistentCacheHit"] == 0, c1
    written = _files_under(cache)
    assert written, "nothing written to XLANB_STORE_DIR"
    # single-op executables and eager runs are stored too: at least one entry per compile
    compiled = c1["UncachedCompile"] + c1["OpCompile"] + c1["EagerRunCompile"]
    assert len(written) >= compiled, (len(written), c1)
    assert not _files_under(tmp_path / "xdg"), "wrote to the default cache dir as well"

    second = _run(python_child, env)
    c2 = second["counters"]
    assert c2["PersistentCacheHit"] > 0, c2
    # the same script compiles the same things, and every one of them is read back
    assert c2 | {"PersistentCacheHit": 0, "PersistentCacheMiss": 0} == \
        c1 | {"PersistentCacheHit": 0, "PersistentCacheMiss": 0}
    assert c2["PersistentCacheMiss"] == 0, c2
    assert c2["PersistentCacheHit"] == compiled, c2
    # and the values are the same
    assert (second["a"], second["b"], second["c"]) == (first["a"], first["b"], first["c"])
    # nothing was traced or lowered to find them (what makes a warm start fast)...
    assert first["lowerings"] >= compiled, first["lowerings"]
    assert second["lowerings"] == 0, second["lowerings"]
    # ...and a loaded graph still shows its StableHLO (lowered on demand) and optimized HLO
    assert second["hlo"] == first["hlo"] and "stablehlo.dot_general" in second["hlo"]
    assert second["optimized"].startswith("HloModule")


def test_unreadable_entry_is_a_miss_and_is_replaced(python_child, tmp_path):
    cache = tmp_path / "cache"
    env = {"XLANB_STORE_DIR": str(cache)}
    first = _run(python_child, env)
    entries = _files_under(cache)
    for path in entries:  # truncated writes, or another build's files
        with open(path, "wb") as f:
            f.write(b"not an executable")
    second = _run(python_child, env)
    c2 = second["counters"]
    assert c2["PersistentCacheHit"] == 0, c2
    assert c2["PersistentCacheMiss"] == (c2["UncachedCompile"] + c2["OpCompile"]
                                         + c2["EagerRunCompile"]), c2
    assert (second["a"], second["b"], second["c"]) == (first["a"], first["b"], first["c"])
    third = _run(python_child, env)["counters"]  # the second process rewrote them
    assert third["PersistentCacheHit"] == c2["PersistentCacheMiss"], third


def test_unwritable_cache_dir_warns_once_and_runs(tmp_path):
    import subprocess
    import sys
    from conftest import _child_env
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # the cache directory would have to live inside a file
    script = SCRIPT.replace('warnings.simplefilter("ignore")', 'warnings.simplefilter("default")')
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_child_env({"XLANB_STORE_DIR": str(blocker / "cache")}), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["counters"]["UncachedCompile"] >= 1 and got["counters"]["OpCompile"] >= 1
    assert proc.stderr.count("cannot write compiled executables") == 1, proc.stderr[-3000:]


def test_store_key_covers_what_decides_the_code(monkeypatch):
    from xlanb.runtime import store as exe_store
    base = exe_store.key(b"graph", 0, None)
    assert exe_store.key(b"graph", 0, None) == base  # stable
    assert exe_store.key(b"other graph", 0, None) != base
    assert exe_store.key(b"graph", 0, {"xla_cpu_use_fusion_emitters": False}) != base
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert exe_store.key(b"graph", 0, None) != base
    monkeypatch.delenv("XLA_FLAGS")
    import jax
    with jax.default_matmul_precision("highest"):  # thread-local JAX settings count too
        assert exe_store.key(b"graph", 0, None) != base
    assert exe_store.key(b"graph", 0, None) == base
    # an edited lowering (any change to exe_store.KEY_SOURCES) must not find old executables
    monkeypatch.setattr(exe_store, "_source_digest", lambda: b"edited source")
    assert exe_store.key(b"graph", 0, None) != base


def test_empty_cache_dir_turns_cache_off(python_child, tmp_path):
    home = tmp_path / "home"
    xdg = tmp_path / "xdg"
    home.mkdir()
    env = {"XLANB_STORE_DIR": "", "XDG_CACHE_HOME": str(xdg), "HOME": str(home)}
    for _ in range(2):
        got = _run(python_child, env)
        c = got["counters"]
        assert c["PersistentCacheHit"] == 0 and c["PersistentCacheMiss"] == 0, c
        assert c["UncachedCompile"] >= 1 and c["OpCompile"] >= 1, c
    assert not _files_under(tmp_path), _files_under(tmp_path)


def test_cache_on_by_default_in_user_cache_dir(python_child, tmp_path):
    xdg = tmp_path / "xdg"
    env = {"XDG_CACHE_HOME": str(xdg), "HOME": str(tmp_path / "home"),
           "XLANB_STORE_DIR": None}  # unset: the default place (support.child_env)
    first = _run(python_child, env)["counters"]
    assert first["PersistentCacheMiss"] >= 1, first
    written = _files_under(xdg)
    assert written and all(f.startswith(str(xdg / "xlanb")) for f in written), written
    second = _run(python_child, env)["counters"]
    assert second["PersistentCacheHit"] > 0, second


# A quick graph whose compile may have made a big one waits for its first run to be
# stored (execute/graphs.py). Here every compile counts as maybe big and no first run as
# long, so each graph takes that path; SGD's first step (grads made) runs only once.
AFTER_RUN_SCRIPT = """
import json, warnings
warnings.simplefilter("ignore")
import torch, xlanb
import xlanb.execute.graphs as graphs
from xlanb import metrics
graphs.QUICK_BIG_S, graphs.QUICK_BIG_RUN_S = 0.0, 1e9
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).to("xla")
x = torch.randn(4, 6).to("xla")
metrics.clear()
loss = net(x).pow(2).mean()
loss.backward()
torch.optim.SGD(net.parameters(), lr=0.1).step()
xlanb.sync()
print(json.dumps({"hits": metrics.counter_value("PersistentCacheHit") or 0,
                  "loss": loss.item(), "w": net[0].weight.tolist()}))
"""


def test_an_executable_loaded_from_the_store_is_never_written_back(python_child, tmp_path):
    """XLA:CPU writes a deserialized executable out without its object code, so an entry
    written back by the process that loaded it fails at its next load's first run
    ("NOT_FOUND: Function ... not found"): the widget tour's third run did, in CI."""
    env = {"XLANB_STORE_DIR": str(tmp_path / "cache")}
    runs = [json.loads(python_child(AFTER_RUN_SCRIPT, env).strip().splitlines()[-1])]
    written = {p: open(p, "rb").read() for p in _files_under(tmp_path / "cache")}
    assert written and runs[0]["hits"] == 0, runs[0]
    # the second process loads them and writes nothing back (the third, before, failed)
    runs.append(json.loads(python_child(AFTER_RUN_SCRIPT, env).strip().splitlines()[-1]))
    assert runs[-1]["hits"] >= 1, runs[-1]
    assert (runs[-1]["loss"], runs[-1]["w"]) == (runs[0]["loss"], runs[0]["w"])
    assert {p: open(p, "rb").read() for p in _files_under(tmp_path / "cache")} == written


def test_the_store_does_not_write_an_executable_it_loaded(tmp_path, monkeypatch):
    import jax
    import jax.numpy as jnp
    from xlanb.base.config import config
    from xlanb.runtime import store as exe_store
    monkeypatch.setattr(config, "store_dir", str(tmp_path / "cache"))
    exe = jax.jit(lambda v: jnp.tanh(v @ v + 1).sum()).lower(jnp.ones((8, 8))).compile()
    key = exe_store.key(b"a test's graph", 0, None)
    exe_store.store(key, exe)
    path = exe_store._path(key)
    first = open(path, "rb").read()
    loaded = exe_store.load(key, 0)
    assert float(loaded(jnp.ones((8, 8)))) == float(exe(jnp.ones((8, 8))))
    exe_store.store(key, loaded)
    assert open(path, "rb").read() == first
    assert float(exe_store.load(key, 0)(jnp.ones((8, 8)))) == float(exe(jnp.ones((8, 8))))
