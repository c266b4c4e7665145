"""The user's line everywhere a line is shown (issue 38), in process.

- an op recorded by autograd's backward has the forward line it differentiates (graph
  summaries, a graph's largest buffers, what ``%xla_memory --graph`` prints);
- a warning's header names a cell as messages do (``In[5]:3:``), never the code's file;
- ``%load_ext xlanb`` gives ``breakpoint()`` and ``%debug`` xlanb's pdb commands unless
  ``PYTHONBREAKPOINT`` is set, and unloading puts back what was there;
- an error raised on purpose is shown in IPython ending at the user's line.
"""
from __future__ import annotations

import sys
import warnings

import pytest
import torch

import xlanb

pytest.importorskip("IPython")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

HERE = __file__.rsplit("/", 1)[-1]


def _backward_graph():
    m = torch.nn.Linear(24, 24).to("xla")
    x = torch.randn(16, 24, device="xla")
    line = sys._getframe().f_lineno + 1
    loss = torch.nn.functional.gelu(m(x)).sum()
    loss.backward()
    return m, line


def test_backward_ops_carry_the_forward_line():
    m, line = _backward_graph()
    ops = xlanb.pending_summary(m.weight.grad).ops
    backward = [op for op in ops if op.name in ("aten::gelu_backward", "aten::mm")]
    assert backward, [op.name for op in ops]
    for op in backward:
        assert op.src is not None and op.src.short.startswith(f"{HERE}:{line} "), op
    xlanb.sync()
    g = xlanb.graphs()[-1]
    bufs = [b for b in g.largest_buffers() if b.op in ("aten::gelu_backward", "aten::mm")]
    assert bufs, g.largest_buffers()
    for b in bufs:  # %xla_memory --graph shows these: a line, not a blank
        assert b.loc is not None and b.loc.line == line, b


def _training_step(model, opt, x):
    """Two micro-batches accumulated into the gradients, then the optimizer's step; the
    lines of the two ``backward()`` calls."""
    opt.zero_grad()  # set_to_none: the first backward's AccumulateGrad detaches
    first = sys._getframe().f_lineno + 1
    model(x[:2]).square().mean().backward()
    second = sys._getframe().f_lineno + 1
    model(x[2:]).square().mean().backward()  # AccumulateGrad adds into .grad
    opt.step()
    return first, second


def test_every_op_of_a_training_step_has_a_user_line():
    """Autograd's own steps (AccumulateGrad's ``detach`` of a new gradient and ``add_``
    into an existing one) have no forward op: they carry the line that called
    ``.backward()``, in the pending IR and in the profile (not ``(no user line)``)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 4)).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8, device="xla")
    with xlanb.mode("lazy"):
        with xlanb.profile() as p:
            first, second = _training_step(model, opt, x)
            ops = xlanb.pending_summary().ops
            xlanb.sync()
    made_here = [op for op in ops if op.name not in ("aten::empty", "xla::data")]
    assert made_here and all(op.src is not None for op in made_here), \
        [op.name for op in made_here if op.src is None]
    at = lambda line: f"{HERE}:{line} "  # noqa: E731
    accumulated = [op for op in ops if op.name == "aten::add_"
                   and op.src.short.startswith(at(second))]
    assert len(accumulated) == 4, [(op.name, op.src.short) for op in ops]  # 4 parameters
    assert all(e.src is not None for e in p.ops), [e.name for e in p.ops if e.src is None]
    detached = [e for e in p.ops if e.name == "aten::detach" and e.src.short.startswith(at(first))]
    assert len(detached) == 4, [(e.name, e.src.short) for e in p.ops]
    assert "(no user line)" not in str(p.by_line(limit=None))
    # a NaN made there is told as autograd's step in that backward, not a forward op's
    from xlanb.execute.nans import origin_text
    text = origin_text(("AccumulateGrad", None, detached[0].src, ""))
    assert text.startswith("AccumulateGrad, autograd's own step") and f"{HERE}:{first}" in text


def test_warning_header_names_a_cell_as_messages_do():
    loc = xlanb.SourceLoc("/tmp/ipykernel_1/2661902393.py", 12, "<module>")
    xlanb.set_location_labeler(files=lambda f: "In[2]" if f == loc.file else None)
    try:
        assert loc.short == "In[2]:12 <module>" and xlanb.file_label(loc.file) == "In[2]"
        from xlanb.base.frames import warn_at
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            warn_at(loc, "compiles too frequent", xlanb.RecompileWarning)
        w, = got
        header = warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
        assert header.startswith("In[2]:12: RecompileWarning"), header
    finally:
        xlanb.set_location_labeler(None)
    assert xlanb.file_label(loc.file) == loc.file


@pytest.fixture
def shell(monkeypatch):
    monkeypatch.delenv("PYTHONBREAKPOINT", raising=False)
    ip = InteractiveShell.instance()
    # other tests in this process may have left it loaded: start from unloaded
    xlanb.unload_ipython_extension(ip)
    yield ip
    xlanb.unload_ipython_extension(ip)


def test_load_ext_gives_breakpoint_and_debug_the_x_commands(shell):
    hook, debugger = sys.breakpointhook, shell.InteractiveTB.debugger_cls
    show = warnings.showwarning
    xlanb.load_ipython_extension(shell)
    assert warnings.showwarning is not show  # names cells In[N] in warning headers
    from xlanb.extensions.pdb import XlaPdb
    assert sys.breakpointhook is not hook
    assert issubclass(shell.InteractiveTB.debugger_cls, (XlaPdb, debugger))
    assert hasattr(shell.InteractiveTB.debugger_cls, "do_xsync")
    assert xlanb.DeviceMemoryError in shell.custom_exceptions
    xlanb.unload_ipython_extension(shell)
    assert sys.breakpointhook is hook and shell.InteractiveTB.debugger_cls is debugger
    assert warnings.showwarning is show
    assert shell.custom_exceptions == ()


def test_pythonbreakpoint_set_by_the_user_wins(shell, monkeypatch):
    monkeypatch.setenv("PYTHONBREAKPOINT", "pdb.set_trace")
    hook = sys.breakpointhook
    xlanb.load_ipython_extension(shell)
    assert sys.breakpointhook is hook


def test_deliberate_error_ends_at_the_users_line(shell):
    xlanb.load_ipython_extension(shell)
    shell.run_cell("import torch, xlanb\nbig = torch.randn(64, 64, device='xla')",
                   store_history=True)
    with capture_output() as c:
        res = shell.run_cell("with xlanb.memory_limit('1KiB'):\n"
                             "    big2 = (big @ big).sum()\n"
                             "    xlanb.sync()\n", store_history=True)
    assert isinstance(res.error_in_exec, xlanb.DeviceMemoryError)
    out = c.stdout + c.stderr
    assert "DeviceMemoryError" in out and "would not fit" in out
    assert "pending/realize.py" not in out and "memory.py" not in out, out
    # %debug still walks every frame, down to where it was raised
    frames = __import__("traceback").extract_tb(sys.last_traceback)
    assert frames[-1].filename.endswith("memory.py"), frames


def test_store_hits_read_as_part_of_the_compiles_not_against_them():
    from xlanb.base import metrics
    saved = {n: metrics.counter_value(n) for n in metrics.counter_names()}
    metrics.clear()
    try:
        metrics.counter("UncachedCompile")
        metrics.counter("PersistentCacheHit")
        text = metrics.short_report(["UncachedCompile", "PersistentCacheHit"])
        assert "PersistentCacheHit: 1 (of the UncachedCompile counts: loaded from the " \
               "on-disk store, not compiled)" in text, text
        assert metrics.short_report("PersistentCacheHit") == "PersistentCacheHit: 1\n"
        assert "loaded from the on-disk store" in metrics.DESCRIPTIONS["UncachedCompile"]
    finally:
        metrics.clear()
        for n, v in saved.items():
            metrics.counter(n, v)


def test_getting_started_script_prints_a_few_lines(capsys):
    import os
    import re
    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "getting-started.md")).read()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    exec(compile(code, "getting-started.md", "exec"), {})
    out = capsys.readouterr().out
    assert "UncachedCompile" in out and len(out.splitlines()) <= 10, out


def test_a_registered_folder_is_never_the_users_line(tmp_path):
    """A front end outside the package registers its folder once
    (``xlanb.register_internal``): an op made by code there is credited to its caller,
    as an op made by xlanb's own code is; the registry is frames' one answer."""
    helper = tmp_path / "frontend" / "helper.py"
    helper.parent.mkdir()
    helper.write_text("def double(t):\n    return t * 2\n")
    sys.path.insert(0, str(helper.parent))
    try:
        import helper as mod
        x = torch.ones(3, device="xla")

        def src_of_double():
            return xlanb.pending_summary(mod.double(x)).ops[-1].src
        caller_line = sys._getframe().f_lineno - 1
        with xlanb.mode("lazy"):
            before = src_of_double()
            xlanb.register_internal(str(helper.parent))
            after = src_of_double()
        assert (before.file, before.line) == (str(helper), 2)  # not registered yet
        assert (after.file, after.line) == (__file__, caller_line), after
        assert xlanb.is_internal_frame(sys._getframe()) is False
    finally:
        sys.path.remove(str(helper.parent))
        sys.modules.pop("helper", None)
