"""Mixed devices (CPU tensors given to ops on xla), the errors a failed lowering or an
integer division by zero gives, recompile warnings, the peek budget, eager factories and
per-thread mode blocks: faults a hostile review found (issue 22), each pinned by a test
that failed before its fix."""
from __future__ import annotations

import sys
import warnings

import pytest
import torch

import xlanb


# ---------------------------------------------------------------------------------------
# Mixed devices: torch's rules for CPU tensors passed to an op on xla

def test_cpu_scalar_tensor_is_an_operand_on_any_xla_device(python_child):
    out = python_child(
        "import torch, xlanb\n"
        "x = torch.arange(3.0).to('xla:1')\n"
        "y = x + torch.tensor(5.)\n"
        "z = x * torch.tensor(2, dtype=torch.int64)\n"
        "print(y.device, y.cpu().tolist(), z.dtype, z.cpu().tolist())\n",
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert out.strip().splitlines()[-1] == "xla:1 [5.0, 6.0, 7.0] torch.float32 [0.0, 2.0, 4.0]"


def test_non_scalar_cpu_tensor_is_the_same_device_error(mode):
    x = torch.arange(3.0).to("xla")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*xla:0 and cpu"):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(x.reshape(1, 3), torch.ones(3, 1))
    # what torch allows stays allowed: CPU indices, a 0-dim CPU tensor, copies
    assert x[torch.tensor([2, 0])].cpu().tolist() == [2.0, 0.0]
    assert (x - torch.tensor(1.0)).cpu().tolist() == [-1.0, 0.0, 1.0]
    y = torch.zeros(3, device="xla")
    y.copy_(torch.ones(3))
    assert y.cpu().tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------------------------------
# Warning floods: once shapes keep changing, one warning per call site

def _grow(n):
    t = torch.ones(2, n, device="xla") * 3
    xlanb.sync()  # <the one call site>
    return t


def test_recompile_warning_is_given_once_per_call_site_with_a_pointer():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for n in range(200, 260):
            _grow(n)
    got = [w for w in rec if issubclass(w.category, xlanb.RecompileWarning)]
    assert len(got) == 1, [str(w.message) for w in got]
    msg = str(got[0].message)
    assert "graphs in" in msg and "xlanb.graphs()" in msg, msg
    assert got[0].filename == __file__


# ---------------------------------------------------------------------------------------
# Errors with a place: a lowering or compile that fails inside a sync names the op

def _notes(err) -> str:
    return "\n".join(getattr(err, "__notes__", ()))


def test_lowering_failure_in_a_sync_names_the_op_and_line(mode, monkeypatch):
    from xlanb.modes.record import value_node
    a = torch.linspace(-1, 1, 26).reshape(2, 13)
    x = a.to("xla")
    if mode == "eager":
        pytest.skip("eager lowers at the op's own line: the traceback is already there")
    y = torch.sinh(x) * 2
    y_line = sys._getframe().f_lineno - 1
    info = value_node(y).inputs[0].info  # the sinh node's signature
    assert info.name == "aten::sinh"

    def broken(ins, scs):
        raise ValueError("no lowering today (injected)")
    monkeypatch.setattr(info, "fn", broken)
    monkeypatch.setattr(info, "exe", None)
    monkeypatch.setattr(info, "call", None)
    from xlanb.executables import compile as op_compile
    real_lower = op_compile.lower_op
    monkeypatch.setattr(op_compile, "lower_op", lambda i: (_ for _ in ()).throw(
        ValueError("no lowering today (injected)")) if i is info else real_lower(i))
    with pytest.raises(ValueError, match="injected") as err:
        xlanb.sync()
    notes = _notes(err.value)
    assert "aten::sinh(f32[2,13])" in notes, notes
    assert f"test_mixed_devices_and_errors.py:{y_line} " in notes, notes
    monkeypatch.undo()
    assert xlanb.pending_count(y) == 2  # nothing lost
    torch.testing.assert_close(y.cpu(), torch.sinh(a) * 2)


# ---------------------------------------------------------------------------------------
# Peek memory: the values peeks keep are bounded by bytes

def test_peeked_values_stay_within_their_byte_budget(monkeypatch, count):
    from xlanb.values.peeks import peek_values
    monkeypatch.setattr(xlanb.config, "peek_cache_bytes", 64 << 10)  # 64 KiB
    a = torch.randn(64, 64)  # 16 KiB per float32 value
    x = a.to("xla")
    xlanb.sync()
    h, cpu_h, chain = x, a, []
    for i in range(60):
        h = torch.tanh(h * 1.01 + i)
        cpu_h = torch.tanh(cpu_h * 1.01 + i)
        chain.append((h, cpu_h))
    for t, expect in chain[::3]:  # each peek keeps what it computed, within the budget
        torch.testing.assert_close(xlanb.peek(t), expect)
        assert peek_values.nbytes <= 64 << 10
    assert 0 < len(peek_values) <= 4
    # an evicted value is computed again on demand, from what is left: nothing compiles
    compiles = count("OpCompile")
    torch.testing.assert_close(xlanb.peek(chain[1][0]), chain[1][1])
    assert count("OpCompile") == compiles
    assert count("UncachedCompile") == 0  # and no peek ever cut the graph
    xlanb.sync()
    assert count("UncachedCompile") == 1
    torch.testing.assert_close(chain[-1][0].cpu(), chain[-1][1])


# ---------------------------------------------------------------------------------------
# Integer division by zero raises as CPU torch does where an op runs on its own

@pytest.mark.parametrize("op", [
    lambda a, b: a // b, lambda a, b: a % b, lambda a, b: torch.fmod(a, b),
    lambda a, b: torch.div(a, b, rounding_mode="trunc"), lambda a, b: a // 0,
    lambda a, b: torch.remainder(a, 0)])
def test_integer_division_by_zero_raises_in_eager_and_opbyop(op):
    a, b = torch.tensor([7, -3, 5]), torch.tensor([2, 0, 1])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(a, b)  # what CPU torch does
    for mode in ("eager", "opbyop"):
        with xlanb.mode(mode):
            x, y = a.to("xla"), b.to("xla")
            with pytest.raises(RuntimeError, match="ZeroDivisionError"):
                op(x, y).cpu()

    # no zero: CPU torch's values, in every mode (lazy keeps XLA's value for a zero)
    good = torch.tensor([2, 4, 1])
    for mode in xlanb.MODES:
        with xlanb.mode(mode):
            got = (a.to("xla") // good.to("xla")).cpu()
        assert got.tolist() == (a // good).tolist()


# ---------------------------------------------------------------------------------------
# Eager factories build on the device: no host buffer of the tensor's size

def test_eager_factories_need_no_host_memory_for_their_value():
    import tracemalloc  # numpy's buffers are traced; XLA's device buffers are not
    n = 16 << 20  # 64 MiB of float32
    with xlanb.mode("eager"):
        torch.zeros(8, device="xla").cpu()  # warm up the path (small fills stay on host)
        tracemalloc.start()
        try:
            t = torch.zeros(n, device="xla")
            u = torch.full((n,), 2.5, device="xla")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB of host memory for device factories"
        assert float(t[-3:].sum().cpu()) == 0.0 and float(u[:4].sum().cpu()) == 10.0


# ---------------------------------------------------------------------------------------
# Modes: ``with xlanb.mode(...)`` is per thread; set_mode is the process's

def test_mode_block_is_per_thread(monkeypatch):
    import threading
    monkeypatch.setattr(xlanb.config, "background_compile", False)  # eager runs each op now
    xlanb.set_mode("lazy")
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def worker():
        with xlanb.mode("eager"):
            seen["mode"] = xlanb.get_mode()
            y = torch.ones(3, device="xla") * 2  # eager: runs at once
            seen["pending"] = xlanb.pending_count(y)
            inside.set()
            done.wait(60)
        seen["after"] = xlanb.get_mode()

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert inside.wait(60)
        assert xlanb.get_mode() == "lazy"  # the worker's block does not reach this thread
        x = torch.ones(3, device="xla") + 1
        assert xlanb.pending_count(x) >= 2  # recorded (a fill, the add): still lazy here
    finally:
        done.set()
        t.join(60)
    assert seen == {"mode": "eager", "pending": 0, "after": "lazy"}
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]
