"""Mixture-of-experts routing, in every mode, against CPU torch.

transformers' MoE layers (Mixtral, Qwen*-MoE, OLMoE, GPT-OSS, DeepSeek-V3, ...) count the
tokens per expert with ``torch.histc`` on integer expert ids off CPU (CPU torch has no
integer histc, so they pass floats there) and run ``grouped_mm`` on the offsets. xlanb's
histc put integers in the wrong bins (it searched edges truncated to the integer dtype),
so every MoE's logits were off CPU torch by up to 0.08 (issue 58). ``_grouped_mm`` itself
ran on CPU torch in float32 (torch's meta kernel is CUDA's, bfloat16 alone), its offsets
read on the host in every MoE layer; it is lowered now (JAX's ragged dot). Also here: histc's
float bins at the edges, its range when min == max, and the other routing patterns
(loops over data-dependent index sets accumulating into one tensor, in-place writes
through advanced indices, nonzero/where results reused as indices).
"""
from __future__ import annotations

import copy

import pytest
import torch

import xlanb


def _histc_cpu(x, **kw):
    """CPU torch's histc; integer input counted as floats (CPU torch has no integer
    histc), in the input's dtype, as CUDA torch's integer histc counts."""
    if x.dtype.is_floating_point:
        return torch.histc(x, **kw)
    return torch.histc(x.double(), **kw).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 3), (4, 0, 4), (3, 0, 7), (5, 2, 9), (4, 2, 2), (3, 0, 0)])
def test_histc_of_integers(mode, dtype, bins, lo, hi):
    # bins=4, min=0, max=3 is grouped_mm's tokens per expert; max=4 the load-balancing loss's
    x = torch.tensor([0, 1, 2, 3, 3, 1, 4, 5, 6, 7, 7, 9, -1, 2], dtype=dtype)
    got = torch.histc(x.to("xla"), bins=bins, min=lo, max=hi)
    assert got.dtype == dtype
    assert got.cpu().tolist() == _histc_cpu(x, bins=bins, min=lo, max=hi).tolist()


@pytest.mark.parametrize("bins,lo,hi", [(39, -1.3, 0.9), (9, 0.5, 7.25), (2, -2.0, 5.0), (3, -1.0, 1.0)])
def test_histc_at_the_bin_edges(mode, bins, lo, hi):
    # CPU torch divides, (x - min) * bins / (max - min), and searches no edges: a value
    # an ulp either side of an edge lands where that division puts it
    e = torch.linspace(lo, hi, bins + 1)
    x = torch.cat([e, e.nextafter(e + 1), e.nextafter(e - 1)])
    x = x[x.abs() > 1e-30]  # XLA flushes denormals (docs/DESIGN.md)
    got = torch.histc(x.to("xla"), bins=bins, min=lo, max=hi).cpu()
    assert got.tolist() == torch.histc(x, bins=bins, min=lo, max=hi).tolist()


@pytest.mark.parametrize("lo,hi", [(2, 2), (1.5, 1.5), (0, 0), (0, 4)])
def test_histc_takes_the_data_range_when_min_equals_max(mode, lo, hi):
    x = torch.tensor([0.0, 1, 2, 3, 4])
    got = torch.histc(x.to("xla"), bins=4, min=lo, max=hi).cpu()
    assert got.tolist() == torch.histc(x, bins=4, min=lo, max=hi).tolist()


_E, _T, _K, _H = 4, 16, 2, 8


def _routing(dev):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, _E, (_T, _K), generator=g)
    w = torch.rand(_T, _K, generator=g)
    h = torch.randn(_T, _H, generator=g)
    up = torch.randn(_E, _H, _H, generator=g)
    return ids.to(dev), w.to(dev), h.to(dev), up.to(dev)


def grouped_by_offsets(dev):
    """transformers' grouped_mm_experts_forward, with the grouped matmul as a loop over
    the offsets: sort by expert, histc, cumsum, per-expert rows, inverse permutation."""
    ids, w, h, up = _routing(dev)
    eid, perm = torch.sort(ids.reshape(-1), stable=True)
    hist_in = eid.float() if dev == "cpu" else eid.int()  # as transformers does
    offs = torch.cumsum(torch.histc(hist_in, bins=_E, min=0, max=_E - 1), 0, dtype=torch.int32)
    x = h[perm // _K]
    out = torch.empty_like(x)
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = x[start:end] @ up[e]
        start = end
    out = out * w.reshape(-1)[perm].unsqueeze(-1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=dev)
    return [offs, out[inv].view(_T, _K, _H).sum(1)]


def loop_over_hit_experts(dev):
    """MixtralExperts' eager loop: one_hot mask, the experts hit, where(), index_add_."""
    ids, w, h, up = _routing(dev)
    acc = torch.zeros_like(h)
    mask = torch.nn.functional.one_hot(ids, num_classes=_E + 1).permute(2, 1, 0)
    for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
        e = e[0]
        kpos, tok = torch.where(mask[e])
        acc.index_add_(0, tok, (h[tok] @ up[e]) * w[tok, kpos, None])
    return [acc]


def nonzero_rows_accumulate(dev):
    ids, w, h, _ = _routing(dev)
    acc = torch.zeros_like(h)
    for e in range(_E):
        tok, kpos = (ids == e).nonzero(as_tuple=True)
        acc[tok] += h[tok] * w[tok, kpos, None]
    return [acc]


def counts_and_scatters(dev):
    ids, w, h, _ = _routing(dev)
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=_E)
    acc = torch.zeros(_T, _H, device=dev).index_put_((ids[:, 0],), h, accumulate=True)
    sc = torch.zeros(_E, _H, device=dev).scatter_add_(0, ids[:, :1].expand(_T, _H), h)
    ones = torch.zeros(_E, device=dev).index_add_(0, flat, torch.ones(_T * _K, device=dev))
    return [counts, torch.bincount(flat, weights=w.reshape(-1), minlength=_E),
            torch.repeat_interleave(torch.arange(_E, device=dev), counts), acc, sc, ones]


def writes_through_views(dev):
    ids, _, h, _ = _routing(dev)
    a = h.clone()
    a[2:10][ids[:4, 0]] += 5  # advanced-index write into a slice view
    b = h.clone()
    b.t()[:, ids[:4, 0]] *= 0  # ... into a transposed view
    c = h.clone()
    e = torch.tensor(1, device=dev)  # a 0-d index tensor
    c[e] += 1
    c[e].mul_(3)
    d = h.clone()
    sel = d[ids[:, 0]]  # a copy: writing it leaves d alone
    sel.add_(1)
    return [a, b, c, d, sel]


SCENARIOS = [grouped_by_offsets, loop_over_hit_experts, nonzero_rows_accumulate, counts_and_scatters,
             writes_through_views]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[f.__name__ for f in SCENARIOS])
def test_routing_matches_cpu(mode, scenario):
    want = scenario("cpu")
    got = scenario("xla")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device.type == "xla"
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("experts", ["grouped_mm", "eager"])
def test_mixtral_logits_match_cpu(mode, experts):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    cfg._experts_implementation = experts  # grouped_mm is transformers' default
    model = transformers.MixtralForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        want = model(ids).logits
        got = copy.deepcopy(model).to("xla")(ids.to("xla")).logits
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    if experts == "grouped_mm":  # lowered: the offsets are never read on the host
        assert "aten::_grouped_mm" not in xlanb.metrics.counter_names()


_GROUPED_SHAPES = {"2d_3d": ((8, 4), (4, 4, 8)),   # tokens sorted by expert x experts' weights
                   "3d_2d": ((4, 8, 4), (4, 8)),
                   "2d_2d": ((8, 8), (8, 4)),      # the weights' gradient: k in groups
                   "3d_3d": ((4, 8, 4), (4, 4, 8))}


@pytest.mark.parametrize("layout", list(_GROUPED_SHAPES))
def test_grouped_mm_and_its_gradients_match_cpu(mode, layout):
    # torch's meta kernel for _grouped_mm is CUDA's (bfloat16 alone), so float32 (every
    # transformers MoE on CPU torch) ran on CPU torch, its offsets read on the host: a
    # sync in every MoE layer, forward and backward. Lowered (JAX's ragged dot), with an
    # expert that got no tokens (offsets 2, 2); the backward is _grouped_mm again.
    offs = torch.tensor([2, 2, 6, 8], dtype=torch.int32) if layout != "3d_3d" else None
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(*shape, generator=g) for shape in _GROUPED_SHAPES[layout])
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    want = torch._grouped_mm(ac, bc, offs=offs)
    want.sin().sum().backward()
    ax, bx = a.to("xla").requires_grad_(), b.to("xla").requires_grad_()
    got = torch._grouped_mm(ax, bx, offs=None if offs is None else offs.to("xla"))
    got.sin().sum().backward()
    for name, x, c in (("out", got, want), ("grad a", ax.grad, ac.grad),
                       ("grad b", bx.grad, bc.grad)):
        torch.testing.assert_close(x.cpu(), c, atol=1e-5, rtol=1e-5, msg=name)
    assert not [n for n in xlanb.metrics.counter_names() if n.startswith("aten::")]


def test_grouped_mm_refuses_what_cpu_torch_refuses(mode):
    a, b = torch.randn(8, 4, device="xla"), torch.randn(4, 4, 8, device="xla")
    with pytest.raises(RuntimeError, match="int32"):
        torch._grouped_mm(a, b, offs=torch.tensor([2, 4, 6, 8], device="xla"))  # int64
    with pytest.raises(RuntimeError, match="same dtype"):
        torch._grouped_mm(a, b.bfloat16(), offs=torch.tensor([2, 4, 6, 8], dtype=torch.int32,
                                                             device="xla"))
