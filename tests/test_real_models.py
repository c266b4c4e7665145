"""Real models, as users run them, in every mode against CPU torch.

- BERT-style encoder and GPT-2-style decoder built from ``transformers`` configs (tiny,
  random init, no downloads), with attn_implementation "eager" and "sdpa": forward and
  a training step (loss, gradients, parameters after the step).
- A ResNet-style CNN written with torch.nn (no torchvision): eval forward and a
  training step with BatchNorm in training mode.
- Building blocks: nn.MultiheadAttention, F.scaled_dot_product_attention, embedding with
  padding_idx, layer norm, cross-entropy with ignore_index, clip_grad_norm_, and
  bfloat16 autocast on the device (or the clear error when autocast is unsupported).

Every test also checks that nothing ran on CPU torch (no ``aten::<op>`` counters).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import xlanb
from conftest import tiny_bert_config

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

TOL = dict(atol=1e-4, rtol=1e-4)
# After a training step: the update is lr * grad, compared with the same tolerance.
STEP_TOL = dict(atol=2e-4, rtol=2e-4)

transformers = pytest.importorskip("transformers")


def _fallbacks() -> dict:
    return {n: xlanb.metrics.counter_value(n) for n in xlanb.metrics.counter_names()
            if n.startswith("aten::")}


@pytest.fixture
def no_fallback():
    """Fails the test if any op ran on CPU torch."""
    xlanb.metrics.clear()
    yield
    assert _fallbacks() == {}, f"ops ran on CPU torch: {_fallbacks()}"


def _close(got, want, tol=TOL, msg=""):
    assert got.device.type == "xla", msg
    torch.testing.assert_close(got.detach().cpu(), want.detach(), **tol, msg=msg)


# ---------------------------------------------------------------------------------------
# transformers: BERT and GPT-2

def _bert(attn):
    cfg = tiny_bert_config(attn_implementation=attn)
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg)


def _gpt2(attn):
    cfg = transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation=attn)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def _text_batch(kind):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 99, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # a padded sequence
    if kind == "bert":
        labels = torch.full((2, 12), -100)  # MLM: only masked positions count
        labels[0, 3], labels[1, 5], labels[1, 7] = 11, 42, 7
        return dict(input_ids=ids, attention_mask=mask,
                    token_type_ids=torch.zeros_like(ids), labels=labels)
    labels = ids.clone()
    labels[1, 9:] = -100  # no loss on padding
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def _to(batch, device):
    return {k: v.to(device) for k, v in batch.items()}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_transformers_forward_and_training_step(kind, attn, mode, no_fallback):
    model_c = (_bert if kind == "bert" else _gpt2)(attn).train()
    model_x = copy.deepcopy(model_c).to("xla")
    batch = _text_batch(kind)

    out_c = model_c(**batch)
    out_x = model_x(**_to(batch, "xla"))
    _close(out_x.logits, out_c.logits, msg="logits")
    _close(out_x.loss, out_c.loss, msg="loss")

    opt_c = torch.optim.SGD(model_c.parameters(), lr=0.5)
    opt_x = torch.optim.SGD(model_x.parameters(), lr=0.5)
    out_c.loss.backward()
    out_x.loss.backward()
    opt_c.step()
    opt_x.step()
    xlanb.sync()
    for (name, px), (_, pc) in zip(model_x.named_parameters(), model_c.named_parameters()):
        if pc.grad is None:
            assert px.grad is None, name
            continue
        _close(px.grad, pc.grad, msg=f"grad {name}")
        _close(px, pc, STEP_TOL, msg=f"param {name}")
    # the step changed the loss the same way
    with torch.no_grad():
        _close(model_x(**_to(batch, "xla")).loss, model_c(**batch).loss, STEP_TOL, msg="loss 2")


def test_bert_tied_embeddings_stay_tied_on_device():
    model = _bert("sdpa").to("xla")
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


# ---------------------------------------------------------------------------------------
# A ResNet-style CNN

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.MaxPool2d(2))
        self.layers = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))


def _resnet():
    torch.manual_seed(0)
    return ResNet()


def _image_batch():
    g = torch.Generator().manual_seed(2)
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)


def test_resnet_forward_eval(mode, no_fallback):
    model_c = _resnet()
    with torch.no_grad():  # non-trivial running statistics
        for m in model_c.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
    model_c.eval()
    model_x = copy.deepcopy(model_c).to("xla").eval()
    x, _ = _image_batch()
    with torch.no_grad():
        _close(model_x(x.to("xla")), model_c(x))


def test_resnet_training_step(mode, no_fallback):
    model_c = _resnet().train()
    model_x = copy.deepcopy(model_c).to("xla")
    x, y = _image_batch()
    opt_c = torch.optim.SGD(model_c.parameters(), lr=0.1, momentum=0.9)
    opt_x = torch.optim.SGD(model_x.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        loss_c = F.cross_entropy(model_c(x), y)
        loss_x = F.cross_entropy(model_x(x.to("xla")), y.to("xla"))
        _close(loss_x, loss_c, STEP_TOL, msg=f"loss {step}")
        for opt, loss in ((opt_c, loss_c), (opt_x, loss_x)):
            opt.zero_grad()
            loss.backward()
            opt.step()
        xlanb.sync()
    for (name, vx), (_, vc) in zip(model_x.state_dict().items(), model_c.state_dict().items()):
        _close(vx, vc, STEP_TOL, msg=name)  # parameters, running stats, batch counts


# ---------------------------------------------------------------------------------------
# Building blocks

@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention(mode, no_fallback, need_weights):
    torch.manual_seed(0)
    mha_c = nn.MultiheadAttention(16, 4, batch_first=True)
    mha_x = copy.deepcopy(mha_c).to("xla")
    q, k = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    attn_mask = torch.triu(torch.ones(5, 7, dtype=torch.bool), diagonal=3)
    kw = dict(key_padding_mask=pad, attn_mask=attn_mask, need_weights=need_weights)
    out_c, w_c = mha_c(q, k, k, **kw)
    qx, kx = q.to("xla").requires_grad_(), k.to("xla")
    out_x, w_x = mha_x(qx, kx, kx, key_padding_mask=pad.to("xla"),
                       attn_mask=attn_mask.to("xla"), need_weights=need_weights)
    _close(out_x, out_c)
    if need_weights:
        _close(w_x, w_c)
    # backward through the attention
    qc = q.clone().requires_grad_()
    g_c, = torch.autograd.grad(mha_c(qc, k, k, **kw)[0].square().sum(), qc)
    g_x, = torch.autograd.grad(out_x.square().sum(), qx)
    _close(g_x, g_c)


def test_multihead_attention_eval_no_grad(mode, no_fallback):
    # eval + no_grad is where nn.MultiheadAttention takes its fast path when it can
    torch.manual_seed(0)
    mha_c = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    mha_x = copy.deepcopy(mha_c).to("xla").eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        out_c, _ = mha_c(x, x, x, need_weights=False)
        out_x, _ = mha_x(*(x.to("xla"),) * 3, need_weights=False)
    _close(out_x, out_c)


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask"])
def test_scaled_dot_product_attention(mode, no_fallback, case):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    kw = {}
    if case == "causal":
        k, v = k[:, :, :5], v[:, :, :5]
        kw["is_causal"] = True
    elif case == "bool_mask":
        kw["attn_mask"] = torch.rand(5, 7) > 0.3
        kw["attn_mask"][:, 0] = True  # no fully masked row
    elif case == "float_mask":
        kw["attn_mask"] = torch.randn(2, 1, 5, 7)
    ins_c = [t.clone().requires_grad_() for t in (q, k, v)]
    ins_x = [t.to("xla").requires_grad_() for t in (q, k, v)]
    kw_x = {n: (t.to("xla") if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    out_c = F.scaled_dot_product_attention(*ins_c, **kw)
    out_x = F.scaled_dot_product_attention(*ins_x, **kw_x)
    _close(out_x, out_c)
    grads_c = torch.autograd.grad(out_c.sin().sum(), ins_c)
    grads_x = torch.autograd.grad(out_x.sin().sum(), ins_x)
    for name, gx, gc in zip("qkv", grads_x, grads_c):
        _close(gx, gc, msg=f"d{name}")


def test_embedding_with_padding_idx(mode, no_fallback):
    torch.manual_seed(2)
    emb_c = nn.Embedding(10, 6, padding_idx=0)
    emb_x = copy.deepcopy(emb_c).to("xla")
    ids = torch.tensor([[0, 3, 3, 9], [1, 0, 2, 3]])
    out_c, out_x = emb_c(ids), emb_x(ids.to("xla"))
    _close(out_x, out_c)
    out_c.square().sum().backward()
    out_x.square().sum().backward()
    _close(emb_x.weight.grad, emb_c.weight.grad)
    assert emb_x.weight.grad[0].abs().sum().item() == 0  # the padding row gets no gradient


def test_layer_norm(mode, no_fallback):
    torch.manual_seed(3)
    ln_c = nn.LayerNorm([4, 6])
    with torch.no_grad():
        ln_c.weight.uniform_(0.5, 1.5)
        ln_c.bias.uniform_(-0.5, 0.5)
    ln_x = copy.deepcopy(ln_c).to("xla")
    x = torch.randn(3, 4, 6) * 3 + 1
    xc, xx = x.clone().requires_grad_(), x.to("xla").requires_grad_()
    out_c, out_x = ln_c(xc), ln_x(xx)
    _close(out_x, out_c)
    (out_c * torch.arange(6.0)).sum().backward()
    (out_x * torch.arange(6.0).to("xla")).sum().backward()
    _close(xx.grad, xc.grad)
    _close(ln_x.weight.grad, ln_c.weight.grad)
    _close(ln_x.bias.grad, ln_c.bias.grad)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_ignore_index(mode, no_fallback, reduction):
    torch.manual_seed(4)
    logits = torch.randn(6, 5)
    target = torch.tensor([1, -100, 4, 0, -100, 2])
    weight = torch.rand(5) + 0.5
    kw = dict(ignore_index=-100, reduction=reduction, weight=weight, label_smoothing=0.1)
    lc, lx = logits.clone().requires_grad_(), logits.to("xla").requires_grad_()
    loss_c = F.cross_entropy(lc, target, **kw)
    loss_x = F.cross_entropy(lx, target.to("xla"), **{**kw, "weight": weight.to("xla")})
    _close(loss_x, loss_c)
    loss_c.sum().backward()
    loss_x.sum().backward()
    _close(lx.grad, lc.grad)
    assert lx.grad[1].abs().sum().item() == 0  # ignored rows get no gradient
    # a 3-d (sequence) target, as language models use it
    seq = torch.randn(2, 5, 4)
    tgt = torch.tensor([[1, 2, -100, 0], [-100, -100, 4, 3]])
    _close(F.cross_entropy(seq.to("xla"), tgt.to("xla"), ignore_index=-100),
           F.cross_entropy(seq, tgt, ignore_index=-100))


@pytest.mark.parametrize("foreach", [False, True])
def test_clip_grad_norm(mode, no_fallback, foreach):
    torch.manual_seed(5)
    model_c = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    model_x = copy.deepcopy(model_c).to("xla")
    x = torch.randn(4, 8)
    (model_c(x) * 10).square().sum().backward()
    (model_x(x.to("xla")) * 10).square().sum().backward()
    norm_c = nn.utils.clip_grad_norm_(model_c.parameters(), max_norm=1.0, foreach=foreach)
    norm_x = nn.utils.clip_grad_norm_(model_x.parameters(), max_norm=1.0, foreach=foreach)
    _close(norm_x, norm_c)
    assert norm_c.item() > 1.0  # the clip did something
    for (name, px), (_, pc) in zip(model_x.named_parameters(), model_c.named_parameters()):
        _close(px.grad, pc.grad, msg=name)
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model_x.parameters()]))
    assert abs(total.item() - 1.0) < 1e-4


# ---------------------------------------------------------------------------------------
# Mixed precision

def _autocast_supported() -> bool:
    try:
        with torch.autocast(device_type="xla", dtype=torch.bfloat16):
            pass
    except Exception:
        return False
    return True


def test_bfloat16_autocast(mode, no_fallback):
    torch.manual_seed(6)
    model_c = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    model_x = copy.deepcopy(model_c).to("xla")
    x = torch.randn(4, 16)
    if not _autocast_supported():
        # Unsupported: a clear error that names the device and autocast/AMP, not a crash
        # or a silent float32 computation.
        with pytest.raises((RuntimeError, AssertionError)) as info:
            with torch.autocast(device_type="xla", dtype=torch.bfloat16):
                model_x(x.to("xla"))
        text = str(info.value)
        assert "xla" in text and ("AMP" in text or "autocast" in text.lower()), text
        return
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        want = model_c(x)
    with torch.autocast(device_type="xla", dtype=torch.bfloat16):
        got = model_x(x.to("xla"))
        # float32-policy ops run in float32 even on bfloat16 inputs (CUDA's lists)
        assert torch.softmax(got, -1).dtype == torch.float32
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float().cpu(), want.float(), atol=2e-2, rtol=2e-2)
    # the backward runs through the casts; parameters and their gradients stay float32
    want.float().square().sum().backward()
    got.float().square().sum().backward()
    for (name, px), (_, pc) in zip(model_x.named_parameters(), model_c.named_parameters()):
        assert px.dtype == px.grad.dtype == torch.float32, name
        torch.testing.assert_close(px.grad.cpu(), pc.grad, atol=5e-2, rtol=5e-2, msg=name)


def test_explicit_bfloat16_model(mode, no_fallback):
    # Without autocast: a model cast to bfloat16, the other way to train in low precision.
    torch.manual_seed(7)
    model_c = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32),
                            nn.Linear(32, 4)).to(torch.bfloat16)
    model_x = copy.deepcopy(model_c).to("xla")
    x = torch.randn(4, 16).to(torch.bfloat16)
    out_c, out_x = model_c(x), model_x(x.to("xla"))
    assert out_x.dtype == torch.bfloat16
    torch.testing.assert_close(out_x.float().cpu(), out_c.float(), atol=3e-2, rtol=3e-2)
    out_c.float().square().sum().backward()
    out_x.float().square().sum().backward()
    for (name, px), (_, pc) in zip(model_x.named_parameters(), model_c.named_parameters()):
        assert px.grad.dtype == torch.bfloat16, name
        torch.testing.assert_close(px.grad.float().cpu(), pc.grad.float(), atol=5e-2, rtol=5e-2,
                                   msg=name)
