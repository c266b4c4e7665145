"""Every supported torch (2.11 to 2.14) imports and runs xlanb; what differs between them is
decided in xlanb/base/torch_compat.py. This file runs in the ``versions`` tier, which
.ci/run also runs on the oldest and the newest supported torch, so each assertion about
"this torch" is checked on each of them."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from xlanb.base import torch_compat
from xlanb.lowering import registry

pytestmark = pytest.mark.versions


def test_versions_parse_and_range():
    assert torch_compat.version("2.11.0+cu130") == (2, 11)
    assert torch_compat.version("2.15.0a0+git1234") == (2, 15)
    assert torch_compat.supported("2.11.0") and torch_compat.supported("2.14.1")
    assert not torch_compat.supported("2.10.0") and not torch_compat.supported("2.15.0")
    assert torch_compat.GUARD == (2, 10)  # the first torch with torch._C._acc
    assert torch_compat.PIP_SPEC == "torch>=2.11,<2.15"
    with pytest.raises(ValueError, match="not a torch version"):
        torch_compat.version("nightly")


def test_this_torch_is_supported_and_has_the_device_guard():
    assert torch_compat.supported(), torch.__version__
    assert hasattr(torch._C, "_acc")
    torch_compat.check()  # neither raises nor warns
    assert torch.device("xla").type == "xla"


def test_ops_this_torch_lacks_are_exactly_the_documented_ones():
    """OP_VERSIONS says which ops each version has; this torch agrees, and the lowerings
    of the ops it lacks were skipped (named in missing()), the others registered."""
    for name in torch_compat.OP_VERSIONS:
        present = hasattr(torch.ops.aten, name)
        assert present == torch_compat.has_op(name), (name, torch.__version__)
        assert (f"{name}.default" in torch_compat.missing()) == (not present)
        if present:
            assert registry.lookup(getattr(torch.ops.aten, name).default) is not None


def test_registering_an_op_this_torch_lacks_is_skipped():
    assert torch_compat.aten_op("xlanb_no_such_op.default") is None
    assert torch_compat.aten_op("add.xlanb_no_such_overload") is None
    assert torch_compat.aten_op("add.Tensor") is torch.ops.aten.add.Tensor
    assert "xlanb_no_such_op.default" in torch_compat.missing()
    saved = dict(registry.LOWERINGS)
    try:
        def low(a, b):
            return a

        # the missing op is skipped, the real one beside it registers
        registry.register(torch_compat.aten_op("xlanb_no_such_op.default"),
                          torch.ops.aten.sub.Tensor)(low)
        assert None not in registry.LOWERINGS
        assert registry.LOWERINGS[torch.ops.aten.sub.Tensor].fn is low
    finally:
        registry.LOWERINGS.clear()
        registry.LOWERINGS.update(saved)


def test_an_old_torch_gets_one_line_with_the_fix(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.9.0+cpu")
    with pytest.raises(torch_compat.UnsupportedTorchError) as e:
        torch_compat.check()
    msg = str(e.value)
    assert "\n" not in msg
    assert "found torch 2.9.0+cpu" in msg and "torch 2.11 to 2.14" in msg
    assert "pip install 'torch>=2.11,<2.15'" in msg
    assert isinstance(e.value, ImportError)


@pytest.mark.parametrize("found", ["2.15.0", "2.10.0+cu128"])
def test_an_untested_torch_with_the_guard_warns_and_goes_on(monkeypatch, found):
    """2.10 has the device guard (and runs the demo), 2.15 is newer than CI's newest."""
    monkeypatch.setattr(torch, "__version__", found)
    with pytest.warns(UserWarning, match=rf"found torch {re.escape(found)}.*untested: going on"):
        torch_compat.check()


def test_import_xlanb_on_an_old_torch_is_the_one_line_not_a_registry_error(python_child):
    """The check runs before any lowering asks torch for an op (a torch without one raised
    AttributeError from deep inside the registry)."""
    out = python_child(
        "import torch\n"
        "torch.__version__ = '2.9.0'\n"
        "try:\n"
        "    import xlanb\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, '|', e)\n"
        "import sys\n"
        "print(sorted(m for m in sys.modules if m.startswith('xlanb.lowering')))\n")
    first, loaded = out.strip().splitlines()[-2:]
    assert first.startswith("UnsupportedTorchError | xlanb supports torch 2.11 to 2.14; "
                            "found torch 2.9.0. Fix: pip install"), first
    assert loaded == "[]"  # nothing of the registry was imported


def test_cholesky_on_every_supported_torch(same):
    """torch.cholesky is aten.cholesky before 2.14 (registered here) and raises in 2.14
    (the op is gone); torch.linalg.cholesky works on all."""
    a = torch.randn(4, 4, dtype=torch.float64)
    a = a @ a.T + 4 * torch.eye(4, dtype=torch.float64)
    same(torch.linalg.cholesky(a.to("xla")), torch.linalg.cholesky(a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.cholesky is deprecated
        if torch_compat.has_op("cholesky"):
            same(torch.cholesky(a.to("xla"), upper=True), torch.cholesky(a, upper=True))
        else:
            with pytest.raises(RuntimeError, match="removed"):
                torch.cholesky(a.to("xla"))


def test_foreach_clone_where_it_exists(same, count):
    xs = [torch.randn(3), torch.randn(2, 2)]
    if not torch_compat.has_op("_foreach_clone"):
        pytest.skip(f"torch {torch.__version__} has no aten._foreach_clone")
    got = torch.ops.aten._foreach_clone([x.to("xla") for x in xs])
    for g, x in zip(got, xs):
        same(g, x.clone())
    assert count("aten::_foreach_clone") == 0  # lowered, not run on CPU torch


def test_an_xla_tensor_is_not_fake_on_every_torch():
    """torch.compile asks ``is_fake`` of its inputs; torch 2.11 raised for an XlaTensor (a
    wrapper subclass with no inner tensors), which torch_compat.patch() answers as 2.12 does."""
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
    assert is_fake(torch.zeros(2, device="xla")) is False
    with FakeTensorMode() as mode:
        assert is_fake(mode.from_tensor(torch.zeros(2)))

