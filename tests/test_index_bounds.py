"""Out-of-range indices raise CPU torch's error in every mode (issue 37, item 1).

XLA clamps an out-of-range gather index and drops an out-of-range scatter update, where
CPU torch raises. xlanb checks index values the host has before the op runs, and an
index computed in a pending graph (lazy, opbyop) inside the graph of the next sync (one
fused extra output, raised after the run, before anything is swapped in, once).
"""
from __future__ import annotations

import re
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F

import xlanb
from xlanb.base.config import config


def _base():
    return torch.arange(6.).reshape(2, 3)


# name -> (call(a, idx), bad index, good index). ``a`` is a (2, 3) float tensor.
CASES = {
    "gather": (lambda a, i: torch.gather(a, 1, i), [[0, 9]], [[0, 2], [1, 1]]),
    "gather_negative": (lambda a, i: torch.gather(a, 1, i), [[0, -1]], [[2, 0]]),
    "gather_long": (lambda a, i: torch.gather(a.long(), 1, i), [[0, 9]], [[2, 1]]),
    "index_select_dim1": (lambda a, i: torch.index_select(a, 1, i), [0, 9], [2, 0]),
    "index_select_dim0": (lambda a, i: torch.index_select(a, 0, i), [0, 5], [1, 0]),
    "embedding": (lambda a, i: F.embedding(i, a), [1, 10], [1, 0, 1]),
    "embedding_bag": (lambda a, i: F.embedding_bag(i, a, torch.tensor([0], device=a.device)),
                      [0, 2], [1, 0]),
    "cross_entropy": (lambda a, i: F.cross_entropy(a, i), [1, 7], [1, 2]),
    "cross_entropy_ignored": (lambda a, i: F.cross_entropy(a, i), [1, -3], [1, -100]),
    "nll_loss": (lambda a, i: F.nll_loss(F.log_softmax(a, 1), i), [7, 0], [0, 2]),
    "nll_loss2d": (lambda a, i: F.nll_loss(a.reshape(1, 2, 3, 1), i.reshape(1, 3, 1)),
                   [0, 1, 5], [0, 1, 1]),
    "multi_margin_loss": (lambda a, i: F.multi_margin_loss(a, i), [0, 3], [0, 2]),
    "scatter_value": (lambda a, i: a.clone().scatter_(1, i, 1.5), [[0, 9]], [[2, 0]]),
    "scatter_src": (lambda a, i: a.clone().scatter_(1, i, torch.ones(1, 2, device=a.device)),
                    [[0, 9]], [[2, 0]]),
    "scatter_add_": (lambda a, i: a.clone().scatter_add_(1, i, torch.ones(1, 2, device=a.device)),
                     [[0, 9]], [[2, 2]]),
    "scatter_reduce": (lambda a, i: torch.scatter_reduce(a, 1, i, torch.ones(1, 2, device=a.device),
                                                         "amax"), [[-1, 0]], [[2, 0]]),
    "index_add_": (lambda a, i: a.clone().index_add_(1, i, torch.ones(2, 2, device=a.device)),
                   [0, 9], [2, 2]),
    "index_copy_": (lambda a, i: a.clone().index_copy_(1, i, torch.ones(2, 2, device=a.device)),
                    [0, 9], [2, 0]),
    "index_fill_": (lambda a, i: a.clone().index_fill_(1, i, -1.0), [0, -4], [0, -1]),
    "take": (lambda a, i: torch.take(a, i), [0, 6], [5, -6]),
    "put_": (lambda a, i: a.clone().put_(i, torch.ones(2, device=a.device)), [0, -7], [5, 0]),
    "getitem": (lambda a, i: a[:, i], [0, 3], [2, -3]),
    "index_put_": (lambda a, i: a.clone().index_put_((i,), torch.tensor(1.0, device=a.device)),
                   [1, -3], [1, -2]),
    # issue 46: ops whose indices were not checked in any mode
    "one_hot": (lambda a, i: F.one_hot(i, 3), [0, 3], [2, 0]),
    "one_hot_negative": (lambda a, i: F.one_hot(i, 3), [-1, 2, 5], [1]),
    "one_hot_inferred": (lambda a, i: F.one_hot(i), [0, -1], [0, 2]),
    "max_unpool1d": (lambda a, i: F.max_unpool1d(a[:1, :2].reshape(1, 1, 2), i.reshape(1, 1, 2), 2),
                     [0, 9], [1, 3]),
    "max_unpool2d": (lambda a, i: F.max_unpool2d(a[:1, :2].reshape(1, 1, 1, 2),
                                                 i.reshape(1, 1, 1, 2), 2), [0, -1], [1, 3]),
    "multilabel_margin_loss": (lambda a, i: F.multilabel_margin_loss(a[0], i), [1, 3, 0],
                               [2, -1, 0]),
    "searchsorted_sorter": (lambda a, i: torch.searchsorted(a[0], a[1] - 3.5, sorter=i),
                            [2, 0, 3], [0, 1, 2]),
    # a mask (broadcast over a's 2 rows) with more ones than the source has elements
    "masked_scatter": (lambda a, i: a.masked_scatter(i.bool(), torch.ones(2, device=a.device)),
                       [0, 1, 1], [1, 0, 0]),
    # CPU torch 2.13 wraps take_along_dim's indices (a remainder before its gather): no
    # error there, and none here: the same values
    "take_along_dim": (lambda a, i: torch.take_along_dim(a, i, 1), [[0, 9]], [[0, 2]]),
}

SOURCES = ("host", "device")


def _index(values, source):
    """An index tensor on the xla device: copied from the host (xlanb keeps its values),
    or computed on the device (pending in lazy and opbyop mode)."""
    t = torch.tensor(values).to("xla")
    return t if source == "host" else t * 1


def _cpu_outcome(call, values):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return call(_base(), torch.tensor(values)), None
        except Exception as e:  # noqa: BLE001 - the error CPU torch raises is the expectation
            return None, e


def _message(cpu_err) -> str:
    """CPU torch's message as a pattern; embedding_bag's names the position of the bad
    index, which a range found on the device does not have: its value and range only."""
    text = str(cpu_err).splitlines()[0]
    m = re.match(r"Index \d+ of input takes value (.*)", text)
    if m:
        return "Index .*of input takes value " + re.escape(m.group(1))
    return re.escape(text)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_out_of_range_index_raises_torch_error(mode, case, source):
    call, bad, _ = CASES[case]
    want, cpu_err = _cpu_outcome(call, bad)
    a = _base().to("xla")
    idx = _index(bad, source)
    if cpu_err is None:  # take_along_dim: CPU torch gives values, so must xlanb
        torch.testing.assert_close(call(a, idx).cpu(), want)
        return
    got = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(type(cpu_err), match=_message(cpu_err)) as info:
            got["out"] = call(a, idx)
            got["out"].cpu()
    assert type(info.value) is type(cpu_err)
    notes = "\n".join(getattr(info.value, "__notes__", ()))
    assert "test_index_bounds.py" in notes, notes  # the user's line
    assert "aten::" in notes, notes                # and the op
    # the session goes on; a result kept from the failed sync raises on every read, and
    # so does every tensor computed from it (a sync leaves them pending)
    torch.testing.assert_close((a + 1).cpu(), _base() + 1)
    xlanb.sync()
    if "out" in got:
        for read in (lambda: got["out"].cpu(), lambda: (got["out"] * 1).cpu()):
            with pytest.raises(type(cpu_err), match=_message(cpu_err)):
                read()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_in_range_index_gives_cpu_values(mode, case, source):
    call, _, good = CASES[case]
    want, cpu_err = _cpu_outcome(call, good)
    assert cpu_err is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = call(_base().to("xla"), _index(good, source))
    torch.testing.assert_close(got.cpu(), want)


def test_device_check_is_one_output_of_the_lazy_graph():
    # a pending index is checked inside the graph that computes it: no extra graph, no
    # recompile on the next step, and the graph lists the check
    xlanb.set_mode("lazy")
    a = _base().to("xla")
    for step in range(3):
        labels = torch.tensor([1, 2]).to("xla") * 1
        loss = F.cross_entropy(a * (step + 1.0), labels)
        xlanb.sync()
        assert loss.item() == pytest.approx(F.cross_entropy(_base() * (step + 1),
                                                            torch.tensor([1, 2])).item())
    assert xlanb.metrics.counter_value("UncachedCompile") == 1
    assert "xlanb::index_bounds" in xlanb.graphs()[-1].ops


@pytest.mark.parametrize("mode_name", ["lazy", "opbyop"])
def test_device_check_keeps_pending_work_and_fails_the_result(mode_name):
    xlanb.set_mode(mode_name)
    a = _base().to("xla")
    idx = torch.tensor([[0, 9]]).to("xla") * 1
    out = torch.gather(a, 1, idx)
    kept = a * 2  # other pending work in the same graph
    with pytest.raises(RuntimeError, match="index 9 is out of bounds for dimension 1") as info:
        xlanb.sync()
    notes = "\n".join(info.value.__notes__)
    assert "aten::gather at test_index_bounds.py" in notes and "sync" in notes
    assert kept._storage.node.data is None  # nothing swapped in
    xlanb.sync()  # runs the rest; the failed result stays pending
    torch.testing.assert_close(kept.cpu(), _base() * 2)
    assert out._storage.node.data is None
    with pytest.raises(RuntimeError, match="index 9 is out of bounds for dimension 1"):
        out.cpu()
    torch.testing.assert_close(idx.cpu(), torch.tensor([[0, 9]]))  # the index itself is fine


def test_check_device_indices_off_leaves_device_indices_unchecked(monkeypatch):
    xlanb.set_mode("lazy")
    monkeypatch.setattr(config, "check_device_indices", False)
    a = _base().to("xla")
    out = torch.gather(a, 1, torch.tensor([[0, 9]]).to("xla") * 1)
    out.cpu()  # XLA's values: no check compiled into the graph
    assert "xlanb::index_bounds" not in xlanb.graphs()[-1].ops
    with pytest.raises(RuntimeError, match="index 9 is out of bounds"):  # host values: still
        torch.gather(a, 1, torch.tensor([[0, 9]]).to("xla"))


def test_eager_large_device_index_checked_on_the_device():
    # an eager index too big to read back whole is reduced to its range on the device
    xlanb.set_mode("eager")
    w = torch.randn(10, 4).to("xla")
    ids = (torch.arange(5000).to("xla") % 10)
    torch.testing.assert_close(F.embedding(ids, w).cpu(), F.embedding(torch.arange(5000) % 10,
                                                                      w.cpu()))
    bad = ids + 1
    xlanb.sync()  # computed: nothing waits on a background compile, so the op itself raises
    with pytest.raises(IndexError, match="index out of range in self") as info:
        F.embedding(bad, w)
    assert "checked before it ran" in "\n".join(info.value.__notes__)


def test_dropped_pending_work_is_not_checked():
    # lazy semantics: pending work nobody holds never runs, and its index is not checked
    xlanb.set_mode("lazy")
    a = _base().to("xla")
    out = torch.gather(a, 1, torch.tensor([[0, 9]]).to("xla") * 1)
    del out
    xlanb.sync()
    kept = torch.gather(a, 1, torch.tensor([[0, 9]]).to("xla") * 1)
    with pytest.raises(RuntimeError, match="index 9 is out of bounds"):
        xlanb.sync()
    del kept


@pytest.mark.parametrize("mode_name", ["lazy", "opbyop"])
def test_a_look_at_a_result_of_a_bad_pending_index_raises(mode_name):
    # a peek (print, pdb's p) computes pending values op by op: it raises torch's error
    # rather than show XLA's clamped values and changes no pending graph; the result then
    # raises on every look and read, as after a sync's check
    xlanb.set_mode(mode_name)
    a = _base().to("xla")
    out = torch.gather(a, 1, torch.tensor([[0, 9]]).to("xla") * 1)
    with pytest.raises(RuntimeError, match="index 9 is out of bounds") as info:
        xlanb.peek(out)
    assert "look" in "\n".join(info.value.__notes__)
    assert out._storage.node.data is None  # still pending
    for read in (lambda: xlanb.peek(out), out.cpu, lambda: (out + 1).cpu()):
        with pytest.raises(RuntimeError, match="index 9 is out of bounds"):
            read()
    xlanb.sync()
    good = torch.gather(a, 1, torch.tensor([[0, 2]]).to("xla") * 1)
    torch.testing.assert_close(xlanb.peek(good), torch.tensor([[0.0, 2.0]]))
    torch.testing.assert_close(good.cpu(), torch.tensor([[0.0, 2.0]]))


def test_eager_index_waiting_on_a_background_compile_raises_at_the_op(tmp_path):
    # PyTorch's test_trivial_fancy_out_of_bounds in a fresh process: the ops that make
    # the index wait on background compiles, and the op reading it still raises (the
    # index alone is computed, as a look does; the other waiting ops stay waiting)
    import subprocess
    import sys
    code = (
        "import torch, xlanb\n"
        "from xlanb.base.session import mode_state\n"
        "xlanb.set_mode('eager')\n"
        "a = torch.zeros(5, device='xla')\n"
        "other = a + 1\n"
        "ind = torch.ones(20, dtype=torch.int64, device='xla')\n"
        "ind[-1] = 10\n"
        "print('deferred', mode_state().deferred)\n"
        "try:\n"
        "    a[ind]\n"
        "except IndexError as e:\n"
        "    print('raised', e)\n"
        "print(other.cpu().tolist(), a[ind.clamp(max=4)].cpu().sum().item())\n")
    env = dict(__import__("os").environ, XLANB_STORE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "raised index 10 is out of bounds for dimension 0 with size 5" in out.stdout
    assert "[1.0, 1.0, 1.0, 1.0, 1.0] 0.0" in out.stdout


@pytest.mark.parametrize("index", [3, -4])
def test_select_scatter_host_index_out_of_range(mode, index):
    # a Python int index: torch's IndexError before anything runs
    a = torch.zeros(3, 2).to("xla")
    with pytest.raises(IndexError, match=re.escape(f"select(): index {index} out of range for "
                                                   "tensor of size [3, 2] at dimension 0")):
        torch.select_scatter(a, torch.ones(2).to("xla"), 0, index)
    torch.testing.assert_close(torch.select_scatter(a, torch.ones(2).to("xla"), 0, -1).cpu(),
                               torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))


@pytest.mark.parametrize("mode_name", ["lazy", "opbyop"])
def test_a_failed_result_raises_on_every_read_and_use(mode_name):
    # the result of an op whose index check failed holds XLA's values (clamped, dropped):
    # it raises torch's error on every read, and so does every tensor computed from it,
    # until it is dropped; its index and other tensors stay readable
    xlanb.set_mode(mode_name)
    idx = torch.tensor([2, 5]).to("xla") * 1
    y = torch.zeros(5).to("xla").index_add(0, idx, torch.ones(2).to("xla"))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 0"):
            y.tolist()
    z = torch.arange(5).to("xla")[idx]
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0"):
        print(z)  # found by the look
    for read in (lambda: print(z), lambda: z.sum().item(), lambda: y[0].item(), z.cpu):
        with pytest.raises((IndexError, RuntimeError), match="index 5 is out of bounds"):
            read()
    used = z + 1  # recorded: raises when read
    xlanb.sync()  # runs what it can, leaves the failed ones pending
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        used.cpu()
    assert idx.tolist() == [2, 5]
    from xlanb.values.checks import failed_nodes
    failed = [weakref.ref(t._storage.node) for t in (y, z)]
    assert all(id(r()) in failed_nodes for r in failed)
    del y, z, used, read  # dropped: nothing keeps them, nor their failure
    assert all(r() is None for r in failed)
    assert all(ref() is not None for ref, _, _ in failed_nodes.values())


def _emb_step(shift=0):
    """An embedding's weight and a compiled loss step that looks up ``ids + shift``."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4).to("xla")
    lin = torch.nn.Linear(4, 5).to("xla")
    return emb, xlanb.compile(lambda ids, tgt: F.cross_entropy(lin(emb(ids + shift)), tgt))


def _on(values):
    return torch.tensor(values).to("xla")


@pytest.mark.parametrize("bad", ["ids", "target", "device_ids"])
def test_compiled_replay_raises_for_out_of_range_index(bad):
    # a replay runs the executable without Python: the index checks are part of its graph
    emb, step = _emb_step()
    good = [step(_on([1, 2, 3]), _on([1, 2, 3])).item() for _ in range(3)]
    assert step.replays == 1 and len(set(good)) == 1
    weight = emb.weight.cpu()
    args = {"ids": (_on([1, 2, 10]), _on([1, 2, 3])),
            "target": (_on([1, 2, 3]), _on([1, 2, 7])),
            "device_ids": (_on([1, 2, 3]) * 1 + 7, _on([1, 2, 3]))}[bad]
    err = IndexError
    match = "Target 7 is out of bounds" if bad == "target" else "index out of range in self"
    with pytest.raises(err, match=match) as info:
        step(*args)
    notes = "\n".join(info.value.__notes__)
    assert "xlanb.compile" in notes and "test_index_bounds.py" in notes, notes
    assert step.replays == 2
    torch.testing.assert_close(emb.weight.cpu(), weight)
    assert step(_on([1, 2, 3]), _on([1, 2, 3])).item() == good[0]  # replays on


def test_compiled_traced_call_checks_an_index_it_computes():
    # the first calls are traced in lazy mode: an index computed inside the function is
    # checked by the graph of the call's end
    _, step = _emb_step(shift=7)
    with pytest.raises(IndexError, match="index out of range in self") as info:
        step(_on([1, 2, 3]), _on([1, 2, 3]))
    assert "compiled sync" in "\n".join(info.value.__notes__)
    for _ in range(3):
        step(_on([0, 1, 2]), _on([1, 2, 3])).item()
    assert step.replays == 1


def test_torch_compile_replay_raises_for_out_of_range_index():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4).to("xla")
    head = torch.nn.Linear(4, 5).to("xla")
    f = torch.compile(lambda ids: head(emb(ids)).argmax(-1), backend="xlanb")
    with torch.no_grad():  # no autograd: the graph replays through xlanb.compile
        good = [f(_on([1, 2, 3])).tolist() for _ in range(3)]
        with pytest.raises(IndexError, match="index out of range in self"):
            f(_on([1, 2, 10])).tolist()
        assert f(_on([1, 2, 3])).tolist() == good[0]


@pytest.mark.parametrize("pending", [False, True], ids=["host ids", "pending ids"])
def test_embedding_max_norm_bad_id_gives_cpu_torchs_message(mode, pending):
    """Issue 46: ``embedding(max_norm=...)`` renormalizes the rows it reads first, and CPU
    torch's kernel fails there, with select's message; xlanb gave embedding's own."""
    torch.manual_seed(0)
    w = torch.randn(10, 4) * 3
    kept = w.clone()
    ids = torch.tensor([1, 2, 10])
    with pytest.raises(IndexError) as cpu:
        F.embedding(ids, w, max_norm=1.0)
    wx = kept.to("xla")
    idx = (ids.to("xla") + 0) if pending else ids.to("xla")
    with pytest.raises(IndexError, match=re.escape(str(cpu.value))):
        F.embedding(idx, wx, max_norm=1.0).sum().item()
    del idx
    if pending and mode != "eager":
        # the in-place renorm's result is the weight: it raises until dropped (issue 46
        # item 3), where CPU torch left rows 1 and 2 renormalized
        with pytest.raises(IndexError, match=re.escape(str(cpu.value))):
            wx.cpu()
    else:  # checked before anything ran: nothing renormalized
        torch.testing.assert_close(wx.cpu(), kept)


def test_a_wrong_shape_bool_mask_raises_torchs_error_alone(mode):
    """Issue 46: the right IndexError came chained to two internal NotImplementedErrors
    (no meta kernel; the lowering does not trace a data-dependent shape)."""
    x = torch.randn(4, 3).to("xla")
    m = torch.tensor([True, False, True]).to("xla")
    with pytest.raises(IndexError, match="The shape of the mask") as e:
        x[m].cpu()
    assert e.value.__context__ is None and e.value.__cause__ is None, repr(e.value.__context__)
