"""SPMD checks on 8 simulated CPU devices, run once by tests/test_spmd.py in a child
process (XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before JAX
starts). Prints one JSON object of results; tests/test_spmd.py asserts on it."""
from __future__ import annotations

import json
import re
import sys
import traceback

import torch

import xlanb
import xlanb.spmd as xs
from xlanb import metrics

RESULTS: dict = {}
HERE = __file__


def check(fn):
    """Run one check; its result (or its error) goes into RESULTS under its name."""
    try:
        RESULTS[fn.__name__] = fn()
    except Exception:
        RESULTS[fn.__name__] = {"error": traceback.format_exc()}
    finally:
        xlanb.set_mode("lazy")
        xlanb.sync()
    return fn


def _line(tag: str) -> int:
    with open(HERE) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith("# " + tag))


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)) for _ in range(3)]


def train(device_mesh, mode):
    """3 SGD steps; weights sharded on 'model', the batch on 'data' when a mesh is given.
    Returns (losses, final weights on the CPU, the model)."""
    xlanb.set_mode(mode)
    m = mlp().to("xla")
    if device_mesh is not None:
        xs.mark_sharding(m[0].weight, device_mesh, ("model", None))
        xs.mark_sharding(m[2].weight, device_mesh, (None, "model"))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for x, y in data():
        x = x.to("xla")
        if device_mesh is not None:
            xs.mark_sharding(x, device_mesh, ("data", None))  # MARK-X
        loss = ((m(x) - y.to("xla")) ** 2).mean()  # LOSS-LINE
        loss.backward()
        opt.step()
        opt.zero_grad()
        xlanb.sync()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in m.parameters()], m


def cpu_train():
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for x, y in data():
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach() for p in m.parameters()]


mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
cpu_losses, cpu_weights = cpu_train()


def _compare(mode):
    single_losses, single_w, _ = train(None, mode)
    xlanb.reset()
    losses, weights, m = train(mesh, mode)
    dw = max((a - b).abs().max().item() for a, b in zip(weights, single_w))
    dcpu = max((a - b).abs().max().item() for a, b in zip(weights, cpu_weights))
    return {"losses": losses, "single": single_losses, "cpu": cpu_losses, "dw_single": dw,
            "dw_cpu": dcpu, "w0": str(xs.get_sharding(m[0].weight)),
            "dtypes": [str(p.dtype) for p in m.parameters()],
            "devices": sorted({str(p.device) for p in m.parameters()}),
            "op_compiles": metrics.counter_value("OpCompile") or 0,
            "collective_ops": metrics.counter_value("CollectiveOps") or 0}


@check
def lazy_training():
    xlanb.reset()
    out = _compare("lazy")
    # compiles: the 3 sharded steps
    out["graphs"] = len([g for g in xlanb.graphs() if g.in_shardings is not None])
    g = xlanb.graphs()[-1]
    out["hits"] = g.hits
    out["kinds"] = sorted(g.collectives.counts())
    out["collectives"] = [c._asdict() for c in g.collectives]
    out["collective_bytes"] = metrics.counter_value("CollectiveBytes") or 0
    out["optimized_hlo_has_all_reduce"] = " all-reduce(" in g.hlo(optimized=True)
    out["graphs_text"] = str(xlanb.graphs())
    out["ir_text"] = g.ir_text()
    out["loss_line"] = _line("LOSS-LINE")
    return out


@check
def eager_training():
    xlanb.reset()
    return _compare("eager")


@check
def opbyop_training():
    xlanb.reset()
    return _compare("opbyop")


@check
def recompile_cause():
    """A changed sharding of the same graph is a recompile naming the input and line."""
    xlanb.reset()
    xlanb.set_mode("lazy")
    w = torch.randn(16, 32).to("xla")
    out = []
    for spec in (("data", None), ("data", None), (None, "model")):
        x = torch.randn(8, 16).to("xla")
        xs.mark_sharding(x, mesh, spec)  # RESHARD-LINE
        y = (x @ w).relu()
        xlanb.sync()
        out.append(xlanb.peek(y))
    return {"graphs": len(xlanb.graphs()), "why": xlanb.graphs()[-1].explanation,
            "line": _line("RESHARD-LINE"), "hits": [g.hits for g in xlanb.graphs()]}


@check
def annotation_change():
    """A mark_sharding on a pending tensor is a constraint op in the graph; changing its
    spec is a recompile that names the op's line."""
    xlanb.reset()
    xlanb.set_mode("lazy")
    w = torch.randn(16, 32).to("xla")
    xs.mark_sharding(w, mesh, (None, "model"))
    texts = []
    for spec in (("data", "model"), ("data", None)):
        h = torch.randn(8, 16).to("xla") @ w
        xs.mark_sharding(h, mesh, spec)  # ANNOTATE-LINE
        ann = str(xs.get_sharding(h))
        texts.append(xlanb.pending_ir(h))
        z = h.tanh()
        dot = xlanb.pending_ir(z, fmt="dot")
        xlanb.sync()
    g = xlanb.graphs()[-1]
    return {"annotated": ann, "pending_ir": texts[-1], "why": g.explanation,
            "line": _line("ANNOTATE-LINE"), "after": str(xs.get_sharding(h)),
            "dot_has_fill": "fillcolor" in dot and "annotated" in dot,
            "compiled_ir": g.ir_text()}


@check
def peeks():
    xlanb.reset()
    xlanb.set_mode("lazy")
    x = torch.arange(64.0).reshape(8, 8).to("xla")
    xs.mark_sharding(x, mesh, ("data", "model"))
    y = x * 2 + 1
    n = xlanb.pending_count()
    v = xlanb.peek(y)
    shards = xlanb.peek(y, shards=True)
    xshards = xlanb.peek(x, shards=True)
    ok_shards = all(torch.equal(s.value, (torch.arange(64.0).reshape(8, 8) * 2 + 1)[s.index])
                    for s in shards)
    res = {"value_ok": torch.equal(v, torch.arange(64.0).reshape(8, 8) * 2 + 1),
           "pending_same": xlanb.pending_count() == n and n > 0,
           "n_shards": len(shards), "devices": [s.device for s in xshards],
           "shapes": sorted({tuple(s.value.shape) for s in xshards}),
           "ok_shards": ok_shards, "uncached": metrics.counter_value("UncachedCompile") or 0}
    xlanb.sync()
    res["after_sync"] = torch.equal(y.cpu(), torch.arange(64.0).reshape(8, 8) * 2 + 1)
    vis = xs.visualize_sharding(x)
    res["vis"] = str(vis)
    res["html"] = vis._repr_html_()
    res["svg"] = vis.svg()
    res["to_jax"] = type(xs.get_sharding(x).to_jax()).__name__
    res["spec"] = list(xs.get_sharding(x).partition_spec)
    return res


@check
def bad_specs():
    """Each bad spec: one ShardingError, nothing pending lost, nothing changed."""
    xlanb.reset()
    xlanb.set_mode("lazy")
    a = torch.randn(10, 16)
    x = a.to("xla")
    y = x * 3
    n = xlanb.pending_count()
    errs = {}
    for name, call in {
        "unknown_axis": lambda: xs.mark_sharding(y, mesh, ("batch", None)),
        "bad_index": lambda: xs.mark_sharding(y, mesh, (5, None)),
        "not_divisible": lambda: xs.mark_sharding(y, mesh, ("model", None)),
        "wrong_rank": lambda: xs.mark_sharding(y, mesh, ("data",)),
        "no_devices": lambda: xs.Mesh(range(8, 16), (2, 4), ("data", "model")),
        "axis_twice": lambda: xs.mark_sharding(y, mesh, ("data", "data")),
    }.items():
        try:
            call()
            errs[name] = None
        except xs.ShardingError as e:
            errs[name] = str(e)
    return {"errors": errs, "pending_kept": xlanb.pending_count() == n,
            "sharding": xs.get_sharding(y) is None,
            "value_ok": torch.allclose(y.cpu(), a * 3)}


@check
def jax_objects():
    """A jax Mesh and PartitionSpec are accepted as they are; tuples of axes; clear."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    xlanb.reset()
    jm = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    x = torch.randn(8, 16).to("xla")
    xs.mark_sharding(x, jm, P("data", "model"))
    a = str(xs.get_sharding(x))
    z = torch.randn(16, 4).to("xla")
    xs.mark_sharding(z, mesh, (("data", "model"), None))
    b = str(xs.get_sharding(z))
    xs.clear_sharding(x)
    c = str(xs.get_sharding(x))
    v = (x.sum() + z.sum()).item()
    return {"jax": a, "tuple": b, "cleared": c, "value_ok": abs(v - (x.cpu().sum() + z.cpu().sum()).item()) < 1e-3}


@check
def replica_check():
    """A value that differs on one shard: replica_mismatches names the block and devices."""
    import jax
    import numpy as np
    from xlanb.ops.leaves import from_array
    xlanb.reset()
    x = torch.arange(32.0).reshape(8, 4).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))  # replicated 4 times over 'model'
    clean = xs.replica_mismatches(x)
    arr = x._storage.node.data
    pieces = []
    for sh in arr.addressable_shards:
        v = np.asarray(sh.data).copy()
        if sh.device.id == 6:
            v[0, 0] += 1.5
        pieces.append(jax.device_put(v, sh.device))
    bad = jax.make_array_from_single_device_arrays(arr.shape, arr.sharding, pieces)
    found = xs.replica_mismatches(from_array(bad, 0))
    return {"clean": len(clean),
            "found": [(str(m.index), list(m.devices), list(m.odd), m.max_abs_diff) for m in found]}


@check
def magics():
    """%xla_sharding and %xla_collectives in IPython; torch_xla's xs names."""
    from IPython.testing.globalipapp import start_ipython
    xlanb.reset()
    ip = start_ipython()
    ip.run_line_magic("load_ext", "xlanb")
    ip.run_cell("import torch, xlanb, xlanb.spmd as xs\n"
                "mesh = xs.Mesh(range(8), (2, 4), ('data', 'model'))\n"
                "w = torch.randn(16, 32).to('xla'); xs.mark_sharding(w, mesh, (None, 'model'))\n"
                "x = torch.randn(8, 16).to('xla'); xs.mark_sharding(x, mesh, ('data', None))\n"
                "y = (x @ w).sum(1)\n")
    vis = ip.run_line_magic("xla_sharding", "w")
    pending = ip.run_line_magic("xla_collectives", "y")
    ip.run_cell("xlanb.sync()")
    last = ip.run_line_magic("xla_collectives", "--graph -1")
    from xlanb import compat as xlanb_compat
    xlanb_compat.install()
    try:
        import torch_xla.distributed.spmd as tx_xs
        t = torch.randn(8, 4).to("xla")
        tx_xs.mark_sharding(t, tx_xs.Mesh(list(range(8)), (8,), ("x",)), ("x", None))
        compat_ok = str(xs.get_sharding(t)).startswith("{'x'}")
    finally:
        xlanb_compat.uninstall()
    return {"vis": str(vis), "pending": str(pending), "last": str(last), "compat_ok": compat_ok}


@check
def compiled_function():
    """xlanb.compile with sharded tensors: a training step replays on the mesh, matching
    lazy mode; a batch sharded otherwise traces again."""
    xlanb.reset()
    torch.manual_seed(0)
    ref = mlp()
    m = mlp().to("xla")
    xs.mark_sharding(m[0].weight, mesh, ("model", None))
    xs.mark_sharding(m[2].weight, mesh, (None, "model"))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)

    @xlanb.compile
    def step(x, y):
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    losses, ref_losses = [], []
    for i in range(5):
        x, y = torch.randn(8, 16), torch.randn(8, 8)
        xx = x.to("xla")
        xs.mark_sharding(xx, mesh, ("data", None) if i < 4 else (None, None))
        losses.append(step(xx, y.to("xla")).item())
        rl = ((ref(x) - y) ** 2).mean()
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        ref_losses.append(rl.item())
    dw = max((a.detach().cpu() - b.detach()).abs().max().item()
             for a, b in zip(m.parameters(), ref.parameters()))
    # issue 57: what each replayed graph holds. On the mesh: the optimized executable from
    # its first run; a graph on one device in this SPMD session: quick, then optimized
    # from its third run (graphs.run_cached), as anywhere else
    sharded_quick = [g.quick for g in xlanb.graphs() if g.cause == f"xlanb.compile({step.name})"]
    up0 = metrics.counter_value("GraphTierUp") or 0

    @xlanb.compile
    def plain(v):
        return (v * 3.0 - 2.0).exp().sum()

    v = torch.full((1013,), 0.001, device="xla")
    plain_quick, plain_values = [], []
    for _ in range(4):
        plain_values.append(plain(v).item())
        plain_quick.append([g for g in xlanb.graphs() if g.cause == f"xlanb.compile({plain.name})"][-1].quick)
    return {"losses": losses, "ref": ref_losses, "dw": dw, "replays": step.replays,
            "status": str(step.status()), "w0": str(xs.get_sharding(m[0].weight)),
            "sharded_quick": sharded_quick, "plain_quick": plain_quick,
            "plain_values": plain_values, "plain_replays": plain.replays,
            "plain_tier_ups": (metrics.counter_value("GraphTierUp") or 0) - up0}


@check
def sharded_random_bits():
    """A random op on the mesh keeps JAX's partitionable threefry (runtime/jit.py): each
    device makes its own part's bits. One device's form made all 2,048 bits on every
    device and gathered them."""
    xlanb.reset()
    xlanb.set_mode("lazy")
    x = torch.ones(64, 32).to("xla")
    xs.mark_sharding(x, mesh, ("data", "model"))
    y = torch.nn.functional.dropout(x, 0.5)
    xlanb.sync()
    text = xlanb.graphs()[-1].hlo(optimized=True)
    del y
    sizes = [1]
    for dims in re.findall(r"u32\[([0-9,]+)\]", text):
        n = 1
        for d in dims.split(","):
            n *= int(d)
        sizes.append(n)
    return {"largest_bits": max(sizes), "all_gather": "all-gather" in text}


print("SPMD-RESULTS " + json.dumps(RESULTS, default=str))
sys.stdout.flush()
