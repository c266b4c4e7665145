"""The torch_xla compatibility layer (xlanb.compat, python -m xlanb.run, %xla_compat).

- Programs written the way torch_xla's own examples are (an MNIST-style CNN with
  MpDeviceLoader and xm.optimizer_step, a transformers BERT step with torch_xla.sync() and
  met.metric_data("CompileTime"), an eager-mode loop), run unchanged with
  ``python -m xlanb.run`` in a child process, print exactly the losses (and compile counts)
  of the same program written against xlanb.
- The surface, in this process: devices, syncs, training helpers, metrics in torch_xla's
  formats, eager mode, loaders, the _XLAC debug calls.
- What is not provided raises NotImplementedError naming it, never a bare AttributeError.
- The real torch_xla, when installed, is left alone unless shadowing is asked for.
- ``%xla_compat on|off``.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import threading

import pytest
import torch

import xlanb
import xlanb.compat as compat
from xlanb.compat.missing import CompatImportError, CompatNotImplementedError
from support import child_env  # noqa: E402

# --------------------------------------------------------------------------- programs

# The same MNIST-like program twice: against torch_xla (run with python -m xlanb.run)
# and against xlanb; only the imports and the training loop's device calls differ.
_MNIST_IMPORTS = '''
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset
'''

_MNIST_MODEL = '''

class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, kernel_size=3)
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)'''

_MNIST_MAIN = '''

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    train(parser.parse_args())
'''

MNIST_TORCH_XLA = _MNIST_IMPORTS + '''
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
''' + _MNIST_MODEL + '''


def _train_update(step, loss):
    print(f"step {step} loss {loss.item()!r}")


def train(flags):
    g = torch.Generator().manual_seed(flags.seed)
    images = torch.randn(flags.batch_size * flags.steps, 1, 14, 14, generator=g)
    labels = torch.randint(0, 10, (flags.batch_size * flags.steps,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=flags.batch_size)

    torch.manual_seed(flags.seed)
    device = xm.xla_device()
    model = SmallCNN().to(device)
    optimizer = optim.SGD(model.parameters(), lr=flags.lr, momentum=0.5)
    train_loader = pl.MpDeviceLoader(loader, device)

    model.train()
    for step, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        xm.optimizer_step(optimizer)
        xm.add_step_closure(_train_update, args=(step, loss))
    xm.wait_device_ops()
    xm.master_print("compiles", met.metric_data("CompileTime")[0])
''' + _MNIST_MAIN

MNIST_XLANB = _MNIST_IMPORTS + '''
import xlanb
''' + _MNIST_MODEL + '''


def train(flags):
    g = torch.Generator().manual_seed(flags.seed)
    images = torch.randn(flags.batch_size * flags.steps, 1, 14, 14, generator=g)
    labels = torch.randint(0, 10, (flags.batch_size * flags.steps,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=flags.batch_size)

    torch.manual_seed(flags.seed)
    device = xlanb.device()
    model = SmallCNN().to(device)
    optimizer = optim.SGD(model.parameters(), lr=flags.lr, momentum=0.5)

    model.train()
    for step, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        xlanb.sync()
        print(f"step {step} loss {loss.item()!r}")
    print("compiles", xlanb.metrics.metric_data("CompileTime")[0])
''' + _MNIST_MAIN

_BERT = '''
import torch
import transformers

{imports}


def main():
    cfg = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64, type_vocab_size=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="eager")
    torch.manual_seed(0)
    device = {device}
    model = transformers.BertForMaskedLM(cfg).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        ids = torch.randint(0, 99, (2, 12), generator=g)
        labels = torch.full((2, 12), -100)
        labels[:, 3] = ids[:, 3]
        batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
        batch = {{k: v.to(device) for k, v in batch.items()}}
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        {sync}
        print(f"step {{step}} loss {{loss.item()!r}}")
    count, accumulated, samples = {compile_time}
    print("compiles", count, "timed", {ns} > 1e6 and len(samples) == count)


if __name__ == "__main__":
    main()
'''
BERT_TORCH_XLA = _BERT.format(
    imports="import torch_xla\nimport torch_xla.debug.metrics as met",
    device="torch_xla.device()", sync="torch_xla.sync()",
    compile_time='met.metric_data("CompileTime")', ns="accumulated")
BERT_XLANB = _BERT.format(
    imports="import xlanb", device="xlanb.device()", sync="xlanb.sync()",
    compile_time='xlanb.metrics.metric_data("CompileTime")', ns="accumulated * 1e9")

_EAGER = '''
import torch
import torch.nn as nn

{imports}

{eager_on}

torch.manual_seed(0)
device = {device}
model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(2)
x = torch.randn(10, 6, generator=g).to(device)
y = torch.randint(0, 3, (10,), generator=g).to(device)
for step in range(4):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {{step}} loss {{loss.item()!r}}")
print("whole-graph compiles", {graph_compiles}, "op compiles", {op_compiles} > 0)
'''
EAGER_TORCH_XLA = _EAGER.format(
    imports="import torch_xla\nimport torch_xla.debug.metrics as met",
    eager_on="torch_xla.experimental.eager_mode(True)\n"
             "assert torch_xla.experimental.is_eager_mode()",
    device="torch_xla.device()", graph_compiles='met.metric_data("CompileTime")',
    op_compiles='met.metric_data("EagerOpCompileTime")[0]')
EAGER_XLANB = _EAGER.format(
    imports="import xlanb", eager_on='xlanb.set_mode("eager")\nassert xlanb.get_mode() == "eager"',
    device="xlanb.device()", graph_compiles='xlanb.metrics.metric_data("CompileTime")',
    op_compiles='(xlanb.metrics.counter_value("EagerRunCompile") or 0)')


def _env(**extra) -> dict:
    # No executable store (the policy's default): each child compiles what it runs, so
    # compile counts compare.
    return child_env(extra)


def _start(args, tmp_path, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=tmp_path, env=env or _env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, rc: int = 0) -> tuple[str, str]:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == rc, f"rc {proc.returncode}:\n{err[-4000:]}"
    return out, err


def _pair(tmp_path, torch_xla_src: str, xlanb_src: str, args=()) -> tuple[str, str]:
    """Run the torch_xla program with ``python -m xlanb.run`` and the xlanb one with
    ``python`` (side by side); their stdouts."""
    (tmp_path / "prog_xla.py").write_text(torch_xla_src)
    (tmp_path / "prog_xlanb.py").write_text(xlanb_src)
    shadow = ["--shadow"] if compat.real_torch_xla() else []  # run it on xlanb regardless
    a = _start(["-m", "xlanb.run", *shadow, "prog_xla.py", *args], tmp_path)
    b = _start(["prog_xlanb.py", *args], tmp_path)
    return _finish(a)[0], _finish(b)[0]


def _losses(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("step ")]


def test_mnist_loop_runs_unchanged(tmp_path):
    got, want = _pair(tmp_path, MNIST_TORCH_XLA, MNIST_XLANB,
                      ("--steps", "4", "--lr", "0.05"))
    assert len(_losses(got)) == 4, got
    assert got == want  # same losses, bit for bit, and the same number of compiles
    assert "compiles 2" in got  # the first step, then every later one reuses a graph


def test_bert_step_runs_unchanged(tmp_path):
    pytest.importorskip("transformers")
    got, want = _pair(tmp_path, BERT_TORCH_XLA, BERT_XLANB)
    assert len(_losses(got)) == 3, got
    assert got == want
    assert "compiles 2 timed True" in got  # step 0 (no optimizer state yet), then one graph


def test_eager_loop_runs_unchanged(tmp_path):
    got, want = _pair(tmp_path, EAGER_TORCH_XLA, EAGER_XLANB)
    assert len(_losses(got)) == 4, got
    assert got == want
    assert "whole-graph compiles None op compiles True" in got


# --------------------------------------------------------------------------- xlanb.run

RUN_PROBE = '''
import faulthandler, os, sys
import torch_xla
print("name", __name__)
print("argv", sys.argv)
print("faulthandler", faulthandler.is_enabled())
print("breakpoint", os.environ.get("PYTHONBREAKPOINT"))
print("torch_xla", getattr(torch_xla, "FAKE", "xlanb"))
sys.exit(3)
'''


def test_run_leaves_a_real_torch_xla_alone_unless_shadow(tmp_path):
    """A stand-in for the real torch_xla on PYTHONPATH: without --shadow the program gets
    it (and xlanb says so); with --shadow, xlanb's modules. The program runs as __main__
    with its argv, faulthandler on and xlanb's pdb for breakpoint(); its exit code is
    the command's."""
    fake = tmp_path / "site" / "torch_xla"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("FAKE = 'real'\n")
    (tmp_path / "probe.py").write_text(RUN_PROBE)
    (tmp_path / "probe_mod.py").write_text(RUN_PROBE)
    env = _env(PYTHONPATH=str(tmp_path / "site"))
    real = _start(["-m", "xlanb.run", "probe.py", "--flag", "x"], tmp_path, env)
    shadow = _start(["-m", "xlanb.run", "--shadow", "-m", "probe_mod", "a"], tmp_path, env)
    out, err = _finish(real, rc=3)
    assert "the real torch_xla is installed" in err and "--shadow" in err
    assert "name __main__" in out and "argv ['probe.py', '--flag', 'x']" in out
    assert "faulthandler True" in out and "breakpoint xlanb.set_trace" in out
    assert "torch_xla real" in out
    out, err = _finish(shadow, rc=3)
    assert "the real torch_xla" not in err
    assert "name __main__" in out and "torch_xla xlanb" in out
    assert "argv" in out and "'a'" in out


def test_run_usage():
    res = subprocess.run([sys.executable, "-m", "xlanb.run"], capture_output=True,
                         text=True, env=_env(), timeout=60)
    assert res.returncode != 0 and "usage: python -m xlanb.run" in res.stderr


# --------------------------------------------------------------------------- the surface

@pytest.mark.versions
def test_install_resolves_the_modules_and_uninstall_removes_them(tx):
    import torch_xla._XLAC
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.xla_multiprocessing as xmp
    import torch_xla.experimental
    import torch_xla.runtime as xr
    assert xm is compat.xla_model and met is compat.metrics and pl is compat.parallel_loader
    assert xr is compat.runtime and xmp is compat.xla_multiprocessing
    assert torch_xla._XLAC is compat.xlac and torch_xla.experimental is compat.experimental
    assert compat.installed() and "on" in compat.status()
    compat.uninstall()
    assert not compat.installed() and "off" in compat.status()
    assert not [n for n in sys.modules if n.split(".")[0] == "torch_xla"]
    with pytest.raises(ModuleNotFoundError):
        import torch_xla  # noqa: F401  (the real one is not installed)
    assert compat.install()


def test_submodules_load_from_the_top_module(tx):
    """``import torch_xla`` alone is enough for torch_xla.experimental.eager_mode, as in
    torch_xla's eager-mode guide."""
    for name in [n for n in sys.modules if n.startswith("torch_xla.")]:
        del sys.modules[name]
    assert tx.experimental.is_eager_mode() is False
    assert tx.core.xla_model.get_ordinal() == 0
    assert tx.debug.metrics.counter_names() == xlanb.metrics.counter_names()
    assert tx.runtime.world_size() == 1
    assert tx.__version__.startswith("0+xlanb")


@pytest.mark.versions
def test_devices(tx):
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    dev = tx.device()
    assert dev == xm.xla_device() == xlanb.device() == torch.device("xla", 0)
    assert tx.devices() == [xlanb.device(i) for i in range(xlanb.device_count())]
    assert tx.device_count() == xlanb.device_count()
    assert xr.device_type() == xm.xla_device_hw(dev) == xm.xla_device_hw("xla:0") == "CPU"
    assert (xr.world_size(), xr.global_ordinal(), xr.local_ordinal()) == (1, 0, 0)
    assert xm.is_master_ordinal() and xm.get_ordinal() == 0
    assert xm.get_xla_supported_devices() == [f"xla:{i}" for i in range(xlanb.device_count())]
    assert xm.is_xla_tensor(torch.ones(1, device=dev)) and not xm.is_xla_tensor(torch.ones(1))


def test_syncs_and_step_closures(tx):
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    x = torch.ones(3, device="xla") * 2
    seen = []
    xm.add_step_closure(lambda t: seen.append(xlanb.pending_count()), args=(x,))
    xm.add_step_closure(seen.append, args=("second",))
    assert xlanb.pending_count() > 0
    tx.sync()
    assert xlanb.pending_count() == 0 and seen == [0, "second"]
    g = xlanb.graphs()[-1]  # the cause and the line are the torch_xla program's
    assert g.cause == "user sync (torch_xla.sync)" and g.src.file == __file__
    y = x + 1
    xm.mark_step(wait=True)
    xm.wait_device_ops()
    assert xlanb.pending_count() == 0 and met.counter_value("MarkStep") == 2
    assert y.tolist() == [3.0, 3.0, 3.0]


def test_optimizer_step_save_and_print(tx, tmp_path, capsys):
    import torch_xla.core.xla_model as xm
    model = torch.nn.Linear(3, 2).to("xla")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.ones(4, 3, device="xla")).sum().backward()
    before = model.weight.detach().cpu()
    assert xm.optimizer_step(opt, barrier=True) is None
    assert xlanb.pending_count() == 0
    torch.testing.assert_close(model.weight.detach().cpu(), before - 0.5 * 4)
    xm.save({"w": model.weight, "n": [model.bias, 3]}, tmp_path / "ck.pt")
    loaded = torch.load(tmp_path / "ck.pt")
    assert loaded["w"].device.type == "cpu" and loaded["n"][1] == 3
    torch.testing.assert_close(loaded["w"], model.weight.detach().cpu())
    xm.master_print("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"
    assert xm.mesh_reduce("acc", 0.5, max) == 0.5 and xm.rendezvous("t", b"p") == [b"p"]


def test_metrics_in_torch_xla_formats(tx):
    import torch_xla.debug.metrics as met
    a = torch.randn(4, 4, device="xla")
    (a @ a).sum().cpu()
    with xlanb.mode("eager"):
        torch.randn(7, 3, device="xla").cos().cpu()
    count, acc_ns, samples = met.metric_data("CompileTime")
    mine = xlanb.metrics.metric_data("CompileTime")
    assert count == mine.count >= 1
    assert acc_ns == pytest.approx(mine.total * 1e9)
    assert [v for _, v in samples] == pytest.approx([s * 1e9 for s in mine.samples])
    assert all(isinstance(t, float) for t, _ in samples)
    runs = xlanb.metrics.metric_data("EagerRunCompileTime")
    ops = xlanb.metrics.metric_data("OpCompileTime")
    assert runs is not None  # the eager cos (and its randn) compiled as one run
    assert met.metric_data("EagerOpCompileTime")[0] == runs.count + (ops.count if ops else 0)
    assert "EagerOpCompileTime" in met.metric_names() and "OpCompileTime" not in \
        met.metric_names()
    assert met.metric_data("NoSuchMetric") is None and met.counter_value("NoSuch") is None
    assert met.counter_value("UncachedCompile") == xlanb.metrics.counter_value("UncachedCompile")
    assert met.counter_names() == xlanb.metrics.counter_names()
    full = met.metrics_report()
    assert "Metric: CompileTime\n  TotalSamples: " in full
    assert "Metric: EagerOpCompileTime" in full and "Counter: UncachedCompile" in full
    short = met.short_metrics_report()  # torch_xla's defaults: CompileTime, ExecuteTime...
    assert "Metric: CompileTime" in short and "Metric: ExecuteTime" in short
    assert "UncachedCompile" not in short and "EagerOpCompileTime" not in short
    only = met.short_metrics_report(counter_names=["UncachedCompile"],
                                    metric_names=["EagerOpCompileTime"])
    assert only.startswith("Metric: EagerOpCompileTime") and "Counter: UncachedCompile" in only
    assert "CompileTime\n" not in only.replace("EagerOpCompileTime\n", "")
    assert met.executed_fallback_ops() == []
    met.clear_counters()
    assert met.counter_names() == [] and met.metric_names()
    met.clear_metrics()
    assert met.metric_names() == []
    torch.ones(2, device="xla").add(1).cpu()
    met.clear_all()
    assert met.metric_names() == [] and met.counter_names() == []


@pytest.mark.versions
def test_eager_mode_and_compile(tx):
    import torch_xla.experimental as exp
    exp.eager_mode(True)
    assert exp.is_eager_mode() and xlanb.get_mode() == "eager"
    with exp.eager_mode_context(False):
        assert xlanb.get_mode() == "lazy"
    assert xlanb.get_mode() == "eager"

    @tx.compile()
    def step(t):
        return (t * 3).sin().sum()

    xlanb.metrics.clear()
    out = step(torch.arange(5.0, device="xla"))
    assert xlanb.metrics.counter_value("UncachedCompile") == 1  # one graph, not per op
    assert xlanb.get_mode() == "eager" and xlanb.pending_count() == 0
    torch.testing.assert_close(out.cpu(), (torch.arange(5.0) * 3).sin().sum())
    with tx.step():
        z = torch.ones(3, device="xla") * 4
    assert z.tolist() == [4.0] * 3
    exp.eager_mode(False)
    assert not exp.is_eager_mode()


def test_mp_device_loader(tx):
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.parallel_loader as pl
    from torch.utils.data import DataLoader, TensorDataset
    data = DataLoader(TensorDataset(torch.arange(12.0).view(6, 2), torch.arange(6)),
                      batch_size=2)
    loader = pl.MpDeviceLoader(data, tx.device())
    assert len(loader) == 3
    batches = list(loader)
    assert len(batches) == 3 and all(b[0].device.type == "xla" for b in batches)
    assert batches[1][1].tolist() == [2, 3]
    # torch_xla's syncs: before each of the 3 batches, before finding the end, at the end
    assert met.counter_value("MarkStep") == 5
    per = pl.ParallelLoader(data, [tx.device()]).per_device_loader(tx.device())
    assert len(per) == 3 and next(per)[0].device.type == "xla"


def _no_metadata(hlo: str) -> str:
    return re.sub(r", metadata=\{[^}]*\}", "", hlo.split("\nFileNames")[0])


def test_xlac_debug_calls_do_not_sync(tx):
    x = torch.randn(3, 3, device="xla")
    y = (x @ x).relu()
    n = xlanb.pending_count()
    text = tx._XLAC._get_xla_tensors_text([y])
    hlo = tx._XLAC._get_xla_tensors_hlo([y])
    assert text == xlanb.pending_ir(y) and "aten::mm" in text
    # the same module; its source metadata names each caller's own frames
    assert _no_metadata(hlo) == _no_metadata(xlanb.hlo(y, dialect="hlo")) and "HloModule" in hlo
    assert xlanb.pending_count() == n


def test_xlac_hlo_is_named_as_the_sync_compiles_it(tx):
    xlanb.sync()
    y = (torch.ones(3, device="xla") * 2).sin()
    name = re.match(r"HloModule (\S+),", tx._XLAC._get_xla_tensors_hlo([y])).group(1)
    xlanb.sync()
    assert name == xlanb.graphs()[-1].lowering.module and name.startswith("jit_xlanb_graph_")


def test_names_common_scripts_use(tx, tmp_path, monkeypatch, capsys):
    """issue 34's second audit: runtime, _XLAC and spmd names scripts call."""
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from xlanb.runtime import store
    # the executable store moves to initialize_cache's folder; readonly writes nothing
    monkeypatch.setattr(xlanb.config, "store_dir", xlanb.config.store_dir)
    monkeypatch.setattr(xlanb.config, "store_readonly", False)
    monkeypatch.setattr(xlanb.config, "store_key_file", str(tmp_path / "key"))
    xr.initialize_cache(str(tmp_path / "xc"), readonly=True)
    assert xlanb.config.store_dir == str(tmp_path / "xc") and xlanb.config.store_readonly
    assert store.directory().startswith(str(tmp_path / "xc"))
    written = []
    monkeypatch.setattr(store, "_write", lambda path, key, body: written.append(path))
    monkeypatch.setattr(store, "serialize_executable",
                        type("S", (), {"serialize": staticmethod(lambda c: b"exe")}))
    store.store("k" * 64, object())  # a read-only process writes nothing
    assert written == []
    xr.initialize_cache(tmp_path / "xc")
    assert not xlanb.config.store_readonly
    store.store("k" * 64, object())
    assert len(written) == 1 and written[0].startswith(str(tmp_path / "xc"))
    xr.pause_store()  # as XLA_FLAGS=--xla_dump_to does: the folder counts after the dump
    xr.initialize_cache(str(tmp_path / "later"))
    assert xlanb.config.store_dir is None
    xr.resume_store()
    assert xlanb.config.store_dir == str(tmp_path / "later")
    # the device type: this platform's, silently; TPU with a note; another, an error
    xr.set_device_type("CPU")
    assert capsys.readouterr().err == ""
    xr.set_device_type("TPU")
    assert "runs on JAX's platform, CPU here" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="XLANB_PLATFORM"):
        xr.set_device_type("CUDA")
    # no device of another kind, as torch_xla answers
    assert xm.get_xla_supported_devices("TPU") is None
    assert xm.get_xla_supported_devices(["TPU", "CPU"]) == xm.get_xla_supported_devices()
    assert tx._XLAC._xla_get_default_device() == "xla:0"
    xlanb.sync()
    y = torch.ones(2, 2, device="xla").cos()
    xlanb.sync()
    assert tx._XLAC._get_num_cached_compilation_graph() >= 1
    mesh = xs.get_1d_mesh()
    assert xs.get_global_mesh() is None
    try:
        xs.set_global_mesh(mesh)
        assert xs.get_global_mesh() is mesh
        with pytest.raises(TypeError):
            xs.set_global_mesh("data")
    finally:
        xs.set_global_mesh(None)
    del y


def test_graph_saver_writes_the_pending_graph(tx, tmp_path, monkeypatch):
    import torch_xla.debug.graph_saver as gs
    y = (torch.ones(3, device="xla") + 1).tanh()
    n = xlanb.pending_count()
    seen: list = []
    for fmt, mark in (("text", "aten::tanh"), ("dot", "digraph"), ("hlo", "HloModule")):
        monkeypatch.setenv("SAVE_GRAPH_FMT", fmt)
        path = gs.save_tensors_graph(str(tmp_path), "g", [y])  # torch_xla's file name
        assert os.path.basename(path) == f"g-{threading.get_ident()}-{'012'[len(seen)]}.{fmt}"
        seen.append(path)
        assert mark in open(path).read()
    assert gs.save_tensors_graph(str(tmp_path), "g", [y]).endswith("-3.hlo")
    assert xlanb.pending_count() == n  # nothing ran
    monkeypatch.setenv("SAVE_GRAPH_FMT", "png")
    with pytest.raises(RuntimeError, match="text, dot, hlo"):
        gs.save_tensors_graph(str(tmp_path), "g", [y])


@pytest.mark.versions
def test_torch_compile_openxla_backends_run_on_xlanb(tx):
    import torch._dynamo
    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    dev = copy.deepcopy(cpu).to("xla")
    x = torch.randn(5, 4)
    try:
        for backend in ("openxla", "openxla_eval"):
            model = torch.compile(dev, backend=backend)
            with torch.no_grad():
                for _ in range(2):
                    out = model(x.to("xla"))
            assert torch.allclose(out.cpu(), cpu(x), atol=1e-5), backend
        model = torch.compile(dev, backend="openxla")  # training: the gradients too
        model(x.to("xla")).sum().backward()
        cpu(x).sum().backward()
        assert torch.allclose(dev[0].weight.grad.cpu(), cpu[0].weight.grad, atol=1e-5)
    finally:
        torch._dynamo.reset()
    from torch._dynamo.backends.registry import lookup_backend
    from xlanb.capture.dynamo import xlanb_backend
    assert lookup_backend("openxla") is xlanb_backend
    compat.uninstall()  # torch's own again
    assert lookup_backend("openxla") is not xlanb_backend


def test_the_openxla_backend_tiers_up_its_replays(tx):
    """Issue 57: torch.compile(backend="openxla") replays through xlanb.compile; its
    graph runs optimized from its third run (graphs.run_cached), not quick forever."""
    import torch._dynamo
    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 27), torch.nn.ReLU(), torch.nn.Linear(27, 1))
    dev = copy.deepcopy(cpu).to("xla")
    x = torch.randn(5, 4)
    up0 = xlanb.metrics.counter_value("GraphTierUp") or 0
    quick = []
    try:
        model = torch.compile(dev, backend="openxla")
        with torch.no_grad():
            for _ in range(4):
                torch.testing.assert_close(model(x.to("xla")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
                quick.append([g for g in xlanb.graphs()
                              if g.cause.startswith("xlanb.compile(torch.compile graph")][-1].quick)
    finally:
        torch._dynamo.reset()
    assert quick == [True, True, False, False]
    assert (xlanb.metrics.counter_value("GraphTierUp") or 0) == up0 + 1


def test_multiprocessing_runs_one_replica_here(tx):
    import torch_xla.distributed.xla_multiprocessing as xmp
    assert xmp.spawn(lambda i, a: (i, a), args=(5,)) == (0, 5)
    assert tx.launch(lambda i: i * 10) == 0
    with pytest.raises(NotImplementedError, match="xlanb.launch"):
        xmp.spawn(print, nprocs=8)


# --------------------------------------------------------------------------- not provided

@pytest.mark.parametrize("module, attr, hint", [
    ("torch_xla", "no_such_thing", "Coming from torch_xla"),
    ("torch_xla.core.xla_model", "all_gather", "per-replica collectives"),
    ("torch_xla.core.xla_model", "get_rng_state", "manual_seed"),
    ("torch_xla.debug.metrics", "save_metrics", "metrics_report"),
    ("torch_xla.runtime", "get_master_ip", "XLANB_COORDINATOR_ADDRESS"),
    ("torch_xla._XLAC", "_clear_pending_irs", "del t"),
    ("torch_xla.experimental", "custom_kernel", "Pallas"),
    ("torch_xla.distributed.parallel_loader", "Nope", "docs/guides/torch-xla.md"),
    ("torch_xla._XLAC", "_xla_step_marker", "sync"),
    ("torch_xla.core", "functions", "docs/guides/torch-xla.md"),
])
def test_outside_the_surface_is_not_implemented(tx, module, attr, hint):
    import importlib
    mod = importlib.import_module(module)
    with pytest.raises(NotImplementedError) as e:
        getattr(mod, attr)
    assert f"{module}.{attr} is not provided" in str(e.value) and hint in str(e.value)
    assert isinstance(e.value, AttributeError)  # so hasattr / getattr(default) probe
    assert not hasattr(mod, attr) and getattr(mod, attr, "dflt") == "dflt"


def test_spmd_is_xlanb_spmd_and_unknown_modules_raise_at_import(tx):
    import torch_xla.distributed.spmd as xs
    import xlanb.spmd
    assert xs.Mesh is xlanb.spmd.Mesh and xs.mark_sharding is xlanb.spmd.mark_sharding
    from torch_xla.distributed.spmd.debugging import visualize_tensor_sharding  # noqa: F401
    with pytest.raises(NotImplementedError, match="XLAShardedTensor is not provided"):
        xs.XLAShardedTensor
    with pytest.raises(NotImplementedError, match="torch_xla.utils.utils is not provided"):
        import torch_xla.utils.utils  # noqa: F401
    with pytest.raises(ImportError):  # ``try: import ... except ImportError`` guards work
        from torch_xla.distributed import xla_backend  # noqa: F401
    with pytest.raises(NotImplementedError, match="use_spmd.auto=True"):
        tx.runtime.use_spmd(auto=True)
    assert tx.runtime.is_spmd() is xlanb.spmd.is_spmd()
    assert issubclass(CompatNotImplementedError, NotImplementedError)


def test_a_real_torch_xla_is_left_alone_unless_shadowed(monkeypatch):
    monkeypatch.setattr(compat, "real_torch_xla", lambda: "/site/torch_xla/__init__.py")
    try:
        with pytest.warns(UserWarning, match="real torch_xla is installed.*shadow=True"):
            assert compat.install() is False
        assert not compat.installed()
        assert "real torch_xla is installed at /site" in compat.status()
        assert compat.install(shadow=True) is True and compat.installed()
        assert "shadowing the real torch_xla" in compat.status()
    finally:
        compat.uninstall()


def test_lazy_public_attribute():
    assert xlanb.compat is compat
    with pytest.raises(AttributeError):
        xlanb.no_such_attribute


# --------------------------------------------------------------------------- %xla_compat

def test_xla_compat_magic(monkeypatch):
    IPython = pytest.importorskip("IPython")  # noqa: F841
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    if compat.real_torch_xla() is not None:
        pytest.skip("the real torch_xla is installed here")
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "xlanb")
    try:
        def magic(line):
            with capture_output() as c:
                ip.run_line_magic("xla_compat", line)
            return c.stdout

        assert "compatibility off" in magic("")
        assert "compatibility on" in magic("on") and compat.installed()
        with capture_output():
            res = ip.run_cell("import torch, torch_xla.core.xla_model as xm\n"
                              "t = torch.ones(3, device=xm.xla_device()) + 1")
        res.raise_error()
        with capture_output() as c:
            ip.run_line_magic("xla_pending", "t --text")
        shown = c.stdout + "".join(o.data.get("text/plain", "") for o in c.outputs)
        assert "aten::add" in shown  # the magics work on what torch_xla code made
        assert "compatibility on" in magic("")
        with pytest.raises(UsageError, match="on or off"):
            ip.run_line_magic("xla_compat", "maybe")
        assert "compatibility off" in magic("off") and not compat.installed()
        monkeypatch.setattr(compat, "real_torch_xla", lambda: "/site/torch_xla")
        out = magic("on")
        assert "real torch_xla is installed" in out and "--shadow" in out
        assert not compat.installed()
        assert "compatibility on" in magic("on --shadow") and compat.installed()
    finally:
        compat.uninstall()
        ip.user_ns.pop("t", None)
        with capture_output():
            ip.run_line_magic("unload_ext", "xlanb")
    assert ip.find_line_magic("xla_compat") is None
