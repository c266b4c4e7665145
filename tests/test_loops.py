"""Loops the program asks for (xlanb/loops/scan.py): ``xlanb.scan``, ``xlanb.scan_layers`` and
torch_xla's ``scan``, ``scan_layers`` and ``utils.checkpoint`` on them (xlanb.compat).

In lazy mode the loop is compiled as one ``lax.scan`` on the CPU too (the graph's
``repeats`` say so); values and gradients are CPU torch's, for the same model unrolled.
Small models: each test compiles a graph or two of a few dozen ops."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import xlanb
import xlanb.compat as compat
from xlanb.execute.graphs import clear_graph_cache

TOL = dict(rtol=1e-5, atol=1e-6)
# gradients summed over the iterations: XLA's order of the float32 sums differs from
# CPU torch's (2.5e-6 seen on values of 0.1)
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def _lazy():
    with xlanb.mode("lazy"):
        yield
    clear_graph_cache()  # a loop's graph has the unrolled graph's structure


@pytest.fixture
def txla():
    """torch_xla's modules (xlanb's), for the test."""
    was = compat.installed()
    compat.install(shadow=True)
    import torch_xla.experimental.scan as scan_mod
    import torch_xla.experimental.scan_layers as layers_mod
    import torch_xla.utils.checkpoint as ckpt_mod
    yield scan_mod, layers_mod, ckpt_mod
    if not was:
        compat.uninstall()


class Block(nn.Module):
    def __init__(self, d: int = 8):
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Stack(nn.Module):
    def __init__(self, loop, n: int = 3):
        super().__init__()
        self.loop = loop
        self.layers = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        if self.loop is None:
            for layer in self.layers:
                x = layer(x)
            return x
        return self.loop(self.layers, x)


def _step(model, x):
    """Loss, output and every gradient of one SGD step, and the updated weights, on CPU."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = model(x)
    loss = out.pow(2).mean()
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    opt.step()
    xlanb.sync()
    return [t.detach().cpu() for t in [loss, out, *grads, *model.parameters()]]


@pytest.mark.parametrize("api", ["xlanb", "torch_xla"])
def test_scan_layers_is_one_loop_with_the_unrolled_values(api, txla):
    loop = xlanb.scan_layers if api == "xlanb" else txla[1].scan_layers
    torch.manual_seed(0)
    cpu = Stack(None)
    x = torch.randn(4, 8)
    want = _step(copy.deepcopy(cpu), x)
    model = Stack(loop)
    model.load_state_dict(cpu.state_dict())
    got = _step(model.to("xla"), x.to("xla"))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)
    assert all(g.abs().sum() > 0 for g in got[2:2 + len(list(cpu.parameters()))])
    repeats = xlanb.graphs()[-1].repeats
    # the program asked for it: a loop on the CPU too (found runs stay unrolled here)
    assert repeats[0] == "3 × layers compiled once (scan, layers 0–2)", repeats
    assert any("layers update compiled once" in r for r in repeats)


class EmbedThenStack(nn.Module):
    def __init__(self, loop: bool, n: int = 3):
        super().__init__()
        self.loop = loop
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        if not self.loop:
            return nn.Sequential(*self.layers)(self.embed(x))
        return xlanb.scan_layers(self.layers, self.embed(x))  # one line: embed and loop


def test_an_op_on_the_loop_calls_line_stays_out_of_the_first_layers_backward():
    # the loop's step op carries the scan_layers call's line; the embedding's backward,
    # recorded with that same line, must not join layer 0's backward (it once did, and
    # layer 0's backward and update then stayed unrolled)
    torch.manual_seed(0)
    cpu = EmbedThenStack(loop=False)
    x = torch.randn(4, 4)
    want = _step(copy.deepcopy(cpu), x)
    model = EmbedThenStack(loop=True)
    model.load_state_dict(cpu.state_dict())
    got = _step(model.to("xla"), x.to("xla"))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **GRAD_TOL)
    repeats = xlanb.graphs()[-1].repeats
    assert repeats == ["3 × layers compiled once (scan, layers 0–2)",
                       "3 × layers backward compiled once (scan, layers 0–2)",
                       "3 × layers update compiled once (scan, layers 0–2)"], repeats


def test_a_plain_loop_of_the_same_layers_stays_unrolled_on_the_cpu():
    torch.manual_seed(0)
    model = Stack(None).to("xla")
    _step(model, torch.randn(4, 8).to("xla"))
    assert xlanb.graphs()[-1].repeats == []  # XLANB_SCAN_LAYERS=auto: TPU compiles only


def test_scan_layers_of_a_bare_list_numbers_its_own_iterations():
    torch.manual_seed(0)
    layers = [nn.Linear(8, 8) for _ in range(4)]
    x = torch.randn(2, 8)
    want = nn.Sequential(*copy.deepcopy(layers))(x)
    dev = [copy.deepcopy(m).to("xla") for m in layers]
    got = xlanb.scan_layers(dev, x.to("xla"))
    xlanb.sync()
    torch.testing.assert_close(got.cpu(), want, **TOL)
    assert xlanb.graphs()[-1].repeats[0].startswith("4 × scan_layers compiled once")


def test_scan_layers_checks_the_layers_are_alike():
    with pytest.raises(ValueError, match="Shape mismatch for 'weight' in layer 1"):
        xlanb.scan_layers([nn.Linear(4, 4), nn.Linear(4, 8)], torch.randn(2, 4))
    with pytest.raises(ValueError, match="Layer 1 has mismatched keys. Missing keys: {'bias'}"):
        xlanb.scan_layers([nn.Linear(4, 4), nn.Linear(4, 4, bias=False)], torch.randn(2, 4))
    x = torch.randn(2, 4)
    assert xlanb.scan_layers([], x) is x


@pytest.mark.parametrize("api", ["xlanb", "torch_xla"])
def test_scan_matches_a_python_loop_with_gradients(api, txla):
    scan = xlanb.scan if api == "xlanb" else txla[0].scan

    def fn(carry, x):
        h = torch.tanh(carry @ x["w"] + x["b"])
        return h, (h.sum(), None)

    torch.manual_seed(0)
    init, w, b = torch.randn(2, 4), torch.randn(5, 4, 4), torch.randn(5, 4)
    leaves = [t.clone().requires_grad_() for t in (init, w, b)]
    carry, ys = leaves[0], []
    for i in range(5):
        carry, (y, _) = fn(carry, {"w": leaves[1][i], "b": leaves[2][i]})
        ys.append(y)
    (carry.sum() + torch.stack(ys).pow(2).sum()).backward()

    dev = [t.to("xla").requires_grad_() for t in (init, w, b)]
    c, (y, none) = scan(fn, dev[0], {"w": dev[1], "b": dev[2]})
    (c.sum() + y.pow(2).sum()).backward()
    xlanb.sync()
    assert none is None and tuple(y.shape) == (5,)
    torch.testing.assert_close(c.cpu(), carry.detach(), **TOL)
    torch.testing.assert_close(y.cpu(), torch.stack(ys).detach(), **TOL)
    for d, ref in zip(dev, leaves):
        torch.testing.assert_close(d.grad.cpu(), ref.grad, **GRAD_TOL)
    assert xlanb.graphs()[-1].repeats[0].startswith("5 × scan compiled once")


def test_scan_rejects_bad_input():
    with pytest.raises(ValueError, match="must be callable"):
        xlanb.scan(3, torch.zeros(2), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="same leading dimension"):
        xlanb.scan(lambda c, x: (c, x), torch.zeros(2), (torch.zeros(3, 2), torch.zeros(4, 2)))
    with pytest.raises(ValueError, match="empty pytree"):
        xlanb.scan(lambda c, x: (c, x), torch.zeros(2), ())


def test_scan_in_eager_mode_gives_the_same_values():
    def fn(c, x):
        c = c * 0.5 + x
        return c, c
    xs = torch.arange(12.0).reshape(4, 3)
    want = fn(fn(fn(fn(torch.ones(3), xs[0])[0], xs[1])[0], xs[2])[0], xs[3])[0]
    with xlanb.mode("eager"):
        c, ys = xlanb.scan(fn, torch.ones(3, device="xla"), xs.to("xla"))
    torch.testing.assert_close(c.cpu(), want)
    torch.testing.assert_close(ys[-1].cpu(), want)


def _ckpt_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.GELU(), nn.Linear(16, 8))


def test_torch_xla_checkpoint_matches_cpu_and_keeps_its_rules(txla):
    checkpoint = txla[2].checkpoint
    cpu = _ckpt_model().eval()  # no dropout: CPU and xla draw other masks
    x = torch.randn(4, 8, requires_grad=True)
    torch.utils.checkpoint.checkpoint(cpu, x, use_reentrant=True).pow(2).sum().backward()
    dev = copy.deepcopy(cpu).to("xla")
    xd = x.detach().to("xla").requires_grad_()
    out = checkpoint(dev, xd)
    out.pow(2).sum().backward()
    xlanb.sync()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, **TOL)
    for a, b in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, **TOL)
    with pytest.raises(ValueError, match="does not support use_reentrant==False"):
        checkpoint(dev, xd, use_reentrant=False)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: foo"):
        checkpoint(dev, xd, foo=1)


def test_checkpoint_replays_the_dropout_mask(txla):
    """With dropout on, the recomputed forward draws the mask it drew the first time
    (``preserve_rng_state``): the gradients are those of the model without checkpointing."""
    checkpoint = txla[2].checkpoint
    x = torch.randn(4, 8)
    grads = []
    for ckpt in (False, True):
        model = _ckpt_model().to("xla")
        xd = x.to("xla").requires_grad_()
        xlanb.manual_seed(7)
        out = checkpoint(model, xd) if ckpt else model(xd)
        out.pow(2).sum().backward()
        xlanb.sync()
        grads.append([xd.grad.cpu()] + [p.grad.cpu() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, **TOL)


class MlpBlock(nn.Module):
    """A transformer's MLP with its residual (GELU, 4x wide)."""

    def __init__(self, d: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))


def _ckpt_stack(d: int, n: int = 5):
    torch.manual_seed(0)
    return nn.ModuleList(MlpBlock(d) for _ in range(n))


def _ckpt_step(layers, x, checkpoint=None):
    """The first block as is, the others checkpointed (or not); the mean square's backward."""
    h = layers[0](x)
    for layer in layers[1:]:
        h = checkpoint(layer, h) if checkpoint else layer(h)
    loss = h.square().mean()
    loss.backward()
    return loss


def test_checkpoint_puts_the_recomputation_behind_a_barrier(txla):
    """The backward's recomputation reads its inputs through one optimization barrier
    per checkpointed block (as torch_xla's): without it XLA merges the recomputation
    with the forward and keeps every activation. Loss and gradients stay CPU torch's."""
    checkpoint = txla[2].checkpoint
    cpu = _ckpt_stack(8)
    x = torch.randn(4, 8)
    want = _ckpt_step(cpu, x).item()
    layers = copy.deepcopy(cpu).to("xla")
    loss = _ckpt_step(layers, x.to("xla"), checkpoint)
    ir = xlanb.pending_ir()
    assert ir.count("xlanb::optimization_barrier") == 4, ir[-2000:]
    assert loss.item() == pytest.approx(want, rel=1e-5)
    for a, b in zip(layers.parameters(), cpu.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, **GRAD_TOL)
    xlanb.sync()
    # What the barrier saves is measured by benchmarks/bench_checkpoint_memory.py (two
    # TPU compiles of a minute each: 69.7 MiB -> 20.9 MiB for 4 blocks on v5e:1x1)
    _ckpt_step(layers, x.to("xla"))  # the same model without checkpointing: no barrier
    assert "optimization_barrier" not in xlanb.pending_ir()
    xlanb.sync()


def test_fsdp_v1_is_refused_with_the_way_to_v2():
    compat.install(shadow=True)
    try:
        from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel, checkpoint_module
        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy  # noqa: F401
        with pytest.raises(NotImplementedError, match="SpmdFullyShardedDataParallel as FSDPv2"):
            XlaFullyShardedDataParallel(nn.Linear(2, 2))
        with pytest.raises(ImportError, match="FSDP v1 shards over per-replica processes"):
            import torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel  # noqa: F401
        m = checkpoint_module(nn.Linear(2, 2))
        assert m.forward.__func__ is not nn.Linear.forward  # a method, as FSDPv2 checks
        x = torch.randn(3, 2, requires_grad=True)
        m(x).sum().backward()
        assert m.weight.grad is not None
    finally:
        compat.uninstall()
