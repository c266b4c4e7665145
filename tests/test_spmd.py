"""xlanb.spmd on 8 simulated CPU devices.

JAX fixes its device count when it starts, so the checks run in one child process
(tests/scripts/spmd_script.py, with XLA_FLAGS=--xla_force_host_platform_device_count=8) that
prints its results as JSON; each test here asserts on its part of them."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
from support import child_env  # noqa: E402

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "spmd_script.py")
MODES = ("lazy", "eager", "opbyop")


def _env(**extra) -> dict:
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    return child_env({"XLANB_STORE_DIR": os.environ.get("XLANB_STORE_DIR", ""),
                      "XLA_FLAGS": flags, **extra})


@pytest.fixture(scope="module")
def results() -> dict:
    proc = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True,
                          env=_env(), cwd=ROOT, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("SPMD-RESULTS ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("SPMD-RESULTS "):])


def _get(results, name) -> dict:
    r = results[name]
    assert "error" not in r, r["error"]
    return r


@pytest.mark.parametrize("mode", MODES)
def test_mlp_on_2x4_mesh_matches_one_device(results, mode):
    r = _get(results, f"{mode}_training")
    assert r["losses"] == pytest.approx(r["single"], rel=1e-5, abs=1e-6)
    assert r["losses"] == pytest.approx(r["cpu"], rel=1e-5, abs=1e-6)
    assert r["dw_single"] < 1e-5 and r["dw_cpu"] < 1e-5
    assert r["dtypes"] == ["torch.float32"] * 4
    assert r["devices"] == ["xla:0"]  # a sharded tensor stays on xla:0, as in torch_xla
    assert r["w0"].startswith("{'model'}")  # the update kept the weight's sharding
    assert r["collective_ops"] > 0  # the sharded steps ran collectives (counted per run)
    if mode != "lazy":
        assert r["op_compiles"] > 0  # single-op executables for the sharded signatures


def test_lazy_compiles_once_with_expected_collectives(results):
    r = _get(results, "lazy_training")
    assert r["graphs"] == 1 and r["hits"] == 2
    # the batch is sharded on 'data': gradients are all-reduced over it
    assert "all-reduce" in r["kinds"] and r["optimized_hlo_has_all_reduce"]
    assert r["collective_bytes"] > 0
    # source attribution through the HLO metadata: the aten op, scope and user line
    by_op = {c["op"]: c for c in r["collectives"]}
    addmm = by_op["aten::addmm"]
    assert addmm["kind"] == "all-reduce" and addmm["scope"] == "Sequential/2"
    assert addmm["source"] == f"{SCRIPT}:{r['loss_line']}"
    assert addmm["groups"] and addmm["bytes"] == 4 * 8 * 4  # f32[4,8] on each device
    assert "on a mesh:" in r["graphs_text"]
    # the compiled graph shows where each input lay and what the partitioner chose
    assert "sharding={'data'} on mesh (data=2, model=4) (marked at spmd_script.py" in r["ir_text"]
    assert "sharding=propagated" in r["ir_text"]


def test_changed_sharding_is_a_named_recompile(results):
    r = _get(results, "recompile_cause")
    assert r["graphs"] == 2 and r["hits"] == [1, 0]
    assert r["why"].startswith("sharding changed: input %")
    assert "{'data'}" in r["why"] and "{None, 'model'}" in r["why"]
    assert f"spmd_script.py:{r['line']}" in r["why"]


def test_annotation_is_a_constraint_and_shown(results):
    r = _get(results, "annotation_change")
    assert r["annotated"].endswith("(annotated)")
    assert f"xlanb::mark_sharding(%2, {{'data'}})  # spmd_script.py:{r['line']}" in r["pending_ir"]
    assert "sharding=annotated {'data'}" in r["pending_ir"]
    assert r["why"].startswith(f"static arguments of xlanb::mark_sharding at spmd_script.py:{r['line']}")
    assert r["after"].endswith("(propagated)")
    assert r["dot_has_fill"]
    assert "aten::tanh(%3)" in r["compiled_ir"] and "sharding=propagated {'data'}" in r["compiled_ir"]


def test_peek_global_value_and_shards(results):
    r = _get(results, "peeks")
    assert r["value_ok"] and r["pending_same"] and r["uncached"] == 0
    assert r["n_shards"] == 8 and r["ok_shards"]
    assert r["devices"] == [f"xla:{i}" for i in range(8)]
    assert r["shapes"] == [[4, 2]]
    assert r["after_sync"]
    assert "| xla:0 | xla:1 | xla:2 | xla:3 |" in r["vis"]
    assert "<table" in r["html"] and "xla:7" in r["html"]
    assert r["svg"].startswith("<svg") and r["svg"].count("<rect") == 8
    assert r["to_jax"] == "NamedSharding" and r["spec"] == ["data", "model"]


def test_bad_specs_one_clear_error_nothing_lost(results):
    r = _get(results, "bad_specs")
    e = r["errors"]
    assert "unknown mesh axis 'batch'" in e["unknown_axis"] and "'data' (size 2)" in e["unknown_axis"]
    assert "axis index 5" in e["bad_index"]
    assert "not divisible by the 4 devices of mesh axis 'model'" in e["not_divisible"]
    assert "1 entries for a tensor of 2 dimensions" in e["wrong_rank"]
    assert "do not exist" in e["no_devices"] and "xla_force_host_platform_device_count" in e["no_devices"]
    assert "used twice" in e["axis_twice"]
    assert r["pending_kept"] and r["sharding"] and r["value_ok"]


def test_jax_mesh_and_partition_spec_accepted(results):
    r = _get(results, "jax_objects")
    assert r["jax"].startswith("{'data', 'model'}")
    assert r["tuple"].startswith("{('data', 'model')}")
    assert r["cleared"].startswith("replicated")
    assert r["value_ok"]


def test_replica_mismatches_finds_the_shard_that_differs(results):
    r = _get(results, "replica_check")
    assert r["clean"] == 0
    assert len(r["found"]) == 1
    index, devices, odd, diff = r["found"][0]
    assert devices == ["xla:4", "xla:5", "xla:6", "xla:7"] and diff == 1.5
    assert odd == ["xla:6"]  # the one copy the others disagree with
    assert "slice(4, 8" in index


def test_a_sharded_random_op_makes_each_devices_bits_where_they_live(results):
    r = _get(results, "sharded_random_bits")
    assert r["largest_bits"] <= 32 * 8 and not r["all_gather"], r  # a (64, 32) on 2x4


def test_xlanb_compile_replays_sharded_steps(results):
    r = _get(results, "compiled_function")
    assert r["losses"] == pytest.approx(r["ref"], rel=1e-5, abs=1e-6) and r["dw"] < 1e-5
    assert r["replays"] == 2  # calls 1-2 trace, 3-4 replay, 5 (batch replicated) traces
    assert r["w0"].startswith("{'model'}")
    # issue 57: a graph on the mesh compiles optimized at once (no quick executable to
    # replay); one on a single device in the same session tiers up at its third run
    assert r["sharded_quick"] and not any(r["sharded_quick"]), r["sharded_quick"]
    assert r["plain_quick"] == [True, True, False, False] and r["plain_replays"] == 2
    assert r["plain_tier_ups"] == 1
    assert r["plain_values"] == pytest.approx([1013 * math.exp(3.0 * 0.001 - 2.0)] * 4, rel=1e-5)


def test_magics_and_torch_xla_names(results):
    r = _get(results, "magics")
    assert "| xla:0,4 | xla:1,5 | xla:2,6 | xla:3,7 |" in r["vis"]
    assert "all-reduce" in r["pending"] and "aten::sum" in r["pending"]
    assert r["last"] == r["pending"]  # the same graph: compiled once, by the first call
    assert r["compat_ok"]


def test_single_device_api_in_this_process():
    """On one device: a 1-device mesh works, and mixing xla:N stays an error."""
    import torch
    import xlanb
    import xlanb.spmd as xs
    mesh = xs.Mesh([0], (1,), ("data",))
    x = torch.randn(4, 3).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))
    assert torch.allclose((x * 2).cpu(), x.cpu() * 2)
    assert xs.get_sharding(x) is None  # one device: nothing is sharded
    assert "unsharded" in str(xs.visualize_sharding(x))
    with pytest.raises(xs.ShardingError, match="do not exist"):
        xs.Mesh([0, 1, 2, 3, 4, 5, 6, 7, 8], (9,), ("data",))
    assert xlanb.spmd.get_1d_mesh().size() == xlanb.device_count()


def _dist_results(cmd: list, **env) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(**env), cwd=ROOT,
                          timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("DIST-RESULTS ")), None)
    assert proc.returncode == 0 and line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("DIST-RESULTS "):]), proc.stdout


DIST_SCRIPT = os.path.join(ROOT, "tests", "scripts", "spmd_dist_script.py")


@pytest.fixture(scope="module")
def one_process() -> dict:
    return _dist_results([sys.executable, DIST_SCRIPT],
                         XLA_FLAGS="--xla_force_host_platform_device_count=4")[0]


@pytest.mark.parametrize("mode", ("lazy", "eager"))
def test_two_processes_match_one_process(one_process, mode):
    """python -m xlanb.launch --nproc 2 (2 devices each) gives what 1 process with 4
    devices gives (lazy): the same losses and weights, a batch built from process-local
    rows."""
    one = one_process
    two, out = _dist_results([sys.executable, "-m", "xlanb.launch", "--nproc", "2",
                              "--devices-per-proc", "2", DIST_SCRIPT, mode], XLA_FLAGS="")
    assert one["nproc"] == 1 and two["nproc"] == 2
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-6)
    import torch
    for a, b in zip(two["weights"], one["weights"]):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
    assert one["peek_ok"] and two["peek_ok"]
    assert one["graphs"] == 1 and two["graphs"] == (1 if mode == "lazy" else 0)
    assert two["xx_shape"] == [8, 8]  # global batch from two 4-row pieces
    assert one["xr"] == [1, 0, 1, True] and two["xr"] == [2, 0, 2, True]  # process 0 reports
    # each process holds (and lists) only its own shards
    assert one["local_shards"] == ["xla:0", "xla:1", "xla:2", "xla:3"]
    assert two["local_shards"] == ["xla:0", "xla:1"]
    assert "rank 1 shards ['xla:2', 'xla:3']" in out
    # torch_xla's counts in every process (issue 34): 4 devices in all, 2 here; both
    # processes on this host, each its own local ordinal; process 1 is not the master
    counts = {int(r): json.loads(v) for r, v in re.findall(r"^XR-COUNTS (\d) (.+)$", out, re.M)}
    assert counts == {0: [4, 4, 2, 2, 0, 0, 0, True, True],
                      1: [4, 4, 2, 2, 1, 1, 1, False, False]}, out[-3000:]
    assert one["xr_counts"] == [4, 4, 4, 1, 0, 0, 0, True, True]
    # a print shows what this process holds, without a collective
    assert two["repr"].startswith("tensor(<sharded over 2 processes; shape=(16, 8)")
    assert "xla:0 [0:8, 0:]" in two["repr"] and "xla:2" not in two["repr"]
    assert one["repr"].startswith("tensor([[")


def test_launch_reports_a_failing_process(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os, sys\nsys.exit(3 if os.environ['XLANB_PROCESS_ID'] == '1' else 0)\n")
    proc = subprocess.run([sys.executable, "-m", "xlanb.launch", "--nproc", "2", str(bad)],
                          env=_env(), cwd=ROOT, timeout=120)
    assert proc.returncode == 3
