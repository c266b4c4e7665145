"""The widgets in a browser: execute examples/widgets_tour.ipynb under the xlanb kernel with
widget state saved (nbclient), export it to HTML (nbconvert), open that in headless
Chromium and check that the graphs rendered: SVG elements with graph nodes in the DOM, and
a screenshot that is not blank.

The exported page loads the widget renderer from a CDN, which a machine offline cannot
reach; the notebook's ``.snapshot()`` cells put the same SVG in the page without JavaScript,
and the saved widget state is checked to hold it too (what an online viewer renders).

Skipped without Chromium (Debian's ``chromium``), nbconvert or Graphviz's ``dot``. With
``UPDATE_DOCS_IMAGES=1`` the screenshot is also written to docs/images/graphview.png.
"""
from __future__ import annotations

import copy
import os
import pathlib
import re
import shutil
import struct
import subprocess

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
nbconvert = pytest.importorskip("nbconvert")
pytest.importorskip("ipykernel")
pytest.importorskip("ipywidgets")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

from xlanb.kernel import spec  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "widgets_tour.ipynb"
DOCS_IMAGE = ROOT / "docs" / "images" / "graphview.png"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome",
                                           "google-chrome-stable") if shutil.which(n)), None)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed "
                       "(apt-get install chromium)"),
    pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed"),
]

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# A Graphviz node as Chromium serializes it (attribute order may change): its id is the title.
_NODE = re.compile(r'<g\b[^>]*\bclass="node"[^>]*>\s*<title>(n\d+|s_\w+)</title>')


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The tour notebook, run top to bottom from a clean slate, widget state saved."""
    prefix = str(tmp_path_factory.mktemp("nbkernel"))
    spec.install("xlanb-widgets-test", prefix=prefix, mode="lazy")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    km = KernelManager(kernel_name="xlanb-widgets-test", kernel_spec_manager=KernelSpecManager(
        kernel_dirs=[os.path.join(prefix, "share", "jupyter", "kernels")]))
    client = nbclient.NotebookClient(nb, km=km, timeout=300, startup_timeout=120,
                                     store_widget_state=True,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("XLANB_")]:
            mp.delenv(k)
        # a store of its own: a clean slate, and nothing left in the user's own
        mp.setenv("XLANB_STORE_DIR", str(tmp_path_factory.mktemp("store")))
        mp.setenv("PYTHONWARNINGS", os.environ.get("PYTHONWARNINGS", "ignore"))
        try:
            client.execute()
        finally:  # nbclient shuts down only kernels it started itself (km=None)
            km.shutdown_kernel(now=True)
    return nb


def _export(nb, path: pathlib.Path) -> pathlib.Path:
    from nbconvert import HTMLExporter
    body, _ = HTMLExporter().from_notebook_node(nb)
    path.write_text(body, encoding="utf-8")
    return path


def _chromium(*args: str, tmp: pathlib.Path) -> subprocess.CompletedProcess:
    profile = tmp / "chromium-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
           "--window-size=1400,1000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_the_tour_runs_and_saves_widget_state(executed):
    code = [c for c in executed.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    views = [o for c in code for o in c.outputs if WIDGET_VIEW in o.get("data", {})]
    assert len(views) == 3  # GraphView, MetricsDashboard, GraphDiff
    state = executed.metadata["widgets"][WIDGET_STATE]["state"]
    html_values = [m["state"].get("value", "") for m in state.values()
                   if m.get("model_name") == "HTMLModel"]
    graphs = [v for v in html_values if "<svg" in v and 'class="node"' in v]
    assert len(graphs) >= 3, "the GraphView and both GraphDiff sides hold a drawn graph"
    assert any("<title>n" in v and "gelu" in v for v in graphs)
    assert any("Where the time went" in v for v in html_values)  # the dashboard's charts


def test_exported_html_shows_the_graphs_in_chromium(executed, tmp_path):
    page = _export(executed, tmp_path / "widgets_tour.html")
    text = page.read_text(encoding="utf-8")
    assert WIDGET_STATE in text  # online, the widget renderer draws the saved state
    res = _chromium("--dump-dom", page.as_uri(), tmp=tmp_path)
    dom = res.stdout
    assert "</html>" in dom, res.stderr[-2000:]
    svgs = re.findall(r"<svg\b.*?</svg>", dom, flags=re.S)
    graphs = [s for s in svgs if _NODE.search(s)]
    assert len(graphs) >= 4, f"{len(svgs)} SVGs, {len(graphs)} graphs"  # view, matches, diff x2
    nodes = _NODE.findall(graphs[0])
    assert len(nodes) >= 5 and any(n.startswith("s_") for n in nodes)  # opened collapsed
    assert "#f5b041" in graphs[0]  # the GELU matches, highlighted
    assert "Where the time went" in dom and "why it recompiled" in dom


def test_screenshot_of_the_graph_view(executed, tmp_path):
    """The cell tagged "screenshot" (the GraphView snapshot), exported alone, as a PNG."""
    nb = copy.deepcopy(executed)
    nb.cells = [c for c in nb.cells if "screenshot" in c.metadata.get("tags", [])]
    assert len(nb.cells) == 1
    page = _export(nb, tmp_path / "graphview.html")
    shot = tmp_path / "graphview.png"
    res = _chromium(f"--screenshot={shot}", page.as_uri(), tmp=tmp_path)
    assert shot.exists(), res.stderr[-2000:]
    assert _png_size(shot) == (1400, 1000)
    assert shot.stat().st_size > 30_000, "a blank page compresses to a few kB"
    if os.environ.get("UPDATE_DOCS_IMAGES") == "1":
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGE)

