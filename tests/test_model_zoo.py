"""Architectures from transformers, in every mode, against CPU torch (issue 58).

``tools/model_zoo.py`` builds each: a tiny model of its config class (hidden size 32, one
or two layers, random weights, every dropout at 0) in training mode, and a batch. A
training step (forward with labels, backward, one sync) on xla is compared with CPU
torch's from the same weights: the loss and every parameter's gradient. The same step
again compiles nothing. Also: ``generate`` gives CPU torch's tokens, and
``torch.compile(model, backend="xlanb")`` CPU torch's loss and gradients.

Quick tier: ``QUICK`` in lazy and eager mode, one LM's ``generate`` (lazy), one compiled
model.
``slow``: the rest (21 architectures in every mode, ``LAZY_ONLY``'s ten in lazy mode).
``python -m tools.model_zoo`` measures the same models' compiles and syncs per step (docs/op-coverage.md).
"""
from __future__ import annotations

import copy

import pytest
import torch

import xlanb

transformers = pytest.importorskip("transformers")

from tools import model_zoo as zoo  # noqa: E402  (needs transformers)

# A dense decoder, an MoE (grouped_mm), an encoder, a CNN with BatchNorm
QUICK = ("llama", "mixtral", "bert", "resnet")
# Measured by tools/model_zoo.py, not tested: 41 graphs compile in each step (routing
# decides the shapes), minutes of compiles for nothing more than mixtral's values.
NOT_TESTED = ("mixtral_eager_experts",)
# Near relatives of architectures tested in every mode (same family, same attention and
# MLP ops at other sizes): lazy mode only, which runs each one's whole step as a graph.
# Eager and op-by-op mode, for 21 architectures, already cover every family; these ten in
# two more modes cost CI about three minutes for no op the others lack.
LAZY_ONLY = ("mistral", "qwen3", "gemma", "gpt_neox", "opt", "mixtral_batched_mm",
             "roberta", "electra", "marian", "convnext")


def _modes(name):
    return ("lazy",) if name in LAZY_ONLY else xlanb.MODES


def _params(names, modes, quick_names=(), quick_modes=("lazy", "eager")):
    for name in names:
        for mode in modes(name) if callable(modes) else modes:
            quick = name in quick_names and mode in quick_modes
            yield pytest.param(name, mode, id=f"{name}-{mode}",
                               marks=() if quick else pytest.mark.slow)


def _cpu_ops() -> set:
    return {n for n in xlanb.metrics.counter_names() if n.startswith("aten::")}


def _grads_match(model, cpu, record_property) -> None:
    """Every parameter's gradient on xla is CPU torch's (None where CPU torch's is)."""
    got = zoo.grads(model)
    errors = {}
    for name, want in zoo.grads(cpu).items():
        assert (got[name] is None) == (want is None), f"grad of {name}: {got[name]} vs {want}"
        if want is not None:
            assert got[name].device.type == "xla", name
            errors[name] = zoo.worst_error(got[name], want, *zoo.GRAD_TOL)
    worst = max(errors, key=errors.get)
    record_property("worst_grad", f"{worst}: {errors[worst]:.3f} of the tolerance")
    bad = sorted(((e, n) for n, e in errors.items() if e > 1), reverse=True)
    assert not bad, ("gradients off CPU torch, |xla - cpu| / (atol + rtol |cpu|) > 1 "
                     f"(atol, rtol = {zoo.GRAD_TOL}): {bad[:8]}")


@pytest.mark.parametrize("name,mode", list(_params(
    [a.name for a in zoo.ZOO if a.name not in NOT_TESTED], _modes, QUICK)))
def test_training_step_matches_cpu(name, mode, same, count, record_property):
    arch = zoo.BY_NAME[name]
    xlanb.set_mode(mode)
    cpu, model = zoo.pair(arch)
    batch = arch.batch()
    xb = zoo.to(batch, "xla")
    loss_c = zoo.train_step(cpu, batch)
    loss_x = zoo.train_step(model, xb)
    xlanb.sync()  # the step's one sync, as in a training loop
    same(loss_x.detach(), loss_c.detach(), atol=zoo.LOSS_TOL[0], rtol=zoo.LOSS_TOL[1])
    _grads_match(model, cpu, record_property)
    # no op ran on CPU torch, but those the architecture lists, each with its reason
    assert _cpu_ops() == set(arch.cpu_ops), {op: zoo.CPU_OPS.get(op) for op in _cpu_ops()}

    # The same step again: lazy mode finds every graph, op-by-op mode every op's
    # executable. (Eager mode may compile again at steps 2-3: ops seen three times get
    # executables of their own, which changes the runs that compile together.)
    model.zero_grad(set_to_none=True)
    xlanb.metrics.clear()
    again = zoo.train_step(model, xb)
    xlanb.sync()
    new = {"lazy": "UncachedCompile", "opbyop": "OpCompile"}.get(mode)
    if new:
        assert count(new) == 0, xlanb.metrics.short_report()
    same(again.detach(), loss_c.detach(), atol=zoo.LOSS_TOL[0], rtol=zoo.LOSS_TOL[1])


# Three decoder LMs whose greedy choices are clear (see the margin below)
GENERATE = ("llama", "qwen2", "phi")


# (every mode for llama; lazy, the default, for the other two)
@pytest.mark.parametrize("name,mode", list(_params(
    GENERATE, lambda n: xlanb.MODES if n == "llama" else ("lazy",), ("llama",), ("lazy",))))
def test_generate_gives_cpu_tokens(name, mode):
    arch = zoo.BY_NAME[name]
    xlanb.set_mode(mode)
    cpu = arch.model().eval()
    model = copy.deepcopy(cpu).to("xla")
    prompt = torch.randint(3, zoo.VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = cpu.generate(prompt, **kw)
        # Equal tokens mean something only where the top two logits are further apart
        # than float32's disagreements between backends (about 1e-6 here)
        top2 = cpu(want).logits[:, prompt.shape[1] - 1:-1].topk(2, -1).values
        assert (top2[..., 0] - top2[..., 1]).min() > 1e-4
        got = model.generate(prompt.to("xla"), **kw)
    assert got.device.type == "xla"
    assert got.cpu().tolist() == want.tolist()
    assert not _cpu_ops()


COMPILED = ("bert", "llama", "vit")


@pytest.fixture
def fresh_dynamo():
    import torch._dynamo
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "bert" else pytest.mark.slow)
                                  for n in COMPILED])
def test_torch_compile_matches_cpu(name, fresh_dynamo, same, record_property):
    from torch._dynamo.utils import counters
    arch = zoo.BY_NAME[name]
    xlanb.set_mode("lazy")
    cpu, model = zoo.pair(arch)
    batch = arch.batch()
    counters.clear()
    compiled = torch.compile(model, backend="xlanb")
    loss_c = zoo.train_step(cpu, batch)
    loss_x = zoo.train_step(compiled, zoo.to(batch, "xla"))
    xlanb.sync()
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo captured the model
    same(loss_x.detach(), loss_c.detach(), atol=zoo.LOSS_TOL[0], rtol=zoo.LOSS_TOL[1])
    _grads_match(model, cpu, record_property)
    assert not _cpu_ops()
