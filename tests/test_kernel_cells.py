"""Through a real kernel (jupyter_client), what a notebook user reads (issue 38):

- each cell magic names its own cell, whatever IPython's ``execution_count`` says;
- no output holds the kernel's temp file for a cell (``/tmp/ipykernel_N/123.py``):
  warning headers, the collectives' source column, pdb's header, a sync from pdb;
- an error xlanb raises on purpose shows at most one xlanb frame;
- ``breakpoint()`` has the ``x*`` commands once the extension is loaded.

Each check runs on xlanb's kernel (the extension loaded at startup, ``%load_ext`` a no-op)
and on the standard ``python3`` kernel the notebooks use, where ``%load_ext xlanb`` in the
first cell loads it. One kernel of each kind serves the whole module (starting one costs
seconds).
"""
from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_client")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

from xlanb.kernel import spec  # noqa: E402

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TEMP = re.compile(r"ipykernel_\d+|\b\d{6,}\.py")  # ipykernel's name for a cell's code


@pytest.fixture(scope="module", params=["xlanb", "python3"])
def kc(request, tmp_path_factory):
    if request.param == "xlanb":
        prefix = str(tmp_path_factory.mktemp("kernels"))
        spec.install("xlanb-cells-test", prefix=prefix)
        ksm = KernelSpecManager(kernel_dirs=[os.path.join(prefix, "share", "jupyter",
                                                          "kernels")])
        km = KernelManager(kernel_name="xlanb-cells-test", kernel_spec_manager=ksm)
    else:  # what the README's notebooks run on: ipykernel's own, this interpreter
        km = KernelManager(kernel_name="python3")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("XLANB_") and k != "PYTHONBREAKPOINT"}
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    env["XLANB_STORE_DIR"] = os.environ.get("XLANB_STORE_DIR", "")
    km.start_kernel(env=env)
    client = km.client()
    client.kind = request.param
    client.start_channels()
    client.wait_for_ready(timeout=120)
    yield client
    client.stop_channels()
    km.shutdown_kernel(now=True)


def run(kc, code: str, stdin: tuple = ()):
    """Run a cell; return (execution count, status, everything it showed as plain text).
    ``stdin`` answers input prompts (pdb's) in order."""
    msgs = []
    answers = list(stdin)

    def on_input(msg):
        kc.input(answers.pop(0) if answers else "c")

    reply = kc.execute_interactive(code, timeout=180, output_hook=msgs.append,
                                   allow_stdin=bool(stdin), stdin_hook=on_input)
    text = []
    for m in msgs:
        c = m["content"]
        if m["msg_type"] == "stream":
            text.append(c["text"])
        elif m["msg_type"] in ("display_data", "execute_result"):
            text.append(c["data"].get("text/plain", ""))
        elif m["msg_type"] == "error":
            text.append("\n".join(c["traceback"]))
    out = ANSI.sub("", "\n".join(text))
    assert not TEMP.search(out), out  # never a kernel temp file, whatever the cell did
    return reply["content"]["execution_count"], reply["content"]["status"], out


def test_load_ext_is_silent(kc):
    # notebooks say %load_ext xlanb, to run on a plain python3 kernel too (where it
    # loads xlanb); on xlanb's kernel it is already loaded, and says nothing about it
    loaded = "print('xla_pending' in get_ipython().magics_manager.magics['line'])"
    assert run(kc, loaded)[2].strip() == str(kc.kind == "xlanb")
    n, status, out = run(kc, "%load_ext xlanb\nimport torch, xlanb\n"
                             "x = torch.randn(16, 16, device='xla')")
    assert status == "ok" and "already loaded" not in out, out
    _, status, out = run(kc, loaded)
    assert status == "ok" and out.strip() == "True", out


def test_cell_magics_name_their_own_cell(kc):
    # IPython 9 advances execution_count before the cell runs: the magics must not read it
    n, status, out = run(kc, "%%xla_explain\ny = x @ x\nz = y.relu()\nxlanb.sync()\n")
    assert status == "ok"
    assert f"synced at  In[{n}]:4" in out, (n, out)
    assert f"In[{n + 1}]" not in out
    n, status, out = run(kc, "%%xla_profile\nw = (x * 2).sum()\nxlanb.sync()\n")
    assert status == "ok"
    assert f"In[{n}]:2" in out and f"In[{n + 1}]" not in out, (n, out)
    # the same under IPython 8 (what CI has), with the count one ahead as IPython 9 has it
    n, status, out = run(kc, "ip = get_ipython()\nip.execution_count += 1\ntry:\n"
                             "    ip.run_cell_magic('xla_explain', '', 'v = x @ x\\nxlanb.sync()')\n"
                             "finally:\n    ip.execution_count -= 1")
    assert status == "ok"
    assert f"synced at  In[{n}]:3" in out and f"In[{n + 1}]" not in out, (n, out)


def test_recompile_warning_and_collectives_name_the_cell(kc):
    n, status, out = run(kc, "import warnings\nwarnings.simplefilter('always')\n"
                             "for k in range(1, 6):\n"
                             "    t = torch.ones(k, device='xla') * 2\n"
                             "    xlanb.sync()\n")
    assert status == "ok"
    assert f"In[{n}]:5: RecompileWarning" in out, out  # the header, as the body says
    # any warning with a cell's line: torch's, the user's, xlanb's by stacklevel
    n, status, out = run(kc, "warnings.warn('from the cell')")
    assert f"In[{n}]:1: UserWarning: from the cell" in out, out
    assert "warnings.warn('from the cell')" in out, out  # with its code, as for a file
    n, status, out = run(kc, "import xlanb.spmd as xs\n"
                             "mesh = xs.Mesh(range(2), (2,), ('data',))\n"
                             "a = torch.randn(8, 4).to('xla')\n"
                             "xs.mark_sharding(a, mesh, ('data', None))\n"
                             "s = a.sum()\n"
                             "%xla_collectives s")
    assert status == "ok"
    assert "all-reduce" in out and f"In[{n}]:5" in out, out


def test_deliberate_error_shows_at_most_one_xlanb_frame(kc):
    n, status, out = run(kc, "big = torch.randn(256, 256, device='xla')\n"
                             "with xlanb.memory_limit('1KiB'):\n"
                             "    big2 = (big @ big).sum()\n"
                             "    xlanb.sync()\n")
    assert status == "error" and "DeviceMemoryError" in out
    frames = re.findall(r"^File (\S+):\d+", out, re.M)
    assert len([f for f in frames if "xlanb" in f]) <= 1, out
    assert f"In[{n}], line 4" in out, out  # the user's line is there
    # %debug starts at that line, with the x* commands; `down` still reaches xlanb
    _, status, out = run(kc, "%debug", stdin=("xla", "down", "q"))
    assert status == "ok" and f"> In[{n}](4)" in out and "pending" in out, out
    after = out.split("pending", 1)[1]  # IPython 9's `down` skips xlanb's modules unless asked
    assert "pending/realize.py" in after or "unignore_module" in after, out
    # XLA's own out-of-memory error: the message says it; JAX's frames under it are noise
    n, status, out = run(kc, "huge = torch.zeros(1 << 38, device='xla')  # 1 TiB\n"
                             "xlanb.sync()")
    assert status == "error" and "ran out of device memory" in out, out
    frames = re.findall(r"^File (\S+):\d+", out, re.M)
    assert len([f for f in frames if "xlanb" in f or "jax" in f]) <= 1, out
    run(kc, "del huge")
    # the others xlanb raises on purpose: a NaN's first op, a bad sharding (the sharded
    # work still pending from above is synced first: the NaN replay of a graph with
    # sharded inputs is another matter)
    run(kc, "xlanb.sync()")
    for code, name in (("with xlanb.debug_nans():\n"
                        "    bad = torch.log(torch.zeros(4, device='xla') - 1)\n"
                        "    xlanb.sync()", "NonFiniteError"),
                       ("xs.mark_sharding(torch.ones(4, 4).to('xla'), mesh, ('nope', None))",
                        "ShardingError")):
        n, status, out = run(kc, code)
        assert status == "error" and name in out, out
        frames = re.findall(r"^File (\S+):\d+", out, re.M)
        assert not [f for f in frames if "xlanb" in f], out
    run(kc, "del bad")


def test_breakpoint_has_the_x_commands_after_load_ext(kc):
    n, status, out = run(kc, "q = x + 1\nbreakpoint()\nr = 2\n",
                         stdin=("xla", "xsync", "xgraphs", "c"))
    assert status == "ok", out
    assert "NameError" not in out and "pending" in out and "synced" in out, out
    assert f"> In[{n}](2)" in out, out  # pdb's header names the cell
    sync = [line for line in out.splitlines() if "pdb xsync" in line]
    assert sync and f"In[{n}]:2" in sync[-1], out  # the line pdb stopped at, not pdb.py
