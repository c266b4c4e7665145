"""pdb over xla tensors (issue 7): real pdb sessions in subprocesses, driven through stdin.

The script is ``examples/pdb_seed003.py`` (seeds/003: four ``nn.Linear`` layers, one
``xlanb.sync()``). ``XLANB_STOPS`` says where it calls ``breakpoint()``; the last line it
prints is JSON with the compile counters, the compiled graphs' hashes and the final values.
Each session feeds pdb a list of commands; pdb prints a prompt before reading each one, so
splitting the transcript on the prompt gives each command's output.

All sessions are started together on first use, in a small thread pool, so the file costs
about as much as its slowest few sessions.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import pdb
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import xlanb
from xlanb.extensions.pdb import XlaPdb
from support import child_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "pdb_seed003.py"
PROMPT = "(Pdb) "
TIMEOUT = 120

HELP_COMMANDS = ("xla", "xpeek", "xpending", "xhlo", "xsync", "xmode", "xgraphs")


def _env(**extra) -> dict:
    return child_env({k: v for k, v in extra.items() if v is not None},
                     PYTHONIOENCODING="utf-8")


class Session:
    """One run of the script: the pdb transcript split per command, and its JSON."""

    def __init__(self, commands, stdout: str, stderr: str, returncode: int):
        self.commands = list(commands)
        self.stdout = stdout
        self.stderr = stderr
        self.returncode = returncode
        parts = stdout.split(PROMPT)
        self.header = parts[0]
        self.outputs = parts[1:]   # outputs[i]: what commands[i] printed (and where it stopped)
        last = [ln.split(PROMPT)[-1] for ln in stdout.splitlines()
                if ln.split(PROMPT)[-1].startswith("{")]
        self.result = json.loads(last[-1]) if last else None

    def check(self) -> "Session":
        assert self.returncode == 0, f"script failed ({self.returncode}):\n{self.stderr[-3000:]}\n{self.stdout[-3000:]}"
        assert self.result is not None, f"no JSON line:\n{self.stdout[-3000:]}"
        # One prompt per command: no command ended the session early.
        assert len(self.outputs) == len(self.commands), (
            f"{len(self.commands)} commands, {len(self.outputs)} prompts:\n{self.stdout[-4000:]}")
        return self

    def out(self, command: str, nth: int = 0) -> str:
        hits = [o for c, o in zip(self.commands, self.outputs) if c == command]
        return hits[nth]


def _run(mode: str, stops: str, commands=(), xla_pdb: bool = False) -> Session:
    env = _env(XLANB_MODE=mode, XLANB_STOPS=stops,
               PYTHONBREAKPOINT="xlanb.set_trace" if xla_pdb else None)
    stdin = "".join(c + "\n" for c in commands)
    proc = subprocess.run([sys.executable, str(SCRIPT)], input=stdin, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=TIMEOUT)
    return Session(commands, proc.stdout, proc.stderr, proc.returncode)


# ---------------------------------------------------------------------------------------
# The sessions

# Plain pdb (breakpoint() with no set-up): print output1 three ways, step on, print
# output4; at the second stop, just before the sync, read values the way seeds/003 does
# (.to('cpu')), and with .cpu(), .item() and .tolist().
LAZY_A = ("p output1", "pp output1", "output1", "n", "n", "n", "p output4", "c",
          "output4", "p output1.cpu()", "p output4.sum().item()", "p output3.tolist()",
          "p output4.to('cpu')", "c")
# XlaPdb through PYTHONBREAKPOINT: print output3, then step (s) through the rest of main().
LAZY_B = ("p output3", "xpeek output3") + ("s",) * 10 + ("c",)
EAGER_STOPS = ("p inp", "c", "p output1", "pp output2", "c", "output4", "c")
COMMANDS = (
    *(f"help {c}" for c in HELP_COMMANDS),
    "xla",
    "xpeek output4",
    "xpeek (output1, output4)",
    "xpending output4",
    "xpending output4 --depth 1",
    "xpending",
    "xhlo output4",
    "xhlo output4 --hlo",
    # bad input: one line each, and the session goes on
    "xpeek nosuchname",
    "xpeek 3",
    "xpeek",
    "xpeek inp.cpu()",
    "xpeek [",
    "xpending output4 --depth x",
    "xpending output4 --deep 3",
    "xhlo 'text'",
    "xmode fast",
    "xla extra",
    "xgraphs",
    # compiling the whole pending graph for its optimized HLO is the graph the sync runs
    "xhlo --optimized",
    "xsync",
    "xsync",
    "xla",
    "xgraphs",
    "xpending output4",
    "xmode",
    "xmode eager",
    "xla",
    "xmode lazy",
    "p 1 + 1",
    "c",
)


def _tab_session() -> dict | None:
    """XlaPdb on a terminal (pexpect): readline's TAB goes through the complete_* methods."""
    try:
        import pexpect
    except ImportError:
        return None
    env = _env(XLANB_MODE="lazy", XLANB_STOPS="after4", PYTHONBREAKPOINT="xlanb.set_trace",
               TERM="dumb")
    child = pexpect.spawn(sys.executable, [str(SCRIPT)], env=env, cwd=str(ROOT),
                          encoding="utf-8", timeout=TIMEOUT, dimensions=(40, 200))
    seen = {}
    try:
        child.expect_exact(PROMPT)
        # readline handles the keys in order: TAB completes before the rest is read. Each
        # result proves the completion, since the uncompleted text is bad input.
        for key, typed in (("xmode", "xmode op\t\r"), ("xpeek", "xpeek in\t\r"),
                           ("xpending", "xpending output4 --de\t1\r"), ("xla", "xla\r")):
            child.send(typed)
            child.expect_exact(PROMPT)
            seen[key] = child.before
        child.send("c\r")
        child.expect(pexpect.EOF)
        seen["end"] = child.before
    finally:
        child.close(force=True)
    return seen


SESSIONS = {
    # seeds/003's three users: stops in different places, or none at all.
    "A": lambda: _run("lazy", "after2,after4", LAZY_A),          # plain pdb
    "B": lambda: _run("lazy", "after3", LAZY_B, xla_pdb=True),    # PYTHONBREAKPOINT=xlanb.set_trace
    "C": lambda: _run("lazy", ""),
    "eager_stops": lambda: _run("eager", "start,after2,after4", EAGER_STOPS),
    "eager_none": lambda: _run("eager", ""),
    "commands": lambda: _run("lazy", "after4", COMMANDS, xla_pdb=True),
    "tab": _tab_session,
}

_lock = threading.Lock()
_futures: dict = {}


def session(name: str) -> Session:
    with _lock:
        if not _futures:
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(4, max(2, os.cpu_count() or 2)))
            for key, fn in SESSIONS.items():
                _futures[key] = pool.submit(fn)
            pool.shutdown(wait=False)
    return _futures[name].result(timeout=4 * TIMEOUT)


_FLOAT = re.compile(r"-?\d+\.\d+(?:e[+-]?\d+)?")


def printed_values(text: str) -> list[float]:
    """The numbers in a printed tensor (its repr rounds them to 4 decimals)."""
    return [float(v) for v in _FLOAT.findall(text)]


def _flat(x) -> list:
    return [v for item in x for v in _flat(item)] if isinstance(x, (list, tuple)) else [x]


def assert_printed(text: str, final, atol: float = 1e-4) -> None:
    want = torch.tensor(_flat(final))
    got = torch.tensor(printed_values(text))
    assert got.shape == want.shape, (text, final)
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


# ---------------------------------------------------------------------------------------
# seeds/003 in lazy mode: where you stop and what you print never changes the compile

def test_lazy_breakpoints_compile_the_same_graph():
    a, b, c = (session(k).check().result for k in "ABC")
    for r in (a, b, c):
        assert r["mode"] == "lazy"
        assert r["counters"]["UncachedCompile"] == 1, r["counters"]
        assert r["counters"]["CachedCompile"] == 0, r["counters"]
    hashes = {tuple(g["hash"] for g in r["graphs"]) for r in (a, b, c)}
    assert len(hashes) == 1, hashes
    assert c["graphs"][0]["n_nodes"] == 8  # 4 x (t, addmm): the whole forward, one graph
    # Peeks compiled single ops only; the run that printed nothing compiled none.
    assert c["counters"]["OpCompile"] == 0
    assert a["counters"]["OpCompile"] > 0 and b["counters"]["OpCompile"] > 0


def test_plain_pdb_p_pp_and_bare_expression_peek():
    """Session A: plain pdb (breakpoint() with no set-up) prints output1 with p, pp and a
    bare expression, steps on with n, prints output4; then stops again before the sync."""
    s = session("A").check()
    final = s.result["values"]
    for cmd in ("p output1", "pp output1", "output1"):
        out = s.out(cmd)
        assert "device='xla:0'" in out, out
        assert_printed(out.split("device=")[0], final["output1"])
    assert "pdb_seed003.py" in s.out("n", 2) and "output4 = linear4(output3)" in s.out("n", 1)
    for cmd in ("p output4", "output4"):
        assert_printed(s.out(cmd).split("device=")[0], final["output4"])


def test_xla_pdb_via_pythonbreakpoint():
    """Session B: ``PYTHONBREAKPOINT=xlanb.set_trace`` makes breakpoint() an XlaPdb."""
    s = session("B").check()
    final = s.result["values"]["output3"]
    assert "output4 = linear4(output3)" in s.header  # stopped in the user's frame
    assert_printed(s.out("p output3").split("device=")[0], final)
    assert_printed(s.out("xpeek output3"), final)


def test_cpu_item_tolist_peek_while_debugger_is_stopped():
    """``.cpu()``, ``.item()``, ``.tolist()`` and ``.to('cpu')`` at a pdb prompt peek
    (needs core's ``xlanb.debugging.debugger_active()``): same single graph as no stops."""
    s = session("A").check()
    final = s.result["values"]
    assert_printed(s.out("p output1.cpu()").split("grad_fn")[0], final["output1"])
    assert_printed(s.out("p output4.to('cpu')").split("grad_fn")[0], final["output4"])
    assert abs(float(s.out("p output4.sum().item()")) - sum(v[0] for v in final["output4"])) < 1e-5
    assert_printed(s.out("p output3.tolist()"), final["output3"], atol=1e-5)
    assert s.result["counters"]["UncachedCompile"] == 1, s.result["counters"]
    assert s.result["graphs"] == session("C").check().result["graphs"]


# ---------------------------------------------------------------------------------------
# Eager mode: what the program compiles does not depend on where you stop

def test_eager_op_compiles_do_not_depend_on_breakpoints():
    """Without stops the forward's new ops are one eager run, one graph. A stop looks
    (peeks) and never cuts the run: the looks compile the ops they need alone, and the
    run then runs through those executables, op by op. Either way no graph of a prefix
    compiles, and the values are the same."""
    stops = session("eager_stops").check()
    none = session("eager_none").check().result
    assert stops.result["mode"] == none["mode"] == "eager"
    assert none["counters"]["EagerRunCompile"] == 1 and len(none["graphs"]) == 1
    assert none["graphs"][0]["n_nodes"] == 8  # 4 x (t, addmm)
    assert all(g in none["graphs"] for g in stops.result["graphs"])
    assert stops.result["counters"]["UncachedCompile"] == none["counters"]["UncachedCompile"] == 0
    assert_printed(stops.out("p output1").split("device=")[0], none["values"]["output1"])
    assert_printed(stops.out("output4").split("device=")[0], none["values"]["output4"])
    # eager and lazy agree
    lazy = session("C").check().result["values"]
    for k, v in none["values"].items():
        torch.testing.assert_close(torch.tensor(v), torch.tensor(lazy[k]), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# The XlaPdb commands

def test_every_command_has_help():
    s = session("commands").check()
    for c in HELP_COMMANDS:
        out = s.out(f"help {c}")
        usage = out.strip().removeprefix("Usage: ")     # Python >= 3.13 adds "Usage: "
        assert usage.startswith(c), out                 # usage line first, as pdb's own
        assert len(out.strip().splitlines()) >= 2, out  # and what it does
        assert "***" not in out


def test_commands_work():
    s = session("commands").check()
    final = s.result["values"]
    xla = s.out("xla", 0)
    assert "mode     lazy" in xla and "pending  8 ops" in xla and "0 compiled" in xla, xla
    assert_printed(s.out("xpeek output4"), final["output4"])
    assert_printed(s.out("xpeek (output1, output4)"), final["output1"] + final["output4"])
    ir = s.out("xpending output4", 0)
    assert ir.count("aten::addmm") == 4 and "outputs:" in ir and "pdb_seed003.py:42" in ir, ir
    shallow = s.out("xpending output4 --depth 1")
    assert shallow.count("aten::addmm") == 1 and "not shown" in shallow, shallow
    assert s.out("xpending").count("aten::addmm") == 4
    assert "stablehlo.dot_general" in s.out("xhlo output4")
    assert "HloModule" in s.out("xhlo output4 --hlo")
    assert s.out("xgraphs", 0).strip() == "no compiled graphs yet"
    assert "HloModule" in s.out("xhlo --optimized")
    assert s.out("xsync", 0).startswith("synced 8 ops") and "1 graph from the cache" in s.out("xsync", 0)
    # the core's one duration format, as the magics write it (not "0.218s")
    assert re.match(r"synced 8 ops in \d[\d.]* (s|ms|µs)\b", s.out("xsync", 0)), s.out("xsync", 0)
    assert s.out("xsync", 1).strip() == "nothing pending"
    xla = s.out("xla", 1)
    assert "pending  0 ops" in xla and "1 compiled, 1 cache hits" in xla, xla
    table = s.out("xgraphs", 1)
    assert s.result["graphs"][0]["hash"][:12] in table and "pdb xsync" not in table.splitlines()[0]
    assert s.out("xpending output4", 1).strip() == "no pending ops: output4 is device data"
    assert s.out("xmode").strip().startswith("mode: lazy")
    assert s.out("xmode eager").strip() == "mode: lazy -> eager"
    assert "mode     eager" in s.out("xla", 2)
    assert s.out("xmode lazy").strip() == "mode: eager -> lazy"
    assert s.out("p 1 + 1").strip() == "2"
    # Everything the session did compiled exactly the graph a run with no stops compiles.
    assert s.result["counters"]["UncachedCompile"] == 1
    assert s.result["graphs"] == session("C").check().result["graphs"]


@pytest.mark.parametrize("command, says", [
    ("xpeek nosuchname", "NameError: name 'nosuchname' is not defined"),
    ("xpeek 3", "not a tensor on the xla device (it is int)"),
    ("xpeek", "usage: xpeek EXPR"),
    ("xpeek inp.cpu()", "is a tensor on cpu, not on the xla device"),
    ("xpeek [", "is not a valid expression"),
    ("xpending output4 --depth x", "--depth needs a positive integer, got 'x'"),
    ("xpending output4 --deep 3", "unknown option --deep"),
    ("xhlo 'text'", "not a tensor on the xla device (it is str)"),
    ("xmode fast", "unknown xlanb mode 'fast'; valid modes are: lazy, eager, opbyop"),
    ("xla extra", "takes no arguments"),
])
def test_bad_input_is_one_line_and_the_session_goes_on(command, says):
    s = session("commands").check()  # check(): every later command still got its prompt
    out = s.out(command)
    assert out.count("\n") == 1 and out.startswith("*** "), repr(out)
    assert says in out, out


# ---------------------------------------------------------------------------------------
# Stepping never lands inside xlanb

# pdb's "where am I" line, at the start of a line or right after a prompt
_WHERE = re.compile(r"(?:^|\(Pdb\) )> (?P<file>.+?)\((?P<line>\d+)\)(?P<func>[^()\s]+)\(\)", re.M)


def test_stepping_skips_xlanb_internals():
    """Session B steps (s) from output4's line to the end of main(): it goes into
    Linear.forward and back, and never stops in xlanb, JAX or torch's dispatch plumbing."""
    s = session("B").check()
    stops = [(m["file"], int(m["line"]), m["func"]) for m in _WHERE.finditer(s.stdout)]
    assert len(stops) >= 10, s.stdout[-3000:]
    files = {os.path.basename(f) for f, _, _ in stops}
    assert files <= {"pdb_seed003.py", "linear.py"}, stops  # never xlanb, jax or torch plumbing
    assert "forward" in {fn for _, _, fn in stops}, stops  # s on a layer call: its forward()
    lines = [ln for f, ln, _ in stops if f == str(SCRIPT)]
    src = SCRIPT.read_text().splitlines()
    sync_line = next(i for i, t in enumerate(src, 1) if t.strip() == "xlanb.sync()")
    # s on xlanb.sync() goes straight to the next line of the script
    assert sync_line in lines and lines[lines.index(sync_line) + 1] == sync_line + 1, lines


# ---------------------------------------------------------------------------------------
# In-process: tab completion, display, the skip rule

@pytest.fixture
def dbg():
    import io
    d = XlaPdb(stdout=io.StringIO(), readrc=False)
    d.reset()  # as set_trace does: no stop frame, no bottom frame yet
    return d


def test_tab_completion_on_a_terminal():
    seen = session("tab")
    if seen is None:
        pytest.skip("pexpect is not installed")
    assert "mode: lazy -> opbyop" in seen["xmode"], seen          # xmode op<TAB>
    assert "tensor([[" in seen["xpeek"] and "***" not in seen["xpeek"], seen  # xpeek in<TAB>
    assert "not shown (depth=1)" in seen["xpending"], seen      # --de<TAB>1
    assert "mode     opbyop" in seen["xla"], seen
    assert '"mode": "opbyop"' in seen["end"], seen


def test_tab_completion(dbg):
    output_a = torch.ones(2, device="xla")  # noqa: F841 - completed below
    dbg.setup(sys._getframe(), None)
    assert dbg.complete_xmode("", "xmode ", 6, 6) == list(xlanb.MODES)
    assert dbg.complete_xmode("e", "xmode e", 6, 7) == ["eager"]
    assert dbg.complete_xpeek("output_", "xpeek output_", 6, 13) == ["output_a"]
    assert "output_a.shape" in dbg.complete_xpeek("output_a.sh", "xpeek output_a.sh", 6, 17)
    assert dbg.complete_xpending("--d", "xpending x --d", 11, 14) == ["--depth "]
    assert dbg.complete_xhlo("--", "xhlo x --", 7, 9) == ["--hlo ", "--stablehlo ", "--optimized "]
    assert dbg.complete_xhlo("outp", "xhlo outp", 5, 9) == ["output_a"]
    # cmd's completer routes "xmode <TAB>" to complete_xmode
    assert "xpeek" in dbg.completenames("xp") and "xpending" in dbg.completenames("xp")


def test_display_of_a_rebound_tensor_peeks_and_never_crashes(dbg):
    """pdb's display compares with ``!=``, which for tensors is an elementwise op whose
    bool() fails; XlaPdb treats a new tensor object as a change and shows it (a peek)."""
    with xlanb.mode("lazy"):
        h = torch.ones(2, 3, device="xla") * 2
        frame = sys._getframe()
        dbg.setup(frame, None)
        dbg.onecmd("display h")
        h = h + 1  # noqa: F841 - rebound: display shows the new value
        dbg.setup(frame, None)
        before = xlanb.metrics.counter_value("UncachedCompile") or 0
        if hasattr(pdb.Pdb, "_show_display"):
            dbg._show_display()  # Python >= 3.13: interaction() calls it
        else:
            dbg.preloop()        # older: cmd's loop calls preloop()
        out = dbg.stdout.getvalue()
        assert "display h: tensor([[3., 3., 3.]" in out and "[old: tensor([[2., 2., 2.]" in out, out
        assert (xlanb.metrics.counter_value("UncachedCompile") or 0) == before
        assert xlanb.pending_count() > 0  # still lazy: looking cut nothing


def test_stop_here_skips_frames_called_from_xlanb(dbg):
    from xlanb.extensions import pdb as xpdb
    dbg.stopframe = None  # as while stepping with s: stop at the first frame allowed
    seen = {}

    def probe():
        here = sys._getframe()
        seen["internal"] = xpdb._called_from_core(here)
        seen["stops"] = dbg.stop_here(here)

    # A function in an xlanb module calls probe: probe's frame counts as xlanb's too.
    ns = {"__name__": "xlanb.fake_internal"}
    exec(compile("def run(f):\n    return f()\n", "<xlanb>", "exec"), ns)
    ns["run"](probe)
    assert seen == {"internal": True, "stops": False}
    probe()  # called from the test: user code
    assert seen == {"internal": False, "stops": True}
    # Front ends under xlanb.extensions (this debugger) are not internal: user code runs below them.
    assert not xpdb._is_core_module("xlanb.extensions.pdb")
    assert xpdb._is_core_module("xlanb") and xpdb._is_core_module("xlanb.dispatch")
