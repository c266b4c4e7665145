"""Every notebook in examples/ runs top to bottom under the xlanb kernel (nbclient), with no
cell errors (cells tagged ``raises-exception`` show an error on purpose).

The kernel spec is installed into a temporary prefix, so the machine's kernels are never
touched. With Graphviz's ``dot`` installed, ``%xla_pending`` cells must show SVG.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

from xlanb.kernel import spec  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
HAVE_DOT = shutil.which("dot") is not None


@pytest.fixture(scope="module")
def kernel_dirs(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("nbkernel"))
    spec.install("xlanb-nbtest", prefix=prefix, mode="lazy")
    return [os.path.join(prefix, "share", "jupyter", "kernels")]


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
# its 12-layer step takes minutes on 2 cores).
NOTEBOOK_ENV = {"07_tpu_from_a_laptop": {"BERT_LAYERS": "1"}}


def execute(path: pathlib.Path, kernel_dirs) -> "nbformat.NotebookNode":
    nb = nbformat.read(path, as_version=4)  # run under the xlanb kernel, whatever it names
    for cell in nb.cells:  # run from a clean slate, whatever was saved
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    km = KernelManager(kernel_name="xlanb-nbtest",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=kernel_dirs))
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLANB_")}
    client = nbclient.NotebookClient(nb, km=km, timeout=300, startup_timeout=120,
                                     resources={"metadata": {"path": str(EXAMPLES)}})
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("XLANB_")]:
            mp.delenv(k)
        mp.setenv("PYTHONWARNINGS", env.get("PYTHONWARNINGS", "ignore"))
        for k, v in NOTEBOOK_ENV.get(path.stem, {}).items():
            mp.setenv(k, v)
        client.execute()
    return nb


def test_there_are_example_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    assert len(names) >= 5, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_dirs):
    nb = execute(path, kernel_dirs)
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
        assert "BERT: 1 layers, hidden 768, 12 heads; 4 CPU devices" in all_text
        for batch in (8, 32, 128):
            assert re.search(rf"batch +{batch}: v5e:1x1 \(1 x TPU v5 lite\): peak .* of 16.0 GiB "
                             r"HBM per chip, (fits|DOES NOT FIT)", all_text), batch
        assert "pending ops left: 0" in all_text
        assert re.search(r"(memory|compute)-bound on TPU v5 lite", all_text)
        assert re.search(r"f32\[1000,1000\] +\{1,0:T\(8,128\)\} +3.8 MiB +3.9 MiB +\+2.4%", all_text)
        assert "v5e:2x2 (4 x TPU v5 lite)" in all_text and "all-reduce" in all_text
        assert re.search(r"xlanb.run: graph #\d+ .* on v5e:1x1", all_text), all_text[-2000:]
        html = [o for c in code for o in _outputs(c) if "text/html" in o.get("data", {})]
        assert any("xlanb-target" in o["data"]["text/html"] for o in html)
    if path.stem == "05_reading_hlo":
        assert "same module for 0.1 and 0.2: True" in all_text
    if path.stem == "sharding":
        assert "all-gather  f32[256]" in all_text and "aten::add_" in all_text
        assert "collective bytes per device per step: 38404 -> 37380" in all_text
        assert "unknown mesh axis 'batch'" in "".join(
            o.get("evalue", "") + o.get("text", "") for c in code for o in _outputs(c))
        assert "Shard(xla:0, [0:64], (64,))" in all_text
        assert "sharding={'data'} on mesh (data=2, model=4) (marked at" in all_text
