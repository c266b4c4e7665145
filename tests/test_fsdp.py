"""torch_xla FSDPv2 scripts, unchanged, under ``python -m xlanb.run`` on 4 simulated CPU
devices (tests/scripts/fsdp_*.py, through tests/scripts/fsdp_driver.py, which runs the
script as ``__main__`` and then prints what xlanb's tools say about it).

Each script runs once, in a child process (JAX fixes its device count when it starts);
the tests assert on its losses (CPU torch's, and torch_xla 2.9's where it runs the script)
and on its parameters' and gradients' shards, its collectives by line and its loops.
About 15-30 s per script on 2 cores: in conftest's SLOW_FILES."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import torch
import torch.nn as nn
import torch.utils.checkpoint

pytestmark = pytest.mark.slow  # two child processes of 4 devices each (conftest: tiers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")

# torch_xla 2.9 on the CPU, 4 devices (PJRT_DEVICE=CPU CPU_NUM_DEVICES=4 python
# tests/scripts/fsdp_sgd.py, torch 2.9 CPU wheel): the same three losses as CPU torch
TORCH_XLA_SGD = [2.104445, 2.087473, 2.071132]
# fsdp_bert.py on torch_xla 2.9, the same way (PJRT_DEVICE=CPU CPU_NUM_DEVICES=4)
TORCH_XLA_BERT = [1.391424, 1.358925, 1.328194]
# fsdp_scan_adamw.py does not run on torch_xla 2.9 here: its scan imports jax
# (xla_sharding.shard_as), which torch_xla's CPU install does not have; CPU torch is the
# reference
LOSS_TOL = 2e-4


def _run(script: str, *driver_args: str) -> tuple[list[float], dict]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                        + " --xla_force_host_platform_device_count=4").strip()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLANB_MODE", None)
    proc = subprocess.run([sys.executable, "-m", "xlanb.run", "--shadow", "fsdp_driver.py",
                           *driver_args, script], capture_output=True, text=True, env=env, cwd=SCRIPTS,
                          timeout=600)
    lines = proc.stdout.splitlines()
    res = next((x for x in lines if x.startswith("FSDP-RESULTS ")), None)
    assert proc.returncode == 0 and res is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = [float(x.split()[-1]) for x in lines if x.startswith("step ")]
    return losses, json.loads(res[len("FSDP-RESULTS "):])


@pytest.fixture(scope="module")
def sgd():
    return _run("fsdp_sgd.py")


@pytest.fixture(scope="module")
def bert():
    pytest.importorskip("transformers")
    return _run("fsdp_bert.py", "--no-target")  # its TPU compile would take a minute


@pytest.fixture(scope="module")
def scan_adamw():
    return _run("fsdp_scan_adamw.py")


def _cpu_losses(model, opt_cls, lr) -> list[float]:
    """The scripts' training loop in CPU torch (their seed, data and optimizer)."""
    x, y = torch.randn(16, 16), torch.randint(0, 8, (16,))
    opt = opt_cls(model.parameters(), lr=lr)
    out = []
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_fsdp_sgd_gives_cpu_torch_and_torch_xla_losses(sgd):
    losses, _ = sgd
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                          nn.Linear(32, 8))
    assert losses == pytest.approx(_cpu_losses(model, torch.optim.SGD, 0.1), abs=LOSS_TOL)
    assert losses == pytest.approx(TORCH_XLA_SGD, abs=LOSS_TOL)


def test_fsdp_parameters_and_gradients_are_shards(sgd):
    _, r = sgd
    params = r["params"]
    # torch_xla's rule: each parameter sharded on 'fsdp' along its largest dimension
    assert params["_orig_module.0.weight"]["spec"] == ["fsdp", "None"]        # (64, 16)
    assert params["_orig_module.2.weight"]["spec"] == ["None", "fsdp"]        # (32, 64)
    assert params["_orig_module.4.bias"]["spec"] == ["fsdp"]                  # (8,)
    for name, p in params.items():
        assert p["grad_spec"] == p["spec"], name  # each gradient lies as its parameter
        full = 1
        for d in p["shape"]:
            full *= d
        for shards in (p["shards"], p["grad_shards"]):
            assert len(shards) == 4, name
            assert all(_numel(s) * 4 == full for s in shards), name


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_fsdp_all_gathers_are_named_by_the_users_line(sgd):
    _, r = sgd
    gathers = [c for c in r["collectives"] if c["kind"] == "all-gather"]
    assert gathers
    # the forward's weight all-gathers: the aten op, the module and the script's line
    forward = [c for c in gathers if c["scope"].startswith("SpmdFullyShardedDataParallel/")]
    assert {c["scope"].rsplit("/", 1)[1] for c in forward} >= {"0", "4"}
    assert all(c["source"] == "fsdp_sgd.py:32" and c["op"] == "aten::addmm" for c in forward)
    # the gradients' reduction: XLA:CPU keeps all-reduce + slice (a TPU makes it a
    # reduce-scatter), also on the script's line
    assert any(c["kind"] == "all-reduce" and c["source"] == "fsdp_sgd.py:32"
               for c in r["collectives"])


class _Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class _Model(nn.Module):
    """fsdp_scan_adamw.py's model in CPU torch: the layers in a Python loop, torch's
    reentrant checkpoint."""

    def __init__(self, d: int = 32, n_layers: int = 4):
        super().__init__()
        self.embed = nn.Linear(16, d)
        self.layers = nn.ModuleList(_Block(d) for _ in range(n_layers))
        self.final = _Block(d)
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        h = torch.utils.checkpoint.checkpoint(self.final, h, use_reentrant=True)
        return self.head(h)


def test_fsdp_scan_layers_checkpoint_adamw_gives_cpu_torch_losses(scan_adamw):
    losses, r = scan_adamw
    torch.manual_seed(0)
    model = _Model()
    assert losses == pytest.approx(_cpu_losses(model, torch.optim.AdamW, 0.01), abs=LOSS_TOL)
    # scan_layers is a loop on the CPU and on the mesh: the forward, its backward and
    # AdamW's updates
    assert r["repeats"] == ["4 × _orig_module.layers compiled once (scan, layers 0–3)",
                            "4 × _orig_module.layers backward compiled once (scan, layers 0–3)",
                            "4 × _orig_module.layers update compiled once (scan, layers 0–3)"]
    assert r["params"]["_orig_module.layers.3.up.weight"]["grad_spec"] == ["fsdp", "None"]


@pytest.mark.parametrize("which", ["sgd", "scan_adamw"])
def test_fsdp_step_for_a_v5e_2x2_holds_a_quarter_per_chip(which, request):
    """compile_for("v5e:2x2") of the training step: each chip's arguments are its
    shards of the parameters and optimizer state (a quarter) plus the batch's shard and
    the replicated labels, and the report says so against the whole graph's."""
    _, r = request.getfixturevalue(which)
    t = r["target"]
    assert t["chips"] == 4
    assert t["state_chip"] * 4 == t["state_whole"]  # every parameter and state sharded
    # a chip's arguments: its state shards, then the batch's shard (16x16 float32 / 4)
    # and the labels (16 int64, replicated)
    assert t["logical_args"] == t["state_chip"] + 16 * 16 * 4 // 4 + 16 * 8
    assert t["whole"] == t["state_whole"] + 16 * 16 * 4 + 16 * 8
    pct = round(100 * t["logical_args"] / t["whole"])
    assert 25 <= pct <= 27
    assert (f"arguments per chip: {_kib(t['logical_args'])} of the whole graph's "
            f"{_kib(t['whole'])} ({pct}%: sharded over 4 chips") in t["text"]
    # XLA's memory analysis (TPU layouts: small shards pad to (8, 128) tiles) holds them
    assert t["args"] >= t["logical_args"]


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def test_fsdp_bert_from_a_transformers_config_gives_cpu_torch_losses(bert):
    """A tiny BERT (2 layers, hidden 64) under FSDPv2 with AdamW: CPU torch's losses,
    every parameter and gradient sharded on 'fsdp'."""
    import runpy
    losses, r = bert
    make_model = runpy.run_path(os.path.join(SCRIPTS, "fsdp_bert_model.py"))["make_model"]
    model, ids, labels = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    want = []
    for _ in range(3):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert losses == pytest.approx(want, abs=LOSS_TOL)
    assert losses == pytest.approx(TORCH_XLA_BERT, abs=LOSS_TOL)
    assert len(losses) == 3 and losses[2] < losses[0]  # it trains
    params = r["params"]
    assert len(params) == len(list(model.parameters()))
    for name, p in params.items():
        assert "fsdp" in p["spec"], name  # sharded on the fsdp axis ...
        assert p["grad_spec"] == p["spec"], name  # ... and its gradient lies the same way
        assert all(_numel(s) * 4 == _numel(p["shape"]) for s in p["shards"]), name
    # the word embeddings (128, 64): sharded along their largest dimension
    emb = params["_orig_module.bert.embeddings.word_embeddings.weight"]
    assert emb["spec"] == ["fsdp", "None"] and emb["shards"][0] == [32, 64]
