"""Shapes that change (issue 56): a graph whose shapes change compiles only its segments
whose shapes changed; what grows is named by line, with its fix; strict recompiles
refuse it; a read hands out the live values its graph computes; small changed segments
run on CPU torch; an eager run of pieces read before runs from those pieces."""
from __future__ import annotations

import pytest
import torch

import xlanb
from xlanb import config


@pytest.fixture
def no_host(monkeypatch):
    """Changed segments compile (none runs on CPU torch), as a big model's would."""
    monkeypatch.setattr(config, "host_segment_bytes", 0)


def _layer(h, w, k_cache):
    """A decode step's shape: projections of one row (shapes fixed), attention over a
    cache one row longer at every step (shapes change), a projection again (fixed)."""
    q = torch.tanh(h @ w) * 0.5 + 0.1
    k = torch.sigmoid(q @ w.t())
    k_cache = torch.cat([k_cache, k])                           # grows by one row
    att = torch.softmax(q @ k_cache.t() * 0.3, dim=-1)          # (1, n): changes
    out = att @ k_cache                                         # (1, 16): fixed again
    return torch.relu(out @ w) + h, k_cache


def _steps(dev, n_steps, counters=(), width=16):
    """``n_steps`` decode-like steps on ``dev``; their outputs, the cache, and per step
    the change of each metrics counter named in ``counters``."""
    torch.manual_seed(0)
    w = torch.randn(width, width).to(dev) * 0.3
    h = torch.randn(1, width).to(dev)
    cache = torch.randn(3, width).to(dev)
    outs, per_step = [], []
    for _ in range(n_steps):
        before = {k: xlanb.metrics.counter_value(k) or 0 for k in counters}
        h, cache = _layer(h, w, cache)
        h = h / (h.abs().max() + 1)
        outs.append(h)
        if dev != "cpu":
            float(h.sum())  # the loop's read (generate's stopping check)
        per_step.append({k: (xlanb.metrics.counter_value(k) or 0) - before[k] for k in counters})
    return outs, cache, per_step


def test_a_growing_cache_compiles_only_the_segments_whose_shapes_changed(no_host, same):
    want, want_cache, _ = _steps("cpu", 8)
    names = ["SegmentCompile", "SegmentCacheHit", "SegmentedGraph"]
    got, cache, counts = _steps("xla", 8, names)
    for g, w in zip(got, want):
        same(g, w)
    same(cache, want_cache)
    late = counts[4:]
    # from the fourth shapes on, each step is cut: the unchanged segments come from the
    # cache and only the segments whose shapes changed compile
    assert all(c["SegmentedGraph"] >= 1 for c in late), counts
    assert all(c["SegmentCacheHit"] >= 1 and c["SegmentCompile"] >= 1 for c in late), counts
    sizes = [g.n_nodes for g in xlanb.graphs()]
    # a segment is a small graph: the changed part, not the whole step
    assert xlanb.graphs()[-1].n_nodes < max(sizes), sizes
    # the same shapes again (a second call of the loop): every segment from the cache
    xlanb.metrics.clear()
    _steps("xla", 8)
    assert (xlanb.metrics.counter_value("SegmentCompile") or 0) == 0
    assert xlanb.metrics.counter_value("SegmentCacheHit")
    # and each of those graphs ran its earlier cut, not planned again
    assert xlanb.metrics.counter_value("SegmentPlanHit") == \
        xlanb.metrics.counter_value("SegmentedGraph") >= 4


def _kv_layer(h, w, k_cache, v_cache):
    """Attention's order in a transformers layer: the key cache's cat and the scores,
    then the value projection (fixed shapes, reads nothing of them), then the value
    cache's cat and the weighted sum."""
    k_cache = torch.cat([k_cache, torch.sigmoid(h @ w)])            # grows by one row
    att = torch.softmax(h @ k_cache.t() * 0.3, dim=-1)              # (1, n): changes
    v = torch.tanh(h @ w.t()) * 0.5 + 0.1                          # fixed
    v_cache = torch.cat([v_cache, v])                               # grows by one row
    out = att @ v_cache                                             # changed inputs
    return torch.relu(out @ w) + h, k_cache, v_cache


@pytest.mark.parametrize("mode", ["lazy", "eager"])
def test_the_value_projection_runs_before_the_attention_so_it_compiles_once(
        no_host, same, mode):
    """The value projection, recorded between the two caches' cats, runs with the fixed
    ops before them: one changed segment a step, not two (each a compile at every new
    length, and a crossing to CPU torch and back where it runs there)."""
    width = {"lazy": 16, "eager": 12}[mode]  # (no segment shared with the other mode)

    def steps(dev, n):
        torch.manual_seed(0)
        w = torch.randn(width, width).to(dev) * 0.3
        h = torch.randn(1, width).to(dev)
        kc, vc = torch.randn(3, width).to(dev), torch.randn(3, width).to(dev)
        outs, compiles = [], []
        for _ in range(n):
            before = xlanb.metrics.counter_value("SegmentCompile") or 0
            h, kc, vc = _kv_layer(h, w, kc, vc)
            h = h / (h.abs().max() + 1)
            outs.append(h)
            if dev != "cpu":
                float(h.sum())
                compiles.append((xlanb.metrics.counter_value("SegmentCompile") or 0) - before)
        return outs, compiles
    want, _ = steps("cpu", 8)
    with xlanb.mode(mode):
        got, compiles = steps("xla", 8)
    for g, w in zip(got, want):
        same(g, w)
    # cut, from the fifth step on: only its one changed segment is new at each length
    assert compiles[4:] == [1, 1, 1, 1], compiles


def test_a_segments_memory_check_counts_the_live_bytes_a_walk_would(no_host, monkeypatch):
    """A segmented graph walks the live buffers once; each segment's memory check takes
    that figure plus the earlier segments' outputs: what a walk would find there."""
    import xlanb.execute.graphs as graphs
    import xlanb.values.memory as memory
    seen = []
    real = memory.check_graph

    def check(rec, index, what, mem=None, live=None):
        if live is not None:
            seen.append((live, memory.device_bytes().get(index, 0)))
        return real(rec, index, what, mem, live)

    monkeypatch.setattr(graphs, "check_graph", check)
    _steps("xla", 7, width=20)
    assert len(seen) >= 8 and all(a == b for a, b in seen), seen


def test_an_eager_run_compiles_only_its_changed_ops(no_host, same):
    """In eager mode the run begins at the first op with no executable, which moves as
    ops get executables of their own; however it moves, a step soon compiles only the
    ops whose shapes changed (cat, the attention over the cache), not the whole step."""
    want, want_cache, _ = _steps("cpu", 10, width=12)  # (shapes no other test makes)
    xlanb.set_mode("eager")
    got, cache, _ = _steps("xla", 7, width=12)
    n = len(xlanb.graphs())
    got2, cache2, counts = _steps("xla", 10, ["EagerRunCompile", "SegmentCacheHit"], width=12)
    for g, w in zip(got + got2, want[:7] + want):
        same(g, w)
    same(cache2, want_cache)
    whole = max(g.n_nodes for g in xlanb.graphs()[:n])
    late = [g.n_nodes for g in xlanb.graphs()[n:]]
    # steps 8-10 of the second loop: lengths the first never reached
    assert all(c["EagerRunCompile"] >= 1 for c in counts[7:]), counts
    assert late and max(late) <= 8 < whole, (late, whole)


def test_a_step_whose_shapes_never_change_stays_one_graph(count):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = model.to("xla")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8).to("xla"), torch.randn(4, 2).to("xla")
    for _ in range(6):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        xlanb.sync()
    assert count("SegmentedGraph") == 0 and count("SegmentCompile") == 0
    assert count("CachedCompile") >= 4


def test_the_growth_is_named_by_line_with_its_fix(no_host):
    _steps("xla", 6)
    seg = [g for g in xlanb.graphs() if "grows by 1" in g.explanation]
    assert seg, [g.explanation for g in xlanb.graphs()]
    why = seg[-1].explanation
    assert "dim 0 of the tensor made at test_shapes_that_change.py:" in why, why
    assert "(aten::cat) grows by 1 each sync (" in why and "pad that dimension to buckets" in why
    assert "compile(s) for the" in why and "padding" in why
    # every front end shows the explanation: the graph table's text and HTML
    assert "grows by 1 each sync" in str(xlanb.graphs())
    assert "grows by 1 each sync" in xlanb.graphs()._repr_html_()


def test_strict_recompiles_raise_with_the_growth_and_lose_nothing(no_host, monkeypatch, same):
    monkeypatch.setattr(config, "strict_recompiles", True)
    torch.manual_seed(0)
    acc_cpu = torch.randn(2, 5)
    acc = acc_cpu.to("xla")
    row = torch.ones(1, 5, device="xla")
    for i in range(2):
        acc, acc_cpu = torch.cat([acc, row * i]), torch.cat([acc_cpu, torch.ones(1, 5) * i])
        float((acc * 2).sum())  # warm-up: the first two shapes
    acc, acc_cpu = torch.cat([acc, row * 7]), torch.cat([acc_cpu, torch.ones(1, 5) * 7])
    with pytest.raises(xlanb.RecompileError) as e:
        float((acc * 2).sum())
    msg = str(e.value)
    assert "recompile after warm-up at test_shapes_that_change.py:" in msg, msg
    assert "dim 0 of the tensor made at test_shapes_that_change.py:" in msg, msg
    assert "Nothing ran; every tensor keeps its pending work" in msg
    assert xlanb.pending_count() >= 1
    torch.testing.assert_close(xlanb.peek(acc), acc_cpu)  # a look compiles no graph
    monkeypatch.setattr(config, "strict_recompiles", False)
    same(acc, acc_cpu)


def test_strict_recompiles_allow_what_repeats(monkeypatch, count):
    monkeypatch.setattr(config, "strict_recompiles", True)
    x = torch.randn(4, 4).to("xla")
    for _ in range(5):
        float((x @ x).relu().sum())
    assert count("UncachedCompile") == 1 and count("CachedCompile") == 4


def test_a_read_hands_out_the_live_values_its_graph_computes(count, same):
    """A cache updated in place, read through the logits only: each step's graph starts
    from device data, so it is the same graph (it used to recompute every earlier step)."""
    torch.manual_seed(0)
    cache_cpu = torch.zeros(2, 8)
    w_cpu = torch.randn(8, 8)
    cache, w = cache_cpu.to("xla"), w_cpu.to("xla")
    mask, mask_cpu = torch.ones(1, 1, device="xla"), torch.ones(1, 1)
    xlanb.sync()
    n_ops = []
    for t in range(5):
        for c, ww in ((cache, w), (cache_cpu, w_cpu)):
            c.index_copy_(1, torch.tensor([t], device=c.device), (c @ ww)[:, :1] + t)
        logits = (cache @ w).sum()
        # pending work after the read: an attention mask grown past the read
        mask = torch.cat([mask, torch.ones(1, 1, device="xla")], dim=1)
        mask_cpu = torch.cat([mask_cpu, torch.ones(1, 1)], dim=1)
        assert bool(logits > -1e9)
        n_ops.append(xlanb.graphs()[-1].n_nodes)
    assert len(set(n_ops[2:])) == 1, n_ops  # no longer growing
    assert count("CachedCompile") >= 2
    same(cache, cache_cpu)
    same(mask, mask_cpu)


def test_a_small_changed_segment_runs_on_cpu_torch(count, same, monkeypatch):
    """Integer bookkeeping one longer per step (generate's input ids): no compile. It
    runs with one intra-op thread, and the user's thread count is left as it was."""
    threads = []
    real_set = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (threads.append(n), real_set(n)))
    before = torch.get_num_threads()
    ids_cpu = torch.tensor([[5, 3, 9]])
    ids = ids_cpu.to("xla")
    w = torch.randn(16, 4)
    n = 0
    for step in range(8):
        if step == 4:
            n = len(xlanb.graphs())
        nxt_cpu = (ids_cpu[:, -1:] * 7 + 3) % 16
        nxt = (ids[:, -1:] * 7 + 3) % 16
        ids_cpu, ids = torch.cat([ids_cpu, nxt_cpu], 1), torch.cat([ids, nxt], 1)
        emb = w.to("xla")[ids[:, -1]]  # a fixed-shape part that reads it
        assert bool(emb.sum() > -1e9)
    same(ids, ids_cpu, exact=True)
    assert count("SegmentOnHost") >= 3
    assert threads[:2] == [1, before] and torch.get_num_threads() == before, threads
    late = xlanb.graphs()[n:]  # once cut, only the fixed-shape part ever compiled
    assert all("aten::cat" not in g.ops for g in late), [g.ops for g in late]


def test_an_eager_run_of_pieces_read_before_compiles_nothing(count, same):
    xlanb.set_mode("eager")

    def seq(x):
        c = x.exp() * 2.0 + x
        return c.sum(dim=1), torch.softmax(c, dim=-1)[:, 1:]

    cpus = [torch.randn(3 + i, 877 + i) for i in range(5)]
    xs = [c.to("xla") for c in cpus]
    xlanb.sync()
    for x in xs:  # each shape read at once: a run each
        s, q = seq(x)
        s.cpu(), q.cpu()
    before = count("EagerRunCompile")
    outs = [seq(x) for x in xs]  # the same ops and shapes, read at the end
    for (s, q), c in zip(outs, cpus):
        ws, wq = seq(c)
        same(s, ws)
        same(q, wq)
    assert count("EagerRunCompile") == before, "pieces seen before compiled again"
    assert count("EagerRunInPieces") == 1 and count("EagerRunCacheHit") >= 5


def test_debug_nans_names_the_op_inside_a_segment(no_host):
    torch.manual_seed(0)
    w = torch.randn(16, 16).to("xla") * 0.3
    h = torch.randn(1, 16).to("xla")
    cache = torch.randn(3, 16).to("xla")
    for _ in range(5):
        h, cache = _layer(h, w, cache)
        float(h.sum())
    assert xlanb.metrics.counter_value("SegmentedGraph")
    with xlanb.debug_nans():
        bad = torch.cat([cache, torch.full((1, 16), -1.0, device="xla")])
        with pytest.raises(xlanb.NonFiniteError) as e:
            float((bad.sqrt() @ w).sum())
    assert "aten::sqrt" in str(e.value)


def test_the_magic_and_the_widget_name_the_growth(no_host):
    """%xla_graphs and the GraphView widget show the explanation, growth included."""
    pytest.importorskip("ipywidgets")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from support import loaded_shell
    shell = InteractiveShell.instance()
    fixture = loaded_shell(shell, "terminal")
    next(fixture)
    try:
        _steps("xla", 6, width=10)
        with capture_output() as c:
            shell.run_line_magic("xla_graphs", "")
        shown = c.stdout + "".join(o.data.get("text/plain", "") for o in c.outputs)
        assert "grows by 1 each sync" in shown, shown
        from xlanb.widgets import GraphView
        g = next(g for g in reversed(xlanb.graphs()) if "grows by 1" in g.explanation)
        view = GraphView(graph=g)
        assert "grows by 1 each sync" in view.info.value, view.info.value
    finally:
        next(fixture, None)


def test_a_new_prompt_length_compiles_its_prefill_and_then_only_what_changed(same):
    """Eager mode, generate at a second prompt length: the first decode step's run is a
    new skeleton (ops that got executables of their own since ran alone before it, so
    the run begins elsewhere), but its ops are not new; it is cut where their shapes
    changed, so after the prefill no graph compiles the whole decode step again."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=95)
    prompts = [torch.randint(1, 95, (1, n)) for n in (5, 8)]
    with torch.no_grad():
        want = [model.generate(p, **kw) for p in prompts]
    xlanb.set_mode("eager")
    model.to("xla")
    start = len(xlanb.graphs())  # (the log holds earlier tests' graphs too)
    with torch.no_grad():
        same(model.generate(prompts[0].to("xla"), **kw), want[0], exact=True)
        # the biggest graph, the prefill; the first decode steps compiled whole too
        whole = max(g.n_nodes for g in xlanb.graphs()[start:])
        n = len(xlanb.graphs())
        same(model.generate(prompts[1].to("xla"), **kw), want[1], exact=True)
    sizes = [g.n_nodes for g in xlanb.graphs()[n:]]
    # the prefill at the new length compiles whole (every shape in it changed); besides
    # it only segments (the attention over the longer cache, a stretch that lost two
    # ops) and generate's own small graphs, no decode step whole (238 ops, 242 with the
    # ids' slices)
    assert [s for s in sizes if s > whole // 2] == [whole], sizes


def _tiny_gpt2():
    import transformers
    cfg = transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4,
                                  n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_a_forward_repeated_at_a_length_it_ran_compiles_nothing(count, same):
    """Eager mode: a GPT-2 forward at a length it ran, read at the same place, comes from
    the cache. After the first forward the view of its ids had an executable of its own
    (the embedding's index check looked at them, op by op), so the next forward's run
    began one op later, a new run compiled again (180 ms, where the cached run takes 5):
    an op that opened a run opens it again."""
    model = _tiny_gpt2()
    ids = torch.randint(0, 99, (1, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).logits
        xlanb.set_mode("eager")
        model = model.to("xla")
        same(model(ids.to("xla")).logits, want)
        compiled = count("EagerRunCompile") + count("OpCompile")
        for _ in range(3):
            same(model(ids.to("xla")).logits, want)
    assert count("EagerRunCompile") + count("OpCompile") == compiled
    assert count("EagerRunCacheHit") >= 3


def test_an_op_that_opened_a_run_opens_it_again_with_an_executable(count):
    """The run's first op keeps opening it once a look compiled that op alone; an op
    that tiers up because it came back in new company runs alone (test_eager_runs)."""
    xlanb.set_mode("eager")
    x = torch.arange(12.0).reshape(3, 4).to("xla")
    y = (x * 1.5).tanh() + 2.0    # a run: mul opens it
    float(y.sum())
    assert xlanb.peek((x * 1.5) - 1.0) is not None  # the look compiles mul alone
    runs = count("EagerRunCompile") + count("EagerRunCacheHit")
    y = (x * 1.5).tanh() + 2.0    # mul has an executable now, and opens the run again
    assert xlanb.pending_count() > 0
    assert float(y.sum()) == float(((torch.arange(12.0).reshape(3, 4) * 1.5).tanh() + 2).sum())
    assert count("EagerRunCompile") + count("EagerRunCacheHit") == runs + 1
    assert count("EagerRunCacheHit") >= 1


def test_an_eager_index_check_computes_small_ids_on_cpu_torch(count, same):
    """While an eager run is open, an embedding's check of its ids (pending in the run)
    computes them on CPU torch, as a small segment, instead of compiling their ops
    alone: at each new prompt length of a generate call that was 8 ms an op. A bad id
    still raises CPU torch's error before anything runs."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(40, 8)
    raw = torch.arange(12)
    want = emb(torch.tanh(torch.ones(3)).sum().long() + raw.view(3, 4) * 3)
    want_after = emb(torch.tanh(torch.ones(3)).sum().long() + raw.view(3, 4))
    xlanb.set_mode("eager")
    emb_x, raw_x = emb.to("xla"), raw.to("xla")
    start = torch.tanh(torch.ones(3, device="xla")).sum().long()   # opens a run
    ids = start + raw_x.view(3, 4) * 3                               # pending in it
    out = emb_x(ids)
    # no look compiled the ids' ops (an op may still come from the store, counted
    # OpCompile, when an earlier test stored it)
    assert count("SegmentOnHost") >= 1
    assert count("OpQuickCompile") == 0 and count("PeekCompile") == 0
    same(out, want)
    bad = start + raw_x.view(3, 4) * 4                                # ids up to 46
    with pytest.raises(IndexError, match="index out of range"):
        emb_x(bad)
    same(emb_x(start + raw_x.view(3, 4)), want_after)


def test_a_small_integer_run_at_new_shapes_runs_on_cpu_torch_and_a_float_one_compiles(count, same):
    """generate's attention mask and stopping check at a new prompt length: integers only,
    exact on every backend, so an eager run of them whose shapes changed compiles
    nothing; the same ops on floats compile (the device's rounding is what eager shows)."""
    xlanb.set_mode("eager")

    def mask(ids):
        keep = torch.isin(ids, torch.tensor([0, 7], device=ids.device)).logical_not()
        return (keep.long().cumsum(-1) - 1).masked_fill(~keep, 1)

    def scaled(x):
        return (x * 1.5 + 0.25).cumsum(-1) - 1

    for n in (5, 6):  # first sight compiles; the second shape too is the first at it
        ids_cpu = torch.randint(0, 9, (1, 40 + n))
        same(mask(ids_cpu.to("xla")), mask(ids_cpu), exact=True)
    runs, host = count("EagerRunCompile"), count("SegmentOnHost")
    for n in (7, 8, 9):
        ids_cpu = torch.randint(0, 9, (1, 40 + n))
        same(mask(ids_cpu.to("xla")), mask(ids_cpu), exact=True)
    assert count("EagerRunCompile") == runs and count("SegmentOnHost") - host == 3
    for n in (5, 6, 7):
        x_cpu = torch.randn(1, 40 + n)
        same(scaled(x_cpu.to("xla")), scaled(x_cpu))
    assert count("EagerRunCompile") - runs == 3 and count("SegmentOnHost") - host == 3


def test_changed_stretches_that_read_nothing_between_join_where_cpu_torch_runs_both():
    """Two slices of a growing tensor on either side of a fixed stretch that the second
    does not read: one changed segment, so one crossing to CPU torch and back, not two;
    apart where CPU torch could not run them together."""
    from xlanb.graph.segments import cut
    from xlanb.ir.nodes import plan_graph
    from xlanb.modes.record import value_node
    xlanb.set_mode("lazy")
    ids = torch.arange(1, 9).reshape(1, 8).to("xla")
    k = torch.arange(4).reshape(1, 4).to("xla")
    xlanb.sync()
    first = ids[:, :4] + (k * 3 + 1)
    last = ids[:, -4:] * 2
    with torch._C._DisableTorchDispatch():
        plan = plan_graph([value_node(first), value_node(last)])
    names = [info.name.removeprefix("aten::") for info, _ in plan.steps]
    assert names == ["slice", "mul", "add", "add", "slice", "mul"]
    varying = frozenset(i for i, n in enumerate(names) if n == "slice")
    named = lambda segs: [[names[i] for i in s] for s in segs]  # noqa: E731
    assert named(cut(plan, varying, lambda steps: True)) == [
        ["slice", "slice", "mul"], ["mul", "add", "add"]]
    assert named(cut(plan, varying, lambda steps: False)) == [
        ["slice"], ["mul", "add", "add"], ["slice", "mul"]]
    xlanb.sync()


@pytest.mark.parametrize("model_name", ["llama", "gpt2"])
def test_an_eager_decode_step_runs_its_bookkeeping_as_one_cpu_torch_segment(
        model_name, same, monkeypatch):
    """generate in eager mode: a decode step's run records generate's bookkeeping (the
    input ids' slices) on either side of the model's first ops. Cut, the changed
    stretches that read nothing between them run as one CPU torch segment: fewer
    crossings to CPU torch and back than the same cuts without joining (the tiny
    Llama's cached call: 93 against 108 segments on CPU torch, 16 tokens)."""
    transformers = pytest.importorskip("transformers")
    from xlanb.execute import graphs
    from xlanb.graph import segments
    torch.manual_seed(0)
    if model_name == "llama":
        cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(cfg).eval()
    else:
        cfg = transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4,
                                      n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg).eval()
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=95)
    prompt = torch.randint(1, 95, (1, 5))
    with torch.no_grad():
        want = model.generate(prompt, **kw)
    cuts = []

    def noted(plan, varying, on_host=None):
        cuts.append((plan, varying, on_host))
        return segments.cut(plan, varying, on_host)
    monkeypatch.setattr(graphs, "cut", noted)
    graphs.clear_graph_cache()  # cut plans are kept by graph key: an earlier test's
    model.to("xla")
    xlanb.set_mode("eager")
    with torch.no_grad():
        for _ in range(2):
            same(model.generate(prompt.to("xla"), **kw), want, exact=True)
    assert cuts and all(on_host is not None for _, _, on_host in cuts)

    def changed(segs, varying):
        return sum(1 for s in segs if any(k in varying for k in s))
    fewer = 0
    for plan, varying, on_host in cuts:
        joined = changed(segments.cut(plan, varying, on_host), varying)
        apart = changed(segments.cut(plan, varying), varying)
        assert joined <= apart
        fewer += joined < apart
    assert fewer, "no decode step had changed stretches to join"
