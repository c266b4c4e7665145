"""Execution modes: switching at any time (mid-forward included), the context manager,
bad names, the XLANB_MODE environment variable, and pending work surviving a switch."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import xlanb

# in the versions tier (also run on the oldest and newest torch: .ci/run), all but the
# XLANB_MODE tests (child processes; settings, not torch)
VERSIONS = pytest.mark.versions


@VERSIONS
def test_modes_listed():
    assert tuple(xlanb.MODES) == ("lazy", "eager", "opbyop")


@VERSIONS
def test_set_and_get_mode():
    for m in ("eager", "opbyop", "lazy", "opbyop", "eager", "lazy"):
        xlanb.set_mode(m)
        assert xlanb.get_mode() == m
        x = torch.arange(4, device="xla") * 3
        assert x.tolist() == [0, 3, 6, 9]


@VERSIONS
def test_switch_mid_forward_matches_cpu():
    torch.manual_seed(0)
    layers = [nn.Linear(6, 10), nn.Linear(10, 8), nn.Linear(8, 3)]
    cpu = nn.Sequential(*layers)
    dev = copy.deepcopy(cpu).to("xla")
    x = torch.randn(4, 6)

    def forward_cpu(inp):
        return cpu[2](torch.relu(cpu[1](torch.relu(cpu[0](inp)))))

    want = forward_cpu(x)

    h = x.to("xla")
    xlanb.set_mode("lazy")
    h = torch.relu(dev[0](h))       # recorded, pending
    xlanb.set_mode("eager")
    h = torch.relu(dev[1](h))       # runs now, on the lazy result
    xlanb.set_mode("opbyop")
    out = dev[2](h)                 # recorded again
    assert xlanb.get_mode() == "opbyop"
    torch.testing.assert_close(out.detach().cpu(), want.detach(), atol=1e-5, rtol=1e-5)

    # ...and backward through ops recorded in three modes, run in a fourth switch
    xlanb.set_mode("lazy")
    out.sum().backward()
    cpu_params = list(cpu.parameters())
    want_loss = forward_cpu(x).sum()
    want_loss.backward()
    for px, pc in zip(dev.parameters(), cpu_params):
        torch.testing.assert_close(px.grad.cpu(), pc.grad, atol=1e-5, rtol=1e-5)


@VERSIONS
@pytest.mark.parametrize("first,second", [("lazy", "eager"), ("lazy", "opbyop"),
                                          ("opbyop", "lazy"), ("opbyop", "eager"),
                                          ("eager", "lazy"), ("eager", "opbyop")])
def test_pending_work_stays_correct_after_switch(first, second):
    xlanb.set_mode(first)
    a = torch.linspace(-2, 2, 12).reshape(3, 4).to("xla")
    b = (a * a).sum(1)        # pending in lazy/opbyop
    c = a.t() @ a
    xlanb.set_mode(second)
    d = b + 1                 # depends on work recorded under the first mode
    ac = torch.linspace(-2, 2, 12).reshape(3, 4)
    torch.testing.assert_close(d.cpu(), (ac * ac).sum(1) + 1)
    torch.testing.assert_close(c.cpu(), ac.t() @ ac)
    xlanb.sync()
    torch.testing.assert_close(b.cpu(), (ac * ac).sum(1))


@VERSIONS
def test_mode_context_manager_restores():
    xlanb.set_mode("lazy")
    with xlanb.mode("eager"):
        assert xlanb.get_mode() == "eager"
        with xlanb.mode("opbyop"):
            assert xlanb.get_mode() == "opbyop"
            y = torch.ones(3, device="xla") * 2
        assert xlanb.get_mode() == "eager"
    assert xlanb.get_mode() == "lazy"
    assert y.tolist() == [2.0, 2.0, 2.0]


@VERSIONS
def test_mode_context_manager_restores_on_error():
    xlanb.set_mode("opbyop")
    with pytest.raises(ZeroDivisionError):
        with xlanb.mode("eager"):
            assert xlanb.get_mode() == "eager"
            1 / 0
    assert xlanb.get_mode() == "opbyop"


@VERSIONS
@pytest.mark.parametrize("bad", ["bogus", "LAZY", "", "eagerly"])
def test_unknown_mode_is_value_error_listing_valid_ones(bad):
    xlanb.set_mode("eager")
    with pytest.raises(ValueError) as err:
        xlanb.set_mode(bad)
    msg = str(err.value)
    for name in ("lazy", "eager", "opbyop"):
        assert name in msg, msg
    assert xlanb.get_mode() == "eager"  # nothing changed
    with pytest.raises(ValueError):
        with xlanb.mode(bad):
            pass
    assert xlanb.get_mode() == "eager"


@VERSIONS
def test_eager_runs_now_and_lazy_waits():
    from xlanb import metrics

    def ran():
        return {n: metrics.counter_value(n) or 0
                for n in ("OpCompile", "OpCacheHit", "UncachedCompile", "CachedCompile")}

    xlanb.set_mode("eager")
    a = torch.ones(27, device="xla")
    metrics.clear()
    (a + 1).exp().cpu()  # new ops: recorded until the read, then one run, one compile
    r = ran()
    assert r["OpCompile"] + r["OpCacheHit"] == 0 and r["UncachedCompile"] == 0, r
    assert metrics.counter_value("EagerRunCompile") == 1
    xlanb.config.eager_runs = 0
    try:
        metrics.clear()
        (a + 1).exp().cpu()  # runs off: each op through its own executable
        r = ran()
        assert r["OpCompile"] + r["OpCacheHit"] == 2 and r["UncachedCompile"] == 0, r
    finally:
        xlanb.config.eager_runs = 2048

    for m in ("lazy", "opbyop"):
        xlanb.set_mode(m)
        metrics.clear()
        b = (a + 2).exp()
        assert sum(ran().values()) == 0, (m, ran())  # recorded, nothing ran
        xlanb.sync()
        r = ran()
        if m == "lazy":
            assert r["UncachedCompile"] + r["CachedCompile"] == 1, r
        else:
            assert r["OpCompile"] + r["OpCacheHit"] == 2 and r["UncachedCompile"] == 0, r
        torch.testing.assert_close(b.cpu(), torch.full((27,), 3.0).exp())


@pytest.mark.parametrize("env_mode", ["eager", "opbyop", "lazy"])
def test_xlanb_mode_env_var(python_child, env_mode):
    code = """
import json, warnings
warnings.simplefilter("ignore")
import torch, xlanb
from xlanb import metrics
start = xlanb.get_mode()
a = torch.ones(5, device="xla")
metrics.clear()
b = (a * 3).sum()
val = b.item()
names = ("EagerRunCompile", "UncachedCompile", "OpCompile")
print(json.dumps({"mode": start, "value": val,
                  "compiled": {n: metrics.counter_value(n) or 0 for n in names}}))
"""
    # no store: a stored single-op executable would let eager run an op at once
    out = python_child(code, {"XLANB_MODE": env_mode, "XLANB_STORE_DIR": ""})
    got = json.loads(out.strip().splitlines()[-1])
    assert got["mode"] == env_mode
    assert got["value"] == 15.0
    c = got["compiled"]  # what the read ran: an eager run, a lazy graph, or op by op
    ran = {"eager": "EagerRunCompile", "lazy": "UncachedCompile", "opbyop": "OpCompile"}
    assert all((n == ran[env_mode]) == (v > 0) for n, v in c.items()), c


def test_xlanb_mode_env_var_bad_value(python_child):
    code = "import xlanb"
    with pytest.raises(AssertionError) as err:
        python_child(code, {"XLANB_MODE": "bogus"})
    text = str(err.value)
    # SettingError is the ValueError of a bad XLANB_* value, naming the variable
    assert "SettingError" in text and "XLANB_MODE='bogus'" in text
    assert "lazy" in text and "opbyop" in text
