"""The documentation site (issue 59): it builds with warnings as errors, every public name,
magic, pdb command and setting has its entry, the README's first try runs as written, and
the pages render in a browser.

The build is the README's command (``python -m sphinx -W -b html docs ...``) into a
folder of the test's own, from scratch, as on a fresh clone; no notebook executes
(``nb_execution_mode = "off"``). The reference pages are written from the code when the
site builds, so the checks here enumerate the code's names independently and look for
each one's anchor, and for each help text as the shell prints it.
"""
from __future__ import annotations

import html
import inspect
import io
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import pytest

from support import child_env

pytest.importorskip("sphinx", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("myst_nb", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("furo", reason="the docs extra: pip install -e '.[docs]'")

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome",
                                           "google-chrome-stable") if shutil.which(n)), None)


class Site:
    def __init__(self, out: pathlib.Path, result: subprocess.CompletedProcess, seconds: float):
        self.out, self.result, self.seconds = out, result, seconds

    def page(self, name: str) -> str:
        return (self.out / name).read_text(encoding="utf-8")

    def ids(self, name: str | None = None) -> set[str]:
        pages = [self.out / name] if name else self.out.rglob("*.html")
        return {i for p in pages for i in re.findall(r'\bid="([^"]+)"', p.read_text("utf-8"))}

    def text(self, name: str) -> str:
        """A page's words, markup and permalink signs dropped, whitespace collapsed."""
        body = html.unescape(re.sub(r"<[^>]+>", " ", self.page(name))).replace("¶", " ")
        return " ".join(body.split())


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    out = tmp_path_factory.mktemp("docs") / "html"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-b", "html", "docs", str(out)],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    return Site(out, res, time.perf_counter() - t0)


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_site_builds_with_warnings_as_errors(site):
    log = site.result.stdout + site.result.stderr
    assert site.result.returncode == 0, log[-4000:]
    assert "build succeeded" in log and "WARNING" not in log, log[-4000:]
    print(f"docs build: {site.seconds:.1f} s")
    for page in ("index.html", "getting-started.html", "install.html", "notebooks.html",
                 "internals.html", "DESIGN.html", "benchmarks.html",
                 "examples/10_generate.html", "reference/api.html", "reference/magics.html",
                 "reference/pdb.html", "reference/settings.html", "reference/commands.html"):
        assert (site.out / page).exists(), page
    for guide in ("modes", "looking", "recompiles", "pdb", "widgets", "nans", "profiling",
                  "memory", "tpu", "sharding", "torch-xla"):
        assert (site.out / "guides" / f"{guide}.html").exists(), guide


def test_the_notebooks_are_rendered_with_their_stored_outputs(site):
    import nbformat
    for path in sorted((ROOT / "examples").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        page = site.text(f"examples/{path.stem}.html")
        title = next(c.source.splitlines()[0].lstrip("# ") for c in nb.cells
                     if c.cell_type == "markdown")
        assert _words(re.sub(r"[`*]", "", title)) in page, (path.name, title)
        streams = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("text", "").strip()]
        if streams:  # the first line a cell printed, as stored: nothing was run again
            line = next(line for line in streams[0]["text"].splitlines() if line.strip())
            assert _words(html.unescape(line)) in page, (path.name, line)


def test_every_public_name_has_an_entry(site):
    import xlanb
    import xlanb.widgets
    ids = site.ids()
    missing = []
    for name in xlanb.__all__:
        obj = getattr(xlanb, name)
        want = f"module-xlanb.{name}" if inspect.ismodule(obj) else f"xlanb.{name}"
        if want not in ids:
            missing.append(want)
    for module in (xlanb.metrics, xlanb.spmd, xlanb.distributed, xlanb.widgets):
        short = "xlanb." + module.__name__.rsplit(".", 1)[-1]
        for name in module.__all__:
            obj = getattr(module, name)
            if f"{short}.{name}" in ids:
                continue
            # a name the module re-exports from xlanb's own API has that one entry
            if getattr(xlanb, name, None) is obj and f"xlanb.{name}" in ids:
                continue
            missing.append(f"{short}.{name}")
    assert not missing, missing


def test_every_magic_and_pdb_command_has_its_own_help(site):
    import pdb
    from xlanb.extensions.ipython import XlaMagics
    from xlanb.extensions.pdb import XlaPdb
    ids, page = site.ids("reference/magics.html"), site.text("reference/magics.html")
    names = [n for kind in ("line", "cell") for n in XlaMagics.magics[kind]]
    assert len(names) >= 18
    for name in names:
        assert f"magic-{name}" in ids, name
        doc = inspect.getdoc(getattr(XlaMagics, name))  # what %name? shows
        body = doc.split("\n\n", 2)[-1] if doc.startswith("::") else doc
        assert _words(body) in page, name
    ids, page = site.ids("reference/pdb.html"), site.text("reference/pdb.html")
    commands = [n[3:] for n in dir(XlaPdb) if n.startswith("do_") and not hasattr(pdb.Pdb, n)]
    assert {"xla", "xpeek", "xpending", "xsync", "xtarget"} <= set(commands)
    for name in commands:
        assert f"pdbcommand-{name}" in ids, name
        out = io.StringIO()
        XlaPdb(stdout=out, readrc=False).do_help(name)  # what `help NAME` prints
        assert _words(out.getvalue()) in page, name


def test_every_setting_has_an_entry_with_its_default(site):
    from xlanb.base import config as c
    ids, page = site.ids("reference/settings.html"), site.text("reference/settings.html")
    source = pathlib.Path(inspect.getsourcefile(c)).read_text(encoding="utf-8")
    variables = sorted(set(re.findall(r"\bXLANB_[A-Z_]+\b", source)))
    assert len(variables) >= 30
    renamed = set(c.RENAMED_VARIABLES.values())  # listed with their new names
    for name in variables:
        if name in renamed:
            assert name in page, name
        else:
            assert f"setting-{name}" in ids, name
    fields = [f for f, v in vars(c.Config).items() if isinstance(v, c._Checked)]
    assert "strict_recompiles" in fields
    for field in fields:
        assert f"xlanb.config.{field}" in page, field
    # a default as a process without XLANB_* variables has it, and what the field takes
    i = page.index("XLANB_STRICT_RECOMPILES")
    assert "off (0)" in page[i:i + 600] and "1 or 0" in page[i:i + 600]
    i = page.index("XLANB_EAGER_RUNS")
    assert re.search(r"Default\s*:\s*2048\b", page[i:i + 600]), page[i:i + 600]


# --------------------------------------------------------------------------- README

def _first_try() -> tuple[list[str], list[str]]:
    """The README's first try: the lines of its IPython block, and the pdb commands."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("<!-- first-try")[1].split("<!-- /first-try -->")[0]
    cells = re.search(r"```ipython\n(.*?)```", section, re.S).group(1).splitlines()
    pdb_block = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    commands = re.findall(r"^ipdb> (.+?)\s*$", pdb_block, re.M)
    return cells, commands


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    cells, commands = _first_try()
    assert len(cells) + len(commands) <= 12 and commands[-1] == "c"
    assert cells[0] == "%load_ext xlanb" and "%xla_pending" in cells and "%xla_mode eager" in cells
    # its set-up commands are the ones CI runs (.ci/run)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    install = re.search(r"^    (pip install torch==\S+) && (pip install -e \S+)$", readme, re.M)
    assert install, "the README's install line"
    pin, extras = install.group(1), install.group(2)
    assert re.search(rf"^pip install -q {re.escape(pin[len('pip install '):])}$", ci, re.M)
    assert re.search(rf"^pip install -q {re.escape(extras[len('pip install '):])}$", ci, re.M)
    assert re.search(r"^    python -m pytest -q$", readme, re.M)
    assert re.search(r"^python -m pytest -q \|\| status=1$", ci, re.M)
    # the getting-started page shows the same first try (an include, not a copy)
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert "```{include} ../README.md" in page


@pytest.mark.slow  # a terminal IPython, driven as a person types
@pytest.mark.filterwarnings("ignore:os.fork")  # pexpect's fork execs IPython at once
def test_the_readme_first_try_runs_as_written(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    pytest.importorskip("IPython")
    cells, commands = _first_try()
    env = child_env(IPYTHONDIR=str(tmp_path / "ipython"), TERM="dumb")
    child = pexpect.spawn(sys.executable, ["-m", "IPython", "--simple-prompt", "--colors=NoColor",
                                           "--no-banner", "--HistoryManager.enabled=False"],
                          env=env, cwd=str(tmp_path), encoding="utf-8", timeout=300,
                          dimensions=(50, 250))
    # pdb's prompt at the start of a line (IPython's note "Enter 'c' at the ipdb> prompt"
    # has it in the middle of one)
    prompt, pdb_prompt = r"In \[\d+\]: ", r"(?:^|\n)ipdb> "
    said = {}
    try:
        child.expect(prompt)
        for line in cells:
            child.sendline(line)
            if child.expect([prompt, pdb_prompt]) == 1:  # %debug: the pdb block, typed
                said[line] = child.before
                for command in commands:
                    child.sendline(command)
                    child.expect([pdb_prompt, prompt])
                    said[command] = child.before
            else:
                said[line] = child.before
        child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    everything = "\n".join(said.values())
    for bad in ("Traceback", "Error", "***"):
        assert bad not in everything, everything[-3000:]
    assert "aten::gelu" in said["%xla_pending"] and "In[4]:1" in said["%xla_pending"]
    assert "aten::addmm" in said["xpending y"]
    assert re.search(r"graphs\s+0 compiled", said["xla"]), said["xla"]
    assert re.search(r"ops\s+0 single-op compiles", said["xla"]), said["xla"]
    assert "lazy -> eager" in said["%xla_mode eager"]
    assert "device='xla:0'" in next(v for k, v in said.items() if k.startswith("print("))
    assert "1 graph compile" in said["%xla_metrics"]


# --------------------------------------------------------------------------- browser

def _chromium(*args: str, tmp: pathlib.Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}",
           "--window-size=1300,1000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a browser
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_the_start_page_and_a_guide_render_in_chromium(site, tmp_path):
    assert site.result.returncode == 0
    for page in ("index.html", "guides/recompiles.html"):
        res = _chromium("--dump-dom", (site.out / page).as_uri(), tmp=tmp_path)
        dom = res.stdout
        assert "</html>" in dom, (page, res.stderr[-2000:])
        # the navigation: furo's sidebar, with every guide in it
        nav = re.search(r'<div class="sidebar-tree">(.*?)</div>', dom, re.S)
        assert nav, page
        links = re.findall(r'href="([^"#]+)"', nav.group(1))
        assert any(link.endswith("getting-started.html") for link in links), (page, links)
        assert sum("guides/" in link or page.startswith("guides/") and link.endswith(".html")
                   for link in links) >= 11, (page, links)
        # code blocks: highlighted by Pygments (tokens in spans), in a <pre>
        blocks = re.findall(r'<div class="highlight-(\w+) notranslate"><div class="highlight">'
                            r'<pre>(.*?)</pre>', dom, re.S)
        assert blocks, page
        python = [code for lang, code in blocks if lang == "python"]
        assert python and re.search(r'<span class="[a-z]+">', python[0]), page
        assert "xlanb" in html.unescape(re.sub(r"<[^>]+>", "", python[0]))
    shot = tmp_path / "recompiles.png"
    _chromium(f"--screenshot={shot}", (site.out / "guides" / "recompiles.html").as_uri(),
              tmp=tmp_path)
    assert shot.exists() and shot.stat().st_size > 30_000, "a blank page compresses to a few kB"
