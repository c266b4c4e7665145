"""torch.compile(fn, backend="xlanb"): dynamo's graphs on the xla device, against CPU torch."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import xlanb
from xlanb import metrics


@pytest.fixture(autouse=True)
def _lazy_and_fresh_dynamo():
    import torch._dynamo
    xlanb.set_mode("lazy")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def c(name: str) -> int:
    return metrics.counter_value(name) or 0


def test_backend_is_found_by_name_through_the_entry_point():
    from torch._dynamo.backends.registry import lookup_backend
    from xlanb.capture.dynamo import xlanb_backend
    assert lookup_backend("xlanb") is xlanb_backend


def test_function_matches_cpu_and_recompiles_for_a_new_shape():
    def f(x, y):
        return (x @ y).relu().sum(0)
    cf = torch.compile(f, backend="xlanb")
    torch.manual_seed(0)
    for shape in [(4, 6), (4, 6), (7, 3), (9, 2)]:
        x, y = torch.randn(shape), torch.randn(shape[1], 5)
        out = cf(x.to("xla"), y.to("xla"))
        assert out.device.type == "xla" and out.dtype == torch.float32
        torch.testing.assert_close(out.cpu(), f(x, y))


def _compiled_pair(*layers):
    """A seeded CPU model, its copy on xla, and that copy under torch.compile."""
    torch.manual_seed(0)
    cpu = nn.Sequential(*layers)
    model = copy.deepcopy(cpu).to("xla")
    return cpu, model, torch.compile(model, backend="xlanb")


def test_inference_replays_the_executable():
    cpu, model, cm = _compiled_pair(nn.Linear(8, 19), nn.ReLU(), nn.Linear(19, 4))
    x = torch.randn(3, 8)
    metrics.clear()
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(cm(x.to("xla")).cpu(), cpu(x))
    # traced twice (they agree), then replayed without running the graph's Python
    assert c("CompiledReplay") == 2, metrics.short_report()
    assert c("UncachedCompile") == 1, metrics.short_report()
    assert any(g.cause.startswith("xlanb.compile(torch.compile graph") for g in xlanb.graphs())


def test_training_gradients_match_cpu_and_scope_names_the_model():
    cpu, model, cm = _compiled_pair(nn.Linear(8, 21), nn.Tanh(), nn.Linear(21, 3))
    x = torch.randn(5, 8)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        cpu.zero_grad(set_to_none=True)
        loss = cm(x.to("xla")).square().mean()
        ops = xlanb.pending_summary().ops
        # recorded in the model's scope, credited to this line (not to torch.fx's code)
        assert {op.scope for op in ops if op.name in ("aten::addmm", "aten::tanh")} == {"Sequential"}
        assert all(op.src.short.startswith("test_torch_compile.py:") for op in ops), ops[0].src
        loss.backward()
        ref = cpu(x).square().mean()
        ref.backward()
        torch.testing.assert_close(loss.cpu(), ref)
        for p, q in zip(model.parameters(), cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["print", "item"])
def test_graph_breaks_run_both_halves(kind, capsys):
    def f(x, y):
        a = (x @ y).relu()
        if kind == "print":
            print("inside")
            return a.sum(0)
        return a * a.sum().item()
    cf = torch.compile(f, backend="xlanb")
    torch.manual_seed(1)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(3):
        torch.testing.assert_close(cf(x.to("xla"), y.to("xla")).cpu(), f(x, y), rtol=1e-4, atol=1e-5)
    if kind == "print":
        assert capsys.readouterr().out.count("inside") >= 3


def test_in_place_on_input_and_tensors_made_inside():
    def f(x):
        x.add_(1)
        return x * torch.ones(3, device=x.device) + torch.arange(3.0).to(x.device)
    cf = torch.compile(f, backend="xlanb")
    base = torch.tensor([1.0, 2.0, 3.0])
    xd = base.to("xla")
    with torch.no_grad():
        out = cf(xd)
    torch.testing.assert_close(out.cpu(), f(base.clone()))
    torch.testing.assert_close(xd.cpu(), base + 1)


def test_batchnorm_training_updates_running_stats():
    cpu, model, cm = _compiled_pair(nn.Linear(6, 10), nn.BatchNorm1d(10), nn.ReLU())
    for _ in range(2):
        x = torch.randn(7, 6)
        torch.testing.assert_close(cm(x.to("xla")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
    bn_cpu, bn_dev = cpu[1], model[1]
    torch.testing.assert_close(bn_dev.running_mean.cpu(), bn_cpu.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn_dev.running_var.cpu(), bn_cpu.running_var, rtol=1e-5, atol=1e-6)
    assert int(bn_dev.num_batches_tracked.cpu()) == 2


def test_unflatten_outside_a_fake_mode_is_a_clear_error():
    from xlanb.ir.tensor import XlaTensor
    t = torch.ones(2).to("xla")
    inner, ctx = t.__tensor_flatten__()
    with pytest.raises(NotImplementedError, match="fake"):
        XlaTensor.__tensor_unflatten__({}, ctx, (2,), (1,))


def test_tensors_made_from_data_inside_the_graph():
    # torch.tensor(data, device=xla) in traced code: dynamo makes the tensor for real
    # while it traces, and FakeTensorMode refuses xla tensors, so it came back real and
    # met fake tensors in the next op ("cannot use a tensor on xla:0", "two devices, xla:0
    # and xla:0"): transformers' KV cache, torch.tensor([]) then cat, in every decoder LM
    from torch._dynamo.utils import counters

    def f(k):
        empty = torch.tensor([], dtype=k.dtype, device=k.device)
        return torch.cat([empty, k], dim=-2) * torch.tensor([2.0, 3.0, 4.0, 5.0], device=k.device)
    counters.clear()
    cf = torch.compile(f, backend="xlanb")
    k = torch.randn(2, 3, 4)
    for _ in range(2):
        torch.testing.assert_close(cf(k.to("xla")).cpu(), f(k))
    assert not counters["graph_break"], dict(counters["graph_break"])


def _replayed_quick(prefix: str) -> bool:
    return [g for g in xlanb.graphs() if g.cause.startswith(prefix)][-1].quick


def test_a_replayed_graph_reaches_the_optimized_executable_at_its_third_run():
    """Issue 57: dynamo's graphs replay through xlanb.compile, which replayed the quick
    executable forever; they tier up as a lazy graph does (graphs.run_cached): quick for
    the two traced calls, optimized from the third (the first replay)."""
    cpu, model, cm = _compiled_pair(nn.Linear(8, 23), nn.ReLU(), nn.Linear(23, 4))
    x = torch.randn(3, 8)
    up0 = c("GraphTierUp")
    quick = []
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(cm(x.to("xla")).cpu(), cpu(x))
            quick.append(_replayed_quick("xlanb.compile(torch.compile graph"))
    assert quick == [True, True, False, False] and c("CompiledReplay") >= 2
    assert c("GraphTierUp") == up0 + 1, metrics.short_report()
