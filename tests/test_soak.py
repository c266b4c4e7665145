"""The short soak (benchmarks/soak.py --short) in CI: a few minutes of one eager and lazy
session with the store on, single-op executables and store entries both evicted along the
way. It asserts that the process exits cleanly and that every result matches CPU torch;
how fast it ran is a measurement for docs/benchmarks.md, never asserted here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_short_soak_survives_and_matches_cpu(tmp_path):
    env = dict(os.environ)
    env.pop("XLANB_STORE_DIR", None)  # the soak makes its own store
    # its subject is the bound on single-op executables (issue 26): each new eager op
    # compiles alone, as with runs off (runs are graphs, bounded by XLANB_MAX_GRAPHS)
    env["XLANB_EAGER_RUNS"] = "0"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--short",
                           "--json", "--cache-dir", str(tmp_path / "store")],
                          capture_output=True, text=True, env=env, timeout=900)
    r = json.loads(proc.stdout)
    assert r["survived"] and r["exit_status"] == 0, r["stderr_tail"]
    assert r["wrong"] == 0, [s["wrong"] for s in r["samples"] if "wrong" in s and "phase" not in s]
    assert r["max_param_diff"] < 1e-4  # 60 SGD steps in three modes, against CPU torch
    end = r["samples"][-1]["counters"]
    assert end["OpExecutableEvicted"] > 0 and end["PersistentCacheEvicted"] > 0
    assert end["PersistentCacheWrite"] > 0
    assert end["PersistentCacheHit"] > 0  # revisited signatures came back from the store
    assert max(s["loaded"] for s in r["samples"]) <= 64  # the short run's cap
