"""Models in every mode against CPU torch: forward passes, a full training step with
AdamW, and three training steps whose losses agree across CPU and all three modes."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import xlanb

TOL = dict(atol=1e-4, rtol=1e-4)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 16), nn.Tanh(),
                         nn.Linear(16, 5))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        # No conv biases before BatchNorm: their gradient is ~0 (BN removes the mean), so
        # an Adam step on them would amplify float noise and nothing could be compared.
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 8, 3, stride=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 8, 1)  # with a bias
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 3 * 3, 4)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))      # 10x10 -> 5x5
        x = torch.relu(self.bn2(self.conv2(x)))                 # 5x5 -> 3x3
        x = self.drop(torch.relu(self.conv3(x)))
        return self.fc(x.flatten(1))


def cnn():
    torch.manual_seed(0)
    return SmallCNN()


def cnn_train():
    """Training mode for BatchNorm; dropout stays off (its masks are random: CPU torch and
    the device draw different ones)."""
    model = cnn().train()
    model.drop.eval()
    return model


def cnn_input():
    torch.manual_seed(1)
    return torch.randn(2, 3, 10, 10)  # conv1 10x10 -> pool 5x5 -> conv2 3x3


def transformer():
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.1,
                                      batch_first=True)


def _compare_state(model_x, model_c, **tol):
    for (name, px), (_, pc) in zip(model_x.state_dict().items(), model_c.state_dict().items()):
        assert px.device.type == "xla", name
        got = px.cpu()
        assert got.dtype == pc.dtype, name
        torch.testing.assert_close(got, pc, **tol, msg=name)


# ---------------------------------------------------------------------------------------
# Forward passes

def test_mlp_forward(mode, same):
    model = mlp()
    x = torch.randn(7, 12)
    want = model(x)
    got = copy.deepcopy(model).to("xla")(x.to("xla"))
    same(got, want.detach(), **TOL)


def test_cnn_forward_eval(mode, same):
    model = cnn()
    # non-trivial running stats so that eval BatchNorm does something
    with torch.no_grad():
        model.bn1.running_mean.uniform_(-0.5, 0.5)
        model.bn1.running_var.uniform_(0.5, 2.0)
        model.bn2.running_mean.uniform_(-0.5, 0.5)
        model.bn2.running_var.uniform_(0.5, 2.0)
    model.eval()
    x = cnn_input()
    want = model(x)
    mx = copy.deepcopy(model).to("xla").eval()
    got = mx(x.to("xla"))
    same(got, want.detach(), **TOL)
    # Twice: eval dropout is the identity, so the result is the same again.
    same(mx(x.to("xla")), want.detach(), **TOL)


@pytest.mark.versions
def test_transformer_encoder_layer_forward(mode, same):
    model = transformer().eval()
    torch.manual_seed(2)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = model(x)
        got = copy.deepcopy(model).to("xla").eval()(x.to("xla"))
    same(got, want, **TOL)


def test_transformer_encoder_layer_forward_with_mask(mode, same):
    model = transformer().eval()
    torch.manual_seed(3)
    x = torch.randn(2, 4, 16)
    pad = torch.tensor([[False, False, False, True], [False, False, False, False]])
    with torch.no_grad():
        want = model(x, src_key_padding_mask=pad)
        got = copy.deepcopy(model).to("xla").eval()(x.to("xla"),
                                                     src_key_padding_mask=pad.to("xla"))
    same(got, want, **TOL)


# ---------------------------------------------------------------------------------------
# Training

def _train_step(model, opt, x, y, loss_fn):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _mlp_batch():
    torch.manual_seed(5)
    return torch.randn(8, 12), torch.randint(0, 5, (8,))


def _cnn_batch():
    torch.manual_seed(6)
    return cnn_input(), torch.randint(0, 4, (2,))


@pytest.mark.parametrize("which", ["mlp", "cnn"])
def test_forward_backward_adamw_step(mode, which):
    model_c = mlp() if which == "mlp" else cnn_train()
    x, y = _mlp_batch() if which == "mlp" else _cnn_batch()
    model_x = copy.deepcopy(model_c).to("xla")
    loss_fn = nn.CrossEntropyLoss()
    opt_c = torch.optim.AdamW(model_c.parameters(), lr=1e-3, weight_decay=0.01)
    opt_x = torch.optim.AdamW(model_x.parameters(), lr=1e-3, weight_decay=0.01)

    loss_c = _train_step(model_c, opt_c, x, y, loss_fn)
    loss_x = _train_step(model_x, opt_x, x.to("xla"), y.to("xla"), loss_fn)
    assert loss_x.device.type == "xla"
    torch.testing.assert_close(loss_x.detach().cpu(), loss_c.detach(), **TOL)
    # gradients, parameters after the step, and (CNN) BatchNorm running stats
    for (name, px), (_, pc) in zip(model_x.named_parameters(), model_c.named_parameters()):
        assert px.grad is not None and px.grad.device.type == "xla", name
        torch.testing.assert_close(px.grad.cpu(), pc.grad, **TOL, msg=f"grad {name}")
    _compare_state(model_x, model_c, **TOL)
    # and the optimizer state
    for px, pc in zip(model_x.parameters(), model_c.parameters()):
        sx, sc = opt_x.state[px], opt_c.state[pc]
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sx[key].cpu(), sc[key], **TOL, msg=key)


def _three_step_losses(device, which):
    model = mlp() if which == "mlp" else cnn_train()
    x, y = _mlp_batch() if which == "mlp" else _cnn_batch()
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for _ in range(3):
        losses.append(_train_step(model, opt, x, y, loss_fn).detach())
        if device == "xla":
            xlanb.sync()
    return [float(v.item()) for v in losses], {k: v.cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("which", [pytest.param("mlp", marks=pytest.mark.versions), "cnn"])
def test_three_training_steps_same_losses_in_all_modes(which):
    cpu_losses, cpu_state = _three_step_losses("cpu", which)
    assert cpu_losses[2] < cpu_losses[0]  # it trains
    per_mode = {}
    for m in xlanb.MODES:
        with xlanb.mode(m):
            per_mode[m] = _three_step_losses("xla", which)
    for m, (losses, state) in per_mode.items():
        assert losses == pytest.approx(cpu_losses, rel=1e-4, abs=1e-4), m
        for k in cpu_state:
            torch.testing.assert_close(state[k], cpu_state[k], **TOL, msg=f"{m} {k}")
    # modes agree with each other at least as tightly as with CPU
    for m in ("eager", "opbyop"):
        assert per_mode[m][0] == pytest.approx(per_mode["lazy"][0], rel=1e-5, abs=1e-5), m


@pytest.mark.parametrize("use_output", [True, False])
def test_batchnorm_train_updates_running_stats(mode, use_output):
    # Training-mode BatchNorm writes its running stats even when nobody reads its output.
    torch.manual_seed(0)
    bn_c = nn.BatchNorm2d(3).train()
    bn_x = copy.deepcopy(bn_c).to("xla")
    x = torch.randn(4, 3, 5, 5) * 2 + 1
    with torch.no_grad():
        out_c = bn_c(x)
        out_x = bn_x(x.to("xla"))
    if use_output:
        torch.testing.assert_close(out_x.cpu(), out_c, **TOL)
    del out_x
    xlanb.sync()
    torch.testing.assert_close(bn_x.running_mean.cpu(), bn_c.running_mean, **TOL)
    torch.testing.assert_close(bn_x.running_var.cpu(), bn_c.running_var, **TOL)
    assert bn_x.num_batches_tracked.item() == 1


def test_dropout_train_mode_is_random_but_scaled(mode):
    torch.manual_seed(11)
    x = torch.ones(64, 64, device="xla")
    y = nn.functional.dropout(x, p=0.5, training=True).cpu()
    vals = set(y.unique().tolist())
    assert vals <= {0.0, 2.0} and vals == {0.0, 2.0}
    assert 0.4 < (y == 0).float().mean().item() < 0.6
