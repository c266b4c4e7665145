"""In-place ops, ``out=`` variants and views that write through to their base, in every
mode, against CPU torch doing exactly the same thing.

Each scenario is a function of a device name: it builds its tensors from fixed CPU
values, mutates them, and returns every tensor whose value should be compared (bases,
views, outputs), in order.
"""
from __future__ import annotations

import pytest
import torch

import xlanb


def _base(dev, shape=(3, 4), dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64).reshape(shape) * 0.5 - 2).to(dtype).to(dev)


def index_add_one(dev):
    x = _base(dev)
    x[0] += 1
    return [x]


def view_flat_add_(dev):
    x = _base(dev)
    x.view(-1).add_(1)
    return [x]


def transpose_copy_(dev):
    x = _base(dev)
    y = _base(dev, (4, 3)) * -3
    x.t().copy_(y)
    return [x, y]


def slice_assign_zero(dev):
    x = _base(dev)
    x[:, 1:] = 0
    return [x]


def slice_assign_tensor(dev):
    x = _base(dev)
    x[1:, :2] = torch.tensor([[10.0, 20.0], [30.0, 40.0]]).to(dev)
    return [x]


def out_add(dev):
    a, b = _base(dev), _base(dev) * 2
    c = torch.empty(3, 4, device=dev)
    r = torch.add(a, b, out=c)
    assert r is c
    return [c, a, b]


def out_variants(dev):
    a = _base(dev)
    c = torch.zeros(3, 4, device=dev)
    torch.mul(a, 3, out=c)
    s = torch.zeros(4, device=dev)
    torch.sum(a, dim=0, out=s)
    m = torch.zeros(3, 3, device=dev)
    torch.matmul(a, a.t(), out=m)
    return [c, s, m]


def out_into_view(dev):
    x = _base(dev, (4, 4))
    torch.add(x[0], 100, out=x[2])
    return [x]


def chained_views_write(dev):
    x = _base(dev, (4, 6))
    x.view(2, 12)[:, ::2].transpose(0, 1)[1:4].mul_(-1)
    x[1:].t()[2].fill_(7.0)
    return [x]


def write_visible_via_base_and_other_views(dev):
    x = _base(dev)
    row0 = x[0]
    col1 = x[:, 1]
    flat = x.view(-1)
    row0.add_(10)        # x[0, 1] is also col1[0] and flat[1]
    col1.mul_(2)         # x[1, 1] is also flat[5]
    flat[11] = -5        # x[2, 3]
    return [x, row0, col1, flat]


def base_write_visible_via_view(dev):
    x = _base(dev)
    v = x[1]
    d = x.diagonal()
    x.mul_(2)
    x += 1
    return [x, v, d]


def inplace_on_view_of_view_then_read_base(dev):
    x = _base(dev, (2, 3, 4))
    v = x.permute(2, 0, 1)[1:3]
    v.sub_(x.permute(2, 0, 1)[0:2].clone())
    return [x, v]


def diagonal_zero_(dev):
    x = _base(dev, (4, 4))
    x.diagonal().zero_()
    x.diagonal(1).fill_(9.0)
    return [x]


def unsqueeze_squeeze_expand_write(dev):
    x = _base(dev, (3, 1))
    x.unsqueeze(0).squeeze(2)[0, 1:] += 4
    return [x, x.expand(3, 5)]


def index_put_with_tensors(dev):
    x = _base(dev)
    idx = torch.tensor([2, 0]).to(dev)
    x[idx] = torch.tensor([1.0, 2.0, 3.0, 4.0]).to(dev)
    mask = x > 1.5
    x[mask] = -1.0
    return [x]


def index_add_dim(dev):
    x = _base(dev)
    x.index_add_(0, torch.tensor([0, 2]).to(dev), torch.ones(2, 4).to(dev))
    x[:, 1].clamp_(min=0.0)
    return [x]


def inplace_dtype_cast_write(dev):
    x = torch.zeros(2, 3, dtype=torch.int64).to(dev)
    x[0] = _base(dev, (3,)) * 3     # float into int64: truncation like torch
    y = torch.zeros(2, 3).to(dev)
    y.add_(torch.ones(2, 3, dtype=torch.int32).to(dev))
    return [x, y]


def int64_inplace(dev):
    x = torch.tensor([[2**40, 1], [2**50, -(2**45)]], dtype=torch.int64).to(dev)
    x[0] += 3
    x.view(-1)[3] *= 2
    return [x]


def inplace_view_ops(dev):
    # squeeze_/unsqueeze_/transpose_ change the tensor's own shape (matmul's backward uses
    # them); a later write must go through the new view into the same storage.
    x = _base(dev, (3, 1, 4))
    x.squeeze_(1)
    x.unsqueeze_(0)
    x.transpose_(0, 2)
    x.mul_(2)
    y = _base(dev, (2, 3))
    y.t_()
    y[0] += 10
    return [x, y, x.contiguous()]


def as_strided_of_a_view(dev):
    # as_strided indexes the storage, not the view: offsets and strides are the base's.
    x = _base(dev, (20,))
    v = x[2:].view(3, 6)[1:]
    a = v.as_strided((3, 2), (1, 3))
    b = v.as_strided((3, 2), (1, 3), 1)
    b.mul_(10)
    return [a, b, x, torch.tensor([v.storage_offset(), a.storage_offset()]).to(dev)]


def prims_broadcast_in_dim(dev):
    # a prim view torch's _refs make (PyTorch's _refs.nn.functional.prelu tests); it has
    # no aten decomposition, so it needs a lowering of its own
    x = _base(dev, (3,))
    b = torch.ops.prims.broadcast_in_dim(x, [2, 3, 4], [1])
    w = _base(dev, (4,)) * 0.25
    return [b * 2, torch._refs.nn.functional.prelu(_base(dev, (2, 4)), w)]


def prims_real_imag_conj(dev):
    # prims torch's _refs call (_refs.real, _refs.conj: PyTorch's unary tests of them);
    # they have no lowering or decomposition and run as the aten functions torch gives
    # for them, so real and imag stay views that write through
    z = torch.complex(_base(dev), _base(dev) * -0.25)
    torch.ops.prims.real(z).mul_(2)
    torch.ops.prims.imag(z).add_(1)
    return [z, torch.ops.prims.conj(z).resolve_conj(), torch._refs.imag(z)]


SCENARIOS = [prims_real_imag_conj, prims_broadcast_in_dim, inplace_view_ops, as_strided_of_a_view, index_add_one, view_flat_add_, transpose_copy_, slice_assign_zero,
             slice_assign_tensor, out_add, out_variants, out_into_view, chained_views_write,
             write_visible_via_base_and_other_views, base_write_visible_via_view,
             inplace_on_view_of_view_then_read_base, diagonal_zero_,
             unsqueeze_squeeze_expand_write, index_put_with_tensors, index_add_dim,
             inplace_dtype_cast_write, int64_inplace]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[f.__name__ for f in SCENARIOS])
def test_matches_cpu(mode, scenario):
    want = scenario("cpu")
    got = scenario("xla")
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == "xla", i
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape, g.dtype, w.dtype)
        torch.testing.assert_close(g.cpu(), w, atol=0, rtol=0, msg=f"tensor {i}")
    # Still right after a sync, and views still alias their base afterwards.
    xlanb.sync()
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g.cpu(), w, atol=0, rtol=0, msg=f"tensor {i} after sync")


def test_view_aliases_after_sync(mode):
    x = torch.zeros(3, 4, device="xla")
    v = x[1]
    xlanb.sync()
    v.fill_(5.0)
    x[:, 0] = 1.0
    want = torch.zeros(3, 4)
    want[1] = 5.0
    want[:, 0] = 1.0
    assert torch.equal(x.cpu(), want)
    assert torch.equal(v.cpu(), want[1])


def test_inplace_keeps_identity_and_grad_flow(mode):
    # In-place on a non-leaf inside autograd: the result and gradients match CPU.
    def run(dev):
        w = torch.linspace(-1, 1, 12).reshape(3, 4).to(dev).requires_grad_()
        h = w * 2
        h[0] += 1
        h.view(-1)[5:7].mul_(3)
        h.t()[1].clamp_(max=0.5)
        loss = (h ** 2).sum()
        loss.backward()
        return h.detach(), w.grad
    (h_c, g_c), (h_x, g_x) = run("cpu"), run("xla")
    torch.testing.assert_close(h_x.cpu(), h_c)
    torch.testing.assert_close(g_x.cpu(), g_c)


def test_inplace_across_mode_switch():
    x = _base("xla")
    v = x[:, 2]
    with xlanb.mode("lazy"):
        v.add_(1)
    with xlanb.mode("eager"):
        x[0] *= 2
    with xlanb.mode("opbyop"):
        v.sub_(0.5)
    want = _base("cpu")
    want[:, 2] += 1
    want[0] *= 2
    want[:, 2] -= 0.5
    assert torch.equal(x.cpu(), want)
    assert torch.equal(v.cpu(), want[:, 2])


def test_out_list_argument(mode, same):
    """An out= argument that is a list of tensors (split_copy(..., out=[a, b, c])): PyTorch's
    test_view_ops test_view_copy_out found it failing."""
    x = torch.arange(12.0).reshape(6, 2)
    outs = [torch.empty(2, 2, device="xla") for _ in range(3)]
    cpu_outs = [torch.empty(2, 2) for _ in range(3)]
    assert torch.split_copy(x.to("xla"), 2, out=outs) is None
    torch.split_copy(x, 2, out=cpu_outs)
    for o, c in zip(outs, cpu_outs):
        same(o, c, exact=True)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_writes_through_real_and_imag_views(mode, dtype):
    # .real / .imag are view_as_real + select: the write lands in the complex base's
    # real representation (PyTorch's test_set_real_imag)
    cpu = torch.randn(6, dtype=dtype)
    x = cpu.to("xla")
    new_real, new_imag = torch.arange(6.), torch.arange(6.) * 10
    x.real = new_real.to("xla")
    cpu.real = new_real
    x.imag = new_imag.to("xla")
    cpu.imag = new_imag
    x[2:5].imag.mul_(-1)
    cpu[2:5].imag.mul_(-1)
    torch.view_as_real(x)[::2, 0].fill_(7)
    torch.view_as_real(cpu)[::2, 0].fill_(7)
    assert torch.equal(x.cpu(), cpu)
    assert x.dtype == dtype


@pytest.mark.parametrize("src,dst", [(torch.complex64, torch.float32), (torch.complex128, torch.int16),
                                     (torch.float64, torch.complex64), (torch.bool, torch.uint8),
                                     (torch.int8, torch.bool), (torch.complex64, torch.complex128)])
def test_view_dtype_reads_the_same_bytes(mode, src, dst):
    # XLA bitcasts neither bool nor complex; torch's view(dtype) reads the bytes
    for shape in ((3, 8), (0, 2, 8)):  # an empty one too
        cpu = torch.randint(0, 2, shape).to(src) if src in (torch.bool, torch.int8) \
            else (torch.randn(shape) * 5).to(src)
        want = cpu.view(dst)
        got = cpu.to("xla").view(dst).cpu()
        assert got.dtype == want.dtype and got.shape == want.shape
        if want.numel():
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("src,dst", [(torch.complex64, torch.float64), (torch.float64, torch.complex64),
                                     (torch.int64, torch.float64), (torch.int32, torch.float32)])
def test_view_dtype_of_a_0d_tensor(mode, src, dst):
    # a 0-d tensor views as a type of its own size; torch refuses other sizes
    cpu = (torch.randn(()) * 5).to(src)
    want, got = cpu.view(dst), cpu.to("xla").view(dst).cpu()
    assert got.shape == () and got.dtype == dst
    assert torch.equal(got.reshape(1).view(torch.uint8), want.reshape(1).view(torch.uint8))


def test_uint8_index_tensors_are_masks(mode):
    # deprecated in torch, still a mask there (with a warning); torch's meta kernel
    # refuses them, so xlanb reads them as bool
    cpu = torch.arange(12.).reshape(4, 3)
    mask = torch.tensor([1, 0, 1, 1], dtype=torch.uint8)
    x = cpu.to("xla")
    with pytest.warns(UserWarning, match="uint8 is now deprecated"):
        got = x[mask.to("xla")]
    assert torch.equal(got.cpu(), cpu[mask.bool()])
    with pytest.warns(UserWarning, match="uint8 is now deprecated"):
        x[mask.to("xla")] = -1.0
    cpu[mask.bool()] = -1.0
    assert torch.equal(x.cpu(), cpu)


def resize_scenarios(dev):
    """out= tensors of another shape, resize_ and resize_as_: torch's resize semantics."""
    x = _base(dev)
    empty = torch.empty(0, device=dev)
    torch.add(x, 1, out=empty)                    # an empty out= takes the result's shape
    idx = torch.empty(0, dtype=torch.long, device=dev)
    torch.nonzero(x > 0, out=idx)                 # resized by the CPU fallback's write back
    grown = _base(dev, (2, 2))
    grown.resize_(3, 3)                           # keeps its 4 elements; the rest are new
    grown = grown.reshape(-1)[:4]
    shrunk = _base(dev, (4, 4))
    shrunk.resize_(2, 3)
    last = _base(dev, (2, 3, 2, 2))
    last.resize_(2, 3, 2, 2, memory_format=torch.channels_last)
    like = _base(dev, (2, 3)).resize_as_(x)
    view = _base(dev, (2, 6))[1]
    view.resize_(2, 2)                             # a view resized stops being a view
    return [x, empty, idx, grown, shrunk, last, like.reshape(-1)[:6], view]


def test_resize_matches_cpu(mode):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nonzero runs on CPU torch (xlanb's warning)
        got = resize_scenarios("xla")
    want = resize_scenarios("cpu")
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
        torch.testing.assert_close(g.cpu(), w)


def test_resizing_a_full_out_tensor_warns_as_torch_does(mode):
    a = torch.ones(3, device="xla")
    out = torch.zeros(2, device="xla")
    for _ in range(2):  # every call warns, not only the one that saw the signature first
        with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
            torch.add(a, 1, out=out)
        assert out.shape == (3,)
        out.resize_(2)
    assert torch.equal(torch.add(a, 1, out=out).cpu(), torch.full((3,), 2.0))


def test_out_casts_follow_cpu_torch(mode):
    # torch's meta kernels accept these; its CPU kernels refuse them, and so does xla
    t = torch.tensor(1, device="xla")
    with pytest.raises(RuntimeError, match="Found dtype Double but expected Long"):
        torch.neg(t, out=torch.empty(0, dtype=torch.float64, device="xla"))
    with pytest.raises(RuntimeError, match="not supported for complex"):
        torch.floor(torch.tensor(1 + 1j, device="xla"))
    with pytest.raises(RuntimeError, match="alpha must not be a floating point"):
        torch.add(t, t, alpha=1.1)
    a = torch.ones(5, 2, dtype=torch.double, device="xla")
    with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes"):
        a[:, [1]] = torch.zeros(5, 1, dtype=torch.int, device="xla")
    r = torch.neg(t, out=torch.empty(0, dtype=torch.int64, device="xla"))
    assert r.cpu().item() == -1 and t.cpu().item() == 1  # nothing lost
    assert a.cpu().sum().item() == 10 and torch.add(t, 2.5, alpha=2).cpu().item() == 6.0


def test_data_ptr_tells_views_from_copies(mode):
    # the same answers as CPU torch's pointers: views share their base's address (plus
    # their offset in bytes), copies and other tensors have their own
    for dev in ("cpu", "xla"):
        x = torch.arange(12.0, device=dev).reshape(3, 4)
        y = torch.zeros(3, 4, device=dev)
        views = [x.view(-1), x[None], x[...], x.reshape(12), x.t()]
        copies = [x.t().reshape(-1), x[torch.tensor([0, 1], device=dev)], x.clone(), y]
        got = ([v.data_ptr() == x.data_ptr() for v in views]
               + [c.data_ptr() != x.data_ptr() for c in copies]
               + [x[1].data_ptr() - x.data_ptr(), x[:, 2].data_ptr() - x.data_ptr()]
               # torch's storage objects: a view's is its base's, a copy's is its own
               + [x[1].untyped_storage().data_ptr() == x.untyped_storage().data_ptr(),
                  x.t().reshape(-1).untyped_storage().data_ptr() != x.untyped_storage().data_ptr()])
        if dev == "cpu":
            want = got
    assert got == want and x.data_ptr() != 0


def set_storage_scenarios(dev):
    """Tensor.set_: a tensor becomes a view of another's storage and writes through."""
    x = _base(dev, (1, 16, 5))
    x.set_(x.untyped_storage(), 0, x.size(), (20, 5, 1))  # still contiguous: size[0] is 1
    ref = _base(dev, (8,))
    s = torch.empty(0, device=dev)
    s.set_(ref.untyped_storage(), storage_offset=1, size=torch.Size([3]), stride=[2])
    s.mul_(10)
    alias = torch.empty(0, device=dev)
    alias.set_(ref)
    alias.add_(1)
    return [x, s, ref, alias]


def test_set_shares_storage_as_cpu_does(mode):
    got, want = set_storage_scenarios("xla"), set_storage_scenarios("cpu")
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
        torch.testing.assert_close(g.cpu(), w)
    assert got[0].is_contiguous() and got[1].data_ptr() - got[2].data_ptr() == 4
    with pytest.raises(RuntimeError, match="not an xla tensor's"):
        torch.empty(0, device="xla").set_(torch.zeros(3).untyped_storage())


def test_out_of_range_indices_the_host_knows_raise(mode):
    # XLA would clamp them; torch raises. Index values from the host are checked, free
    r = torch.arange(10.0, device="xla")
    m = torch.zeros(3, 4, device="xla")
    y = r * 2  # pending in lazy mode: nothing of it may be lost
    for bad in (lambda: r[[10]], lambda: r[torch.tensor([-11])], lambda: m[:, [4]],
                lambda: r.__setitem__([12], 1.0), lambda: r[torch.LongTensor([10]).to("xla")]):
        with pytest.raises(IndexError, match="out of bounds"):
            bad()
    assert r[[9, -10]].cpu().tolist() == [9.0, 0.0] and m[[2], [3]].cpu().tolist() == [0.0]
    # an index computed on the device: checked where its values exist without a sync
    # (eager mode; after a sync in the others), else inside the graph of the next sync
    # (test_index_bounds.py), whose failed result then raises on each read
    ind = torch.ones(4, dtype=torch.int64, device="xla")
    ind[-1] = 10
    if mode != "eager":
        out = r[ind]  # pending: its values are not read (that would cut the graph)
        with pytest.raises(IndexError, match="index 10 is out of bounds"):
            xlanb.sync()
        xlanb.sync()  # runs the rest
        with pytest.raises(IndexError, match="index 10 is out of bounds"):
            out.cpu()
    with pytest.raises(IndexError, match="index 10 is out of bounds"):
        r[ind]
    assert y.cpu().tolist() == [2.0 * i for i in range(10)]
