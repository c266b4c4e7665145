"""Repeated layers compiled once (graph/repeats.py, executables/stages.py; issue 36).

Each test runs the same step with the layers lowered as one ``lax.scan`` and unrolled
(``xlanb.config.scan_layers``, ``XLANB_SCAN_LAYERS``), from the same seed, and compares
the values: forward and backward, updated parameters and buffers. Small models (2-4
layers, narrow) keep the compiles short.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import xlanb
from xlanb.base.config import Config, SettingError
from xlanb.execute.graphs import clear_graph_cache

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

# Measured difference between the scanned and unrolled graphs (XLA:CPU, float32): none
# seen on these models; the bound allows for XLA fusing a loop body differently.
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _restore_scan():
    was = xlanb.config.scan_layers
    yield
    xlanb.config.scan_layers = was
    clear_graph_cache()


def _both(make, step):
    """``step(*make())`` with the layers scanned and unrolled: per setting, the CPU
    values it returns and the repeated-layer lines of the graph it compiled last."""
    out = {}
    # Both at XLA's optimized tier, where the two agree to 1e-6. At the quick tier (LLVM
    # -O0) the ResNet-like stack's loop and its unrolled twin differed by 2e-6 on one
    # element of 5e-3 (of 576): rounding, not the loop (the cause was not traced further).
    quick = xlanb.config.quick_compiles
    xlanb.config.quick_compiles = False
    try:
        for scan in (True, False):
            out[scan] = _run_once(make, step, scan)
    finally:
        xlanb.config.quick_compiles = quick
    # (float32 rounding of a loop against its unrolled twin depends on the CPU: on an AMD
    # EPYC the optimized tiers differed by 1.5e-6 on 2 of 576 gradient elements)
    for a, b in zip(out[True][0], out[False][0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert out[False][1] == []
    return out[True][1], out[True][2]


def _run_once(make, step, scan):
    xlanb.config.scan_layers = scan
    clear_graph_cache()
    torch.manual_seed(0)
    args = make()
    xlanb.sync()
    vals = step(*args)
    xlanb.sync()
    graphs = xlanb.graphs()
    if scan:
        _both.table = str(graphs)
    return ([v.detach().cpu() for v in vals], graphs[-1].repeats if graphs else [],
            graphs[-1] if graphs else None)


def _train_step(model, x, *extra, loss_fn=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = model(x, *extra)
    loss = loss_fn(out) if loss_fn else out.float().pow(2).mean()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    opt.step()
    return [loss, out] + grads + [p for p in model.parameters()] + list(model.buffers())


def test_bert_forward_backward():
    transformers = pytest.importorskip("transformers")

    def make():
        cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=50,
                                      max_position_embeddings=16, attn_implementation="eager")
        model = transformers.BertForSequenceClassification(cfg).to("xla")  # dropout on
        ids = torch.randint(0, 50, (2, 8)).to("xla")
        labels = torch.randint(0, 2, (2,)).to("xla")
        return model, ids, labels

    def step(model, ids, labels):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        return [loss] + [p.grad for p in model.parameters()]

    lines, g = _both(make, step)
    assert any(line.startswith("2 × bert.encoder.layer compiled once (scan")
               for line in lines), lines
    assert any(line.startswith("2 × bert.encoder.layer backward compiled once")
               for line in lines), lines
    assert "2×bert.encoder.layer fwd+bwd" in _both.table
    # the loop body's instructions still name the aten op, the layer's scope and line
    hlo = g.hlo(dialect="hlo")
    assert "while" in hlo
    assert "encoder/layer/0/attention/self/query/aten::addmm" in hlo


def test_optimizer_updates_are_one_loop():
    """AdamW's per-parameter updates of the layers (from the user's ``step()`` line) are
    a third loop, with no carry: parameters, gradients and both moments stacked."""
    transformers = pytest.importorskip("transformers")

    def make():
        cfg = transformers.BertConfig(num_hidden_layers=3, hidden_size=32, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=50,
                                      max_position_embeddings=16, attn_implementation="eager")
        model = transformers.BertForSequenceClassification(cfg).to("xla")
        # eps 1e-6, not 1e-8: a weight whose first gradient is near zero (-3.26e-9 looped,
        # -3.22e-9 unrolled: rounding; a dropout mask decides which weight) takes
        # lr * g / (|g| + eps) as its first step, so at AdamW's default eps the two
        # ended 2.7e-6 apart
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
        ids = torch.randint(0, 50, (2, 8)).to("xla")
        labels = torch.randint(0, 2, (2,)).to("xla")
        return model, opt, ids, labels

    def step(model, opt, ids, labels):
        losses = []
        for _ in range(2):  # the second step reads the moments the first one wrote
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss)
            xlanb.sync()
        moments = [v for st in opt.state.values() for k, v in st.items() if k != "step"]
        return losses + list(model.parameters()) + moments

    lines, _ = _both(make, step)
    assert any(line.startswith("3 × bert.encoder.layer update compiled once (scan, layers 0–2)")
               for line in lines), lines
    assert "3×bert.encoder.layer fwd+bwd+upd" in _both.table


def test_transformer_encoder():
    def make():
        layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0,
                                           batch_first=True)
        model = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False).to("xla")
        return model, torch.randn(2, 5, 16).to("xla")

    lines, _ = _both(make, _train_step)
    assert any(line.startswith("3 × layers compiled once") for line in lines), lines
    # the first layer's backward computes no gradient for the input (it needs none): it
    # differs from the others and stays unrolled
    assert any(line.startswith("2 × layers backward compiled once (scan, layers 1–2)")
               for line in lines), lines
    assert any(line.startswith("unrolled: layers.0 backward: differs from layers.1")
               for line in lines), lines


def _on_cpu(make, step, got):
    """``step(*make())`` on CPU torch from the same seed; its values equal ``got``'s."""
    torch.manual_seed(0)
    args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in make()]
    args = [a.to("cpu") if isinstance(a, nn.Module) else a for a in args]
    for a, b in zip(step(*args), got):
        torch.testing.assert_close(b, a.detach(), rtol=1e-4, atol=1e-5)


class _PreLN(nn.Module):
    """A plain pre-LN residual block: its gradient is the one from the layer after plus
    its own, and that sum is the value its backward hands the layer before."""
    def __init__(self, d: int):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.ln(x)))


class _PreLNStack(nn.Module):
    def __init__(self, d: int, n: int):
        super().__init__()
        self.layers = nn.ModuleList(_PreLN(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("model", ["hand-written", "TransformerEncoder"])
def test_pre_ln_blocks_loop_backward_and_update(model):
    """Issue 46 item 16: a pre-LN block's backward alternated 13 and 15 ops per layer
    (its residual gradient sum went to no layer), and the updates of a pre-LN
    TransformerEncoder read the gradients of two layers (a bias's gradient, read straight
    from the gradient the layer after hands on, went to that layer): no loops."""
    def make():
        if model == "hand-written":
            return _PreLNStack(8, 4).to("xla"), torch.randn(3, 8).to("xla")
        layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0,
                                           batch_first=True, norm_first=True)
        return (nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).to("xla"),
                torch.randn(2, 5, 16).to("xla"))

    vals, lines, _ = _run_once(make, _train_step, scan=True)
    _on_cpu(make, _train_step, vals)
    assert any(line.startswith("4 × layers compiled once") for line in lines), lines
    # the first layer's backward computes no gradient for the model's input
    assert any(line.startswith("3 × layers backward compiled once (scan, layers 1–3)")
               for line in lines), lines
    assert any(line.startswith("4 × layers update compiled once (scan, layers 0–3)")
               for line in lines), lines


class _Block(nn.Module):
    def __init__(self, c: int, hidden: int | None = None):
        super().__init__()
        h = hidden or c
        self.conv1 = nn.Conv2d(c, h, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(h)
        self.conv2 = nn.Conv2d(h, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = x + self.bn2(self.conv2(y))
        return torch.relu(y)


class _Stack(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return x


def test_resnet_like_stack_with_batchnorm_buffers():
    def make():
        return _Stack([_Block(8) for _ in range(3)]).to("xla"), torch.randn(2, 3, 6, 6).to("xla")

    lines, _ = _both(make, _train_step)
    assert any(line.startswith("3 × blocks compiled once") for line in lines), lines
    assert any(line.startswith("3 × blocks backward compiled once") for line in lines), lines


class _DropBlock(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.drop(self.fc2(torch.tanh(self.fc1(x))))


class _MLP(nn.Module):
    def __init__(self, hiddens, d: int = 8):
        super().__init__()
        self.layers = nn.ModuleList(_DropBlock(d, h) for h in hiddens)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_dropout_keeps_a_key_per_layer_under_a_fixed_seed():
    def make():
        return _MLP([16] * 4).to("xla"), torch.randn(4, 8).to("xla")

    lines, _ = _both(make, _train_step)
    assert any(line.startswith("4 × layers compiled once") for line in lines), lines
    # the same seed gives the same values in eager mode, where nothing is scanned
    torch.manual_seed(0)
    model, x = make()
    with xlanb.mode("eager"):
        eager = model(x)
    xlanb.config.scan_layers = True
    clear_graph_cache()
    torch.manual_seed(0)
    model, x = make()
    torch.testing.assert_close(model(x).cpu(), eager.cpu(), **TOL)


def test_a_layer_that_differs_stays_unrolled_with_the_reason():
    def make():
        return _MLP([16, 16, 16, 24, 16, 16]).to("xla").eval(), torch.randn(4, 8).to("xla")

    lines, _ = _both(make, _train_step)
    assert any(line.startswith("3 × layers compiled once (scan, layers 0–2)") for line in lines), lines
    assert any(line.startswith("2 × layers compiled once (scan, layers 4–5)") for line in lines), lines
    why = [line for line in lines if line.startswith("unrolled: layers.3: differs from layers.2")]
    assert why and "aten::t (8x24)" in why[0] and "(8x16)" in why[0], lines
    assert "layers: unrolled: layers.3" in _both.table


def test_views_and_inplace_inside_layers():
    class Inplace(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            y = self.fc(x).view(2, 3, 6).transpose(0, 1)
            y.mul_(0.5).add_(1.0)
            return x + y.transpose(0, 1).reshape(6, 6).relu_()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Inplace() for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    lines, _ = _both(lambda: (Net().to("xla"), torch.randn(6, 6).to("xla")), _train_step)
    assert any(line.startswith("3 × layers compiled once") for line in lines), lines


def test_compile_replays_keep_working():
    def make():
        return _MLP([16] * 3).to("xla").eval(), torch.randn(4, 8).to("xla")

    def step(model, x):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        @xlanb.compile
        def train(x):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        return [train(x) for _ in range(4)] + list(model.parameters())

    lines, _ = _both(make, step)
    assert any(line.startswith("3 × layers compiled once") for line in lines), lines


def test_the_setting():
    assert xlanb.config.scan_layers in (True, False, "auto")
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("XLANB_SCAN_LAYERS", "0")
        assert Config().scan_layers is False
        mp.setenv("XLANB_SCAN_LAYERS", "auto")
        assert Config().scan_layers == "auto"
        mp.delenv("XLANB_SCAN_LAYERS")
        assert Config().scan_layers == "auto"
        mp.setenv("XLANB_SCAN_LAYERS", "sometimes")
        with pytest.raises(SettingError, match="XLANB_SCAN_LAYERS"):
            Config()
    finally:
        mp.undo()


def test_auto_loops_a_tpu_compile_of_many_layers_only():
    """``"auto"`` (the default): the CPU's own graph stays unrolled; a TPU target's
    compile loops a run of AUTO_MIN_LAYERS or more, and its report says so."""
    pytest.importorskip("libtpu")
    from xlanb.executables.stages import AUTO_MIN_LAYERS
    xlanb.config.scan_layers = "auto"
    clear_graph_cache()
    torch.manual_seed(0)
    model, x = _MLP([16] * AUTO_MIN_LAYERS).to("xla").eval(), torch.randn(4, 8).to("xla")
    xlanb.sync()
    y = model(x).sum()
    report = xlanb.compile_for("v5e:1x1", y)
    assert report.fits, report
    note = next(n for n in report.notes if n.startswith("repeated layers compiled once each"))
    assert f"{AUTO_MIN_LAYERS} × layers" in note
    assert "while" in report.hlo()
    got = float(y.detach())
    with torch.no_grad():
        ref = float(model.cpu()(x.cpu()).sum())
    assert abs(got - ref) < 1e-4 * max(1.0, abs(ref))
    assert xlanb.graphs()[-1].repeats == []  # the CPU ran it unrolled
    # fewer layers than that: unrolled for the TPU too
    short = _MLP([16] * (AUTO_MIN_LAYERS - 1)).to("xla").eval()
    report = xlanb.compile_for("v5e:1x1", short(x).sum())
    assert not any(n.startswith("repeated layers") for n in report.notes)
    assert "while" not in report.hlo()


def test_pending_ir_folds_repeated_layers():
    """The pending-IR text shows each run of identical layers once: the first layer's
    ops, then one line for the rest; the values keep their numbers. Nothing runs."""
    torch.manual_seed(0)
    model, x = _MLP([16] * 4).to("xla").eval(), torch.randn(4, 8).to("xla")
    xlanb.sync()
    y = model(x).sum()
    full = xlanb.pending_ir()
    folded = xlanb.pending_ir(fold=True)
    per_layer = sum(1 for line in full.splitlines() if "[_MLP.layers.1" in line)
    assert per_layer > 0 and "more layers" not in full
    assert f"# layers 1–3: 3 more layers, the same {per_layer} ops as layer 0, folded " \
           f"({3 * per_layer} ops)" in folded
    # the folded layers' weights fold with them (issue 46: 48 device_data lines stayed)
    inputs = sum(1 for line in full.splitlines() if line.endswith("device_data"))
    assert "# 12 inputs that only the folded layers read (device_data), folded" in folded
    assert sum(1 for line in folded.splitlines() if line.endswith("device_data")) == inputs - 12
    assert "[_MLP.layers.0" in folded and "[_MLP.layers.2" not in folded
    assert folded.splitlines()[-1] == full.splitlines()[-1]  # the outputs' numbers
    assert xlanb.pending_ir() == full and xlanb.pending_count() > 0
    torch.testing.assert_close(y.cpu(), model.cpu()(x.cpu()).sum(), **TOL)
