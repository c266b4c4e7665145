"""``xlanb.debug_nans``: the first op that made a NaN/Inf, named with its aten op, module
scope and source line, in lazy, eager and opbyop modes, forward and backward; and the
source-mapped HLO (every instruction's metadata names the user's file and line)."""
from __future__ import annotations

import re

import pytest
import torch

import xlanb
from conftest import tiny_bert_mlm

transformers = pytest.importorskip("transformers")


def _line(marker: str) -> int:
    """The line of this file that carries ``marker`` in a comment."""
    with open(__file__) as f:
        for i, text in enumerate(f, 1):
            if text.rstrip().endswith("# " + marker):
                return i
    raise AssertionError(marker)


_bert = tiny_bert_mlm


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 99, (2, 12), generator=g)
    labels = torch.full((2, 12), -100)
    labels[0, 3], labels[1, 5] = 11, 42
    return dict(input_ids=ids.to("xla"), labels=labels.to("xla"))


def _inject(model, kind: str):
    """A NaN made at the input of layer 1's self-attention: in forward (log of a negative
    number) or only in backward (sqrt at 0: finite forward, infinite gradient)."""
    attn = model.bert.encoder.layer[1].attention.self
    orig = attn.forward

    def forward(hidden_states, *args, **kwargs):
        if kind == "forward":
            hidden_states = torch.log(hidden_states - 100.0)  # NAN-FWD
        else:
            hidden_states = hidden_states + torch.sqrt(hidden_states * 0.0)  # NAN-BWD
        return orig(hidden_states, *args, **kwargs)
    attn.forward = forward


SCOPE = "BertForMaskedLM.bert.encoder.layer.1.attention.self"


def test_bert_forward_nan_names_layer_and_line(mode):
    model = _bert()
    _inject(model, "forward")
    batch = _batch()
    with xlanb.debug_nans():
        with pytest.raises(FloatingPointError) as ei:
            loss = model(**batch).loss
            xlanb.sync()
    e = ei.value
    assert isinstance(e, xlanb.NonFiniteError)
    assert e.op == "aten::log" and e.inputs_finite and e.origin is None
    assert e.src.file == __file__ and e.src.line == _line("NAN-FWD")
    assert e.scope == SCOPE
    msg = str(e)
    assert "aten::log(f32[2,12,32])" in msg and f"test_nans.py:{_line('NAN-FWD')}" in msg
    assert SCOPE in msg and "non-finite 0" in msg  # the input's stats: finite
    if mode != "eager":  # the pending work is intact: it still runs, to the same NaN
        assert xlanb.pending_count() > 0
        xlanb.sync()
        assert torch.isnan(loss.cpu())


def test_bert_backward_nan_names_forward_line(mode):
    model = _bert()
    _inject(model, "backward")
    batch = _batch()
    with xlanb.debug_nans():
        loss = model(**batch).loss
        xlanb.sync()  # forward is finite
        assert torch.isfinite(loss.cpu())
        with pytest.raises(FloatingPointError) as ei:
            loss = model(**batch).loss
            loss.backward()
            xlanb.sync()
    e = ei.value
    assert e.origin is not None, str(e)
    anode, fop, fsrc, fscope = e.origin
    assert anode == "SqrtBackward0" and fop == "aten::sqrt"
    assert fsrc.file == __file__ and fsrc.line == _line("NAN-BWD")
    assert fscope == SCOPE
    assert e.where == (fsrc, SCOPE)
    assert "backward of aten::sqrt (SqrtBackward0)" in str(e)
    assert f"test_nans.py:{_line('NAN-BWD')}" in str(e)


def test_off_by_default_and_switches():
    assert not xlanb.config.debug_nans
    x = torch.tensor([-1.0, 4.0]).to("xla")
    y = torch.sqrt(x)
    xlanb.sync()  # off: no check
    assert torch.isnan(y.cpu()[0])
    xlanb.debug_nans(True)
    try:
        assert xlanb.config.debug_nans
        with xlanb.debug_nans(False):
            assert not xlanb.config.debug_nans
        assert xlanb.config.debug_nans
    finally:
        xlanb.debug_nans(False)
    assert not xlanb.config.debug_nans
    with xlanb.debug_nans():
        assert xlanb.config.debug_nans
    assert not xlanb.config.debug_nans


def test_nan_in_input_data_is_told_apart(mode):
    x = torch.tensor([1.0, float("nan")]).to("xla")
    xlanb.sync()
    with xlanb.debug_nans():
        with pytest.raises(FloatingPointError) as ei:
            y = x * 2.0 + 1.0
            xlanb.sync()
    e = ei.value
    assert not e.inputs_finite and e.op == "aten::mul"
    assert "already non-finite" in str(e) and "1 nan" in str(e)


def test_finite_run_is_unchanged(mode):
    with xlanb.debug_nans():
        x = torch.randn(4, 4).to("xla")
        y = (x @ x).relu().sum()
        xlanb.sync()
        assert torch.isfinite(y.cpu())


def test_env_turns_it_on(python_child):
    out = python_child(
        "import torch, xlanb\n"
        "print(xlanb.config.debug_nans)\n"
        "x = torch.tensor([-1.0]).to('xla')\n"
        "try:\n"
        "    y = torch.log(x); xlanb.sync(); print('no error')\n"
        "except FloatingPointError as e:\n"
        "    print('error', e.op)\n",
        env={"XLANB_DEBUG_NANS": "1"})
    assert "True" in out and "error aten::log" in out


# ---------------------------------------------------------------------------------------
# Source-mapped HLO

class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))  # HLO-LINE


def _hlo_sources(text: str) -> dict:
    """op_name -> (file, line, function) of each instruction, resolved through the HLO
    text's FileNames / FunctionNames / FileLocations / StackFrames tables."""
    tables: dict = {}
    section = None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
            tables[section] = {}
            continue
        m = re.match(r"^(\d+) (.*)$", line)
        if section and m:
            tables[section][int(m.group(1))] = m.group(2)
        elif not m:
            section = None
    out = {}
    for m in re.finditer(r'metadata=\{(?:op_type="[^"]+" )?op_name="([^"]+)"[^}]*?stack_frame_id=(\d+)', text):
        frame = tables["StackFrames"][int(m.group(2))]
        loc = tables["FileLocations"][int(re.search(r"file_location_id=(\d+)", frame).group(1))]
        f = int(re.search(r"file_name_id=(\d+)", loc).group(1))
        fn = int(re.search(r"function_name_id=(\d+)", loc).group(1))
        out[m.group(1)] = (tables["FileNames"][f].strip('"'), int(re.search(r" line=(\d+)", loc).group(1)),
                           tables["FunctionNames"][fn].strip('"'))
    return out


def test_hlo_metadata_names_user_line_and_scope():
    xlanb.set_mode("lazy")
    m = _Small().to("xla")
    y = m(torch.randn(2, 4).to("xla"))
    # the pending module (not yet compiled) carries the same metadata
    pending = _hlo_sources(xlanb.hlo(y, dialect="hlo"))
    assert any("/aten::addmm/" in k and v[:2] == (__file__, _line("HLO-LINE"))
               for k, v in pending.items()), pending
    xlanb.sync()
    g = xlanb.graphs()[-1]
    text = g.hlo(dialect="hlo")
    srcs = _hlo_sources(text)
    # the path starts at the graph's own jitted function (one name per graph: the
    # profiler finds a graph by its module name)
    top = f"jit({g.module.removeprefix('jit_')})"
    assert g.module.startswith("jit_xlanb_graph_")
    assert f'op_type="aten::addmm" op_name="{top}/_Small/fc/aten::addmm/dot_general"' in text
    assert 'op_type="aten::relu"' in text
    assert 'op_type="aten::addmm"' in g.hlo(optimized=True)  # XLA keeps it through its passes
    addmm = [k for k in srcs if "/aten::addmm/" in k]
    relu = [k for k in srcs if "/aten::relu/" in k]
    assert addmm and relu, srcs
    assert addmm[0].startswith(f"{top}/_Small/fc/aten::addmm/")
    assert relu[0].startswith(f"{top}/_Small/aten::relu/")
    for k in addmm + relu:
        file, line, fn = srcs[k]
        assert file == __file__ and line == _line("HLO-LINE") and fn == "forward"
    # one frame per instruction, the user's: not the lowering's own stack under it
    files = text[text.index("FileNames"):text.index("FunctionNames")]
    assert "xlanb" not in files and "parent_frame_id=0" not in text, files
    # metadata is no part of the key: the same structure from another line hits the cache
    n = len(xlanb.graphs())
    m2 = _Small().to("xla")
    z = torch.relu(m2.fc(torch.randn(2, 4).to("xla")))
    xlanb.sync()
    assert len(xlanb.graphs()) == n and torch.isfinite(z.cpu()).all()


def test_pdb_xnans_lists_nonfinite_tensors():
    import io
    import sys
    from xlanb.extensions.pdb import XlaPdb
    xlanb.set_mode("lazy")
    good = torch.ones(3).to("xla") * 2
    bad = torch.log(torch.tensor([-1.0, 1.0]).to("xla") - 0.5)  # XNANS-LINE
    out = io.StringIO()
    p = XlaPdb(stdin=io.StringIO(), stdout=out)
    p.botframe = None
    p.setup(sys._getframe(), None)
    p.do_xnans("")
    text = out.getvalue()
    assert "1 of 2 xla tensors hold NaN/Inf" in text, text
    assert "bad: (2,) float32 1 nan, 0 inf" in text and f"test_nans.py:{_line('XNANS-LINE')}" in text
    assert xlanb.pending_count() > 0  # peeked, not synced
    del good, bad


def test_ipython_magic_switches_it(capsys):
    ip = pytest.importorskip("IPython").core.interactiveshell.InteractiveShell.instance()
    ip.run_line_magic("load_ext", "xlanb")
    ip.run_line_magic("xla_nans", "on")
    assert xlanb.config.debug_nans
    ip.run_line_magic("xla_nans", "off")
    assert not xlanb.config.debug_nans
    assert "xla nans check off" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# compare_cpu: op-by-op divergence from CPU torch

class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 5)
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))  # TANH-LINE
        return self.fc2(h).log_softmax(-1)


def test_compare_cpu_matches_on_a_correct_model():
    torch.manual_seed(0)
    r = xlanb.compare_cpu(_Mlp(), torch.randn(3, 6), rtol=1e-4, atol=1e-5)
    assert r.first_divergence is None
    ops = [row.op for row in r.rows]
    assert "aten::addmm" in ops and "aten::tanh" in ops
    assert "all within tolerance" in str(r)


def test_compare_cpu_finds_an_injected_wrong_op(monkeypatch):
    import dataclasses
    from xlanb.lowering import registry
    op = torch.ops.aten.tanh.default
    key = op if op in registry.LOWERINGS else op.overloadpacket
    good = registry.LOWERINGS[key]
    wrong = dataclasses.replace(good, fn=lambda *a, **k: good.fn(*a, **k) + 1e-3)
    monkeypatch.setattr(xlanb.config, "store_dir", None)  # never store the wrong executable
    xlanb.reset()
    monkeypatch.setitem(registry.LOWERINGS, key, wrong)
    try:
        torch.manual_seed(0)
        r = xlanb.compare_cpu(_Mlp(), torch.randn(3, 6), rtol=1e-4, atol=1e-5)
    finally:
        monkeypatch.setitem(registry.LOWERINGS, key, good)
        xlanb.reset()  # drop the op signatures that hold the wrong lowering
    first = r.first_divergence
    assert first is not None and first.op == "aten::tanh", str(r)
    assert first.scope == "_Mlp" and first.src.file == __file__ \
        and first.src.line == _line("TANH-LINE")
    assert 0.9e-3 < first.max_abs < 1.1e-3
    assert all(row.ok for row in r.rows[:first.index])
    assert "<- first divergence" in str(r)
    # the notebook view: the xla side's graph, the first divergence filled red, the ops
    # before it green, and tanh's input drawn as the addmm that made it
    dot = r.to_dot()
    tanh_node = [l for l in dot.splitlines() if "aten::tanh" in l and "fillcolor" in l]
    assert tanh_node and '#ff6b6b' in tanh_node[0], dot
    addmm = [l for l in dot.splitlines() if "aten::addmm" in l and "fillcolor" in l]
    assert len(addmm) == 2 and "#d8f5d0" in addmm[0] and "#ffd0d0" in addmm[1], dot
    assert re.search(r"n6 -> n7\b", dot), dot  # fc1's addmm feeds tanh
    html = r._repr_html_()
    assert "<svg" in html and "xlanb-compare" in html and "background:#fdd" in html


def test_compare_magic_runs_the_cell_on_both_sides():
    ip = pytest.importorskip("IPython").core.interactiveshell.InteractiveShell.instance()
    ip.run_line_magic("load_ext", "xlanb")
    torch.manual_seed(0)
    ip.user_ns.update(model=_Mlp(), x=torch.randn(3, 6), cmp_y="before")
    r = ip.run_cell_magic("xla_compare", "model x --rtol 1e-4 --atol 1e-5",
                          "cmp_y = model(x)\ncmp_y.sum()")
    assert isinstance(r, xlanb.CompareReport) and r.first_divergence is None
    assert any(row.op == "aten::addmm" and row.scope == "_Mlp.fc1" for row in r.rows)
    assert ip.user_ns["cmp_y"] == "before"  # the cell ran as a function of its inputs
    loose = ip.run_cell_magic("xla_compare", "model x --dtype bfloat16", "model(x)")
    assert loose.first_divergence is not None  # bf16 against float32 at default tolerance
    from IPython.core.error import UsageError
    with pytest.raises(UsageError, match="nosuch"):
        ip.run_cell_magic("xla_compare", "nosuch", "1")


def test_compare_cpu_bf16_against_float32():
    torch.manual_seed(0)
    r = xlanb.compare_cpu(_Mlp(), torch.randn(3, 6), xla_dtype=torch.bfloat16,
                          rtol=1e-5, atol=1e-6)
    assert {row.dtype for row in r.rows if row.op == "aten::addmm"} == {"bfloat16"}
    assert r.first_divergence is not None  # bf16 is not float32
    assert max(row.max_abs for row in r.rows) < 0.1
    loose = xlanb.compare_cpu(_Mlp(), torch.randn(3, 6), xla_dtype=torch.bfloat16,
                              rtol=0.05, atol=0.05)
    assert loose.first_divergence is None, str(loose)


def test_eager_backward_nan_raised_when_block_ends():
    """Eager: a gradient op's NaN is found on autograd's thread, where raising is lost;
    it is raised at the next op, the next sync, or when the ``with`` block ends."""
    xlanb.set_mode("eager")
    w = torch.tensor([0.0, 1.0]).to("xla").requires_grad_()
    with pytest.raises(FloatingPointError) as ei:
        with xlanb.debug_nans():
            loss = torch.sqrt(w * 0.0).sum()  # SQRT-LINE
            loss.backward()
    e = ei.value
    assert e.origin is not None and e.origin[1] == "aten::sqrt"
    assert e.where[0].line == _line("SQRT-LINE")


def test_compiled_function_replay_is_checked():
    """xlanb.compile: the traced call and every replay are checked, and a replay that
    makes a NaN leaves the state it would have written as it was."""
    xlanb.set_mode("lazy")
    state = torch.ones(3).to("xla")

    @xlanb.compile
    def step(x):
        state.add_(torch.log(x))  # COMPILE-NAN
        return state * 2

    with xlanb.debug_nans():
        for _ in range(3):  # traced, then replayed
            step(torch.full((3,), 2.0).to("xla"))
        assert step.replays >= 1
        before = state.cpu().clone()
        with pytest.raises(FloatingPointError) as ei:
            step(torch.tensor([1.0, -1.0, 1.0]).to("xla"))
    e = ei.value
    assert e.op == "aten::log" and e.src.line == _line("COMPILE-NAN")
    assert torch.equal(state.cpu(), before)


def test_forward_op_is_not_labelled_backward(mode):
    """A forward NaN whose value backward reads again (sqrt's result, saved for its
    gradient and detached there) is named as the forward op it is, not as its backward."""
    gain = torch.nn.Parameter(torch.tensor(-0.2).to("xla"))
    w = torch.randn(4).to("xla")
    with xlanb.debug_nans():
        with pytest.raises(FloatingPointError) as ei:
            y = (torch.sqrt(gain) * w).sum()  # SQRT-FWD
            y.backward()
            xlanb.sync()
    e = ei.value
    assert e.op == "aten::sqrt" and e.src.line == _line("SQRT-FWD")
    assert e.origin is None and "backward of" not in str(e), str(e)


def test_a_nan_is_reported_once_then_later_syncs_run(mode, capsys):
    """Issue 38 item 8: a reported NaN's tensors stay pending, and something (IPython's
    last traceback) may keep them alive. Later syncs run anyway, NaN in, NaN out as CPU
    torch would, with one line naming the results that still hold non-finite values; a
    new origin is still reported."""
    if mode == "eager":
        pytest.skip("eager mode checks each op as it runs; nothing stays pending")
    with xlanb.debug_nans():
        x = torch.tensor([-1.0, 4.0]).to("xla")
        xlanb.sync()
        y = torch.sqrt(x) * 2.0
        with pytest.raises(FloatingPointError) as ei:
            xlanb.sync()
        assert ei.value.op == "aten::sqrt" and "reported once" in str(ei.value)
        capsys.readouterr()
        z = torch.ones(3).to("xla") + 1.0  # a clean computation, synced with y
        xlanb.sync()
        assert torch.equal(z.cpu(), torch.full((3,), 2.0))
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "still hold non-finite values" in err, err
        assert "aten::mul" in err and "test_nans.py" in err, err
        cpu = torch.sqrt(torch.tensor([-1.0, 4.0])) * 2.0
        assert torch.equal(y.cpu().isnan(), cpu.isnan()) and y.cpu()[1] == cpu[1]
        w = y.sum()  # made from the NaN that was reported: runs too
        xlanb.sync()
        assert torch.isnan(w.cpu()) and "still hold non-finite" in capsys.readouterr().err
        v = torch.log(torch.tensor([-2.0]).to("xla") * 1.0)  # a new origin: reported
        with pytest.raises(FloatingPointError) as ei:
            xlanb.sync()
        assert ei.value.op == "aten::log"
        del v
