"""Run PyTorch's device-generic test files on ``xla`` and write ``docs/pytorch-suite.md``.

    python -m tools.pytorch_suite                        # four files x three modes
    python -m tools.pytorch_suite --modes eager --files test_view_ops
    python -m tools.pytorch_suite --report-only          # rewrite the page from saved results

The files are PyTorch's own, in ``../shared/pytorch-tests`` (``XLANB_PYTORCH_TESTS``);
nothing is copied here. Each file runs in its own pytest process per mode, through
``tests/pytorch_suite/xla_device.py``; its JUnit XML is kept in ``--results``
(default ``.pytorch-suite/``), and the page is written from every result there. Failures
are grouped by root cause: the exception type and its message with numbers, shapes and
names of tests taken out.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("test_view_ops", "test_indexing", "test_type_promotion", "test_shape_ops")
MODES = ("eager", "lazy-sync", "opbyop")
PLUGIN = os.path.join(ROOT, "tests", "pytorch_suite", "xla_device.py")
PAGE = os.path.join(ROOT, "docs", "pytorch-suite.md")
BASELINE_REASON = "fails on CPU torch 2.13 too"


def tests_dir() -> str:
    return os.environ.get("XLANB_PYTORCH_TESTS") or os.path.join(os.path.dirname(ROOT), "shared",
                                                                   "pytorch-tests")


# The dtypes the test suite runs each file's dtype variants in (tests/test_pytorch_suite):
# one of each kind (float32, float16, int64, bool, complex64), while ``python -m
# tools.pytorch_suite`` runs every dtype. The others repeat the same lowerings at another
# width, and view_ops' ``test_atleast`` alone spent 400-500 s of CPU on them in eager mode.
SUITE_DTYPES_LEFT_OUT = ("float64", "complex128", "bfloat16", "int8", "int16", "int32", "uint8")
SUITE_SELECTION = "not (" + " or ".join(f"xla_{d}" for d in SUITE_DTYPES_LEFT_OUT) + ")"


def run_file(name: str, mode: str, results: str, timeout: int = 3600, nice: int = 0,
             base_env: dict | None = None, select: str | None = None) -> str:
    """Run one file in one mode; returns the path of its JUnit XML. ``nice``: the
    child's niceness (the test suite runs files behind its other tests). ``base_env``:
    the environment to start from (default: this process's, as it is now). ``select``:
    a pytest ``-k`` expression (``SUITE_SELECTION``)."""
    xml = os.path.join(results, f"{mode}__{name}.xml")
    env = dict(os.environ if base_env is None else base_env, TORCH_TEST_DEVICES=PLUGIN, PYTORCH_TESTING_DEVICE_ONLY_FOR="xla",
               XLANB_SUITE_MODE=mode, XLANB_STORE_DIR="")
    env.pop("XLANB_MODE", None)
    env.pop("PYTEST_ADDOPTS", None)  # the calling run's options (CI's junit XML) are its own
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "pytest", os.path.join(tests_dir(), name + ".py"),
                    "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                    f"--junitxml={xml}"] + (["-k", select] if select else []), env=env, cwd=ROOT, timeout=timeout,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   preexec_fn=(lambda: os.nice(nice)) if nice else None)
    with open(xml + ".json", "w") as f:
        json.dump({"seconds": time.time() - t0}, f)
    return xml


# torch_xla's own run of these files (its test/pytorch_test_base.py, 2.x): the tests it
# disables by name in these files' classes, and the dtypes it never instantiates.
TORCH_XLA_DISABLED = {
    "TestViewOpsXLA": {"test_contiguous_nonview", "test_expand_as_view", "test_expand_view",
                       "test_reshape_nonview", "test_unfold_view"},
    "TestIndexingXLA": {"test_setitem_expansion_error", "test_multiple_byte_mask",
                        "test_empty_slice", "test_byte_tensor_assignment", "test_byte_mask",
                        "test_byte_mask_accumulate", "test_bool_indices",
                        "test_index_getitem_copy_bools_slices", "test_getitem_scalars",
                        "test_empty_ndim_index", "test_index_put_byte_indices_xla"},
    "NumpyTestsXLA": {"test_trivial_fancy_out_of_bounds", "test_boolean_assignment_value_mismatch",
                      "test_empty_tuple_index", "test_empty_fancy_index", "test_ellipsis_index",
                      "test_broaderrors_indexing", "test_boolean_shape_mismatch",
                      "test_boolean_indexing_weirdness",
                      "test_boolean_indexing_weirdness_tensors"},
    "TestTypePromotionXLA": {"test_many_promotions", "test_inplace", "test_indexing",
                             "test_alternate_result", "test_half", "test_complex_promotion",
                             "test_complex_scalar_mult_tensor_promotion"},
}
TORCH_XLA_DTYPES_OFF = frozenset(("float16", "complex64", "complex128"))


def torch_xla_could_run(test: str) -> bool:
    """Whether torch_xla's test base would run ``Class::test_name`` at all: not disabled
    by name (with or without its ``_xla...`` suffix), no half or complex dtype variant."""
    cls, name = test.split("::", 1)
    base = name.split("_xla", 1)[0]
    off = TORCH_XLA_DISABLED.get(cls, ())
    if base in off or name in off or name.split("_xla_", 1)[0] + "_xla" in off:
        return False
    tail = name.split("_xla_", 1)[1] if "_xla_" in name else ""
    return not (set(tail.split("_")) & TORCH_XLA_DTYPES_OFF)


class Outcome(dict):
    """Counts for one file in one mode, and its failures."""


def _xfail_cause():
    sys.path.insert(0, os.path.dirname(PLUGIN))
    try:
        from xfails import xfail_cause
    finally:
        sys.path.pop(0)
    return xfail_cause


def outcomes(xml: str, mode: str | None = None) -> tuple[dict, list]:
    """``(counts, failures)`` of one JUnit XML: counts of passed / failed / error /
    skipped / baseline / xfailed / xpassed; failures as (test, kind, message). With
    ``mode``, the xfail list is applied here too, so a run made without it
    (``XLANB_SUITE_IGNORE_XFAILS=1``) reports as one made with it: a listed failure is
    an xfail, a listed test that passed an unexpected success."""
    counts = collections.Counter()
    failures = []
    listed = _xfail_cause() if mode else (lambda cls, test, mode: None)
    for tc in ET.parse(xml).iter("testcase"):
        name = f"{tc.get('classname', '').rsplit('.', 1)[-1]}::{tc.get('name')}"
        kids = {c.tag: c for c in tc}
        if "skipped" not in kids and listed(*name.split("::", 1), mode):
            if "failure" in kids or "error" in kids:
                kids = {"skipped": ET.Element("skipped", {"message": "expected failure"})}
            else:
                kids = {"failure": ET.Element("failure", {"message": "Unexpected success"})}
        skipped_by_test = False
        if "skipped" in kids:
            msg = kids["skipped"].get("message") or ""
            typ = kids["skipped"].get("type") or ""
            if "xfail" in typ or "expected" in msg.lower() and "fail" in msg.lower():
                counts["xfailed"] += 1
            elif BASELINE_REASON in msg:
                counts["baseline"] += 1
            else:
                counts["skipped"] += 1
                skipped_by_test = True
        if not skipped_by_test and torch_xla_could_run(name):
            # at most this many could pass in torch_xla's run (CPU-baseline ones included)
            counts["torch_xla_max"] += 1
        if "skipped" in kids:
            pass
        elif "failure" in kids or "error" in kids:
            node = kids.get("failure", kids.get("error"))
            msg = node.get("message") or ""
            if "Unexpected success" in msg or "unexpected success" in (node.text or ""):
                counts["xpassed"] += 1
                failures.append((name, "xpassed", "listed as xfail but passed"))
                continue
            kind = "failed" if "failure" in kids else "error"
            counts[kind] += 1
            failures.append((name, kind, _first_error(node)))
        else:
            counts["passed"] += 1
    return dict(counts), failures


def _listed_failures(xml: str, mode: str) -> list:
    """``(test, cause)`` of each test in ``xml`` that did not pass and is on the xfail
    list for ``mode``."""
    listed = _xfail_cause()
    out = []
    for tc in ET.parse(xml).iter("testcase"):
        kids = {c.tag for c in tc}
        if not kids & {"failure", "error", "skipped"}:
            continue
        cls, test = tc.get("classname", "").rsplit(".", 1)[-1], tc.get("name")
        cause = listed(cls, test, mode)
        if cause:
            out.append((f"{cls}::{test}", cause))
    return out


def _first_error(node) -> str:
    """The exception line of a failure: ``TypeError: ...`` (its last such line)."""
    text = node.text or node.get("message") or ""
    lines = [ln.strip() for ln in text.splitlines()]
    for ln in reversed(lines):
        m = re.match(r"^(E\s+)?([\w.]+(Error|Exception|Failure)[\w]*): ?(.*)$", ln)
        if m:
            return f"{m.group(2).rsplit('.', 1)[-1]}: {m.group(4)}"
    return (node.get("message") or "").split("\n")[0]


_NOISE = [(re.compile(r"0x[0-9a-f]+"), "0x…"), (re.compile(r"torch\.\w+"), "torch.…"), (re.compile(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b"), "N"),
          (re.compile(r"\([^()]{0,80}\)"), "(…)"), (re.compile(r"\[[^\[\]]{0,80}\]"), "[…]"),
          (re.compile(r"'[^']{0,60}'"), "'…'"), (re.compile(r"\s+"), " ")]


def cause_key(message: str) -> str:
    """A failure message with its particulars taken out, to group failures by cause."""
    key = message.split(" xlanb:")[0] if message.startswith("AssertionError") else message
    key = key[:160]
    for rx, sub in _NOISE:
        key = rx.sub(sub, key)
    return key.strip()


def write_page(results: str) -> str:
    rows = []
    groups: dict = collections.defaultdict(list)
    xgroups: dict = collections.defaultdict(list)  # the xfail list's cause -> tests
    totals: dict = collections.defaultdict(collections.Counter)
    seconds: dict = {}
    for mode in MODES:
        for name in FILES:
            xml = os.path.join(results, f"{mode}__{name}.xml")
            if not os.path.exists(xml):
                continue
            counts, failures = outcomes(xml, mode)
            try:
                with open(xml + ".json") as f:
                    seconds[(mode, name)] = json.load(f)["seconds"]
            except OSError:
                pass
            rows.append((mode, name, counts))
            totals[mode].update(counts)
            for test, kind, msg in failures:
                groups[cause_key(msg)].append((mode, name, test, msg))
            for test, cause in _listed_failures(xml, mode):
                xgroups[cause].append((mode, name, test))
    cpu = _cpu_model()
    out = ["# PyTorch's device-generic tests on `xla`", "",
           "Generated by `python -m tools.pytorch_suite` "
           f"({datetime.date.today().isoformat()}, {cpu}, torch {_torch_version()}).",
           "PyTorch's own files (version 2.1, `../shared/pytorch-tests`), run through "
           "`tests/pytorch_suite/xla_device.py` at torch's default precision. "
           "*baseline*: tests that fail on CPU torch 2.13 itself (API drift), which count "
           "neither way. *rate*: passed ÷ (instantiated − baseline − skipped by the test's own "
           "decorators), so every test that runs on `xla` counts.", "",
           "*torch_xla ≤*: the most tests torch_xla's own run of the same file could pass: "
           "those its test base instantiates (no float16, complex64 or complex128 variants) "
           "and does not disable by name, less those the test's own decorators skip; CPU "
           "baseline failures are counted in its favour. An upper bound, not a run.", "",
           "Every dtype runs here. The test suite (`tests/test_pytorch_suite.py`, eager "
           "mode) runs each test's dtype variants in float32, float16, int64, bool and "
           "complex64 only (`SUITE_SELECTION`), to stay within CI's time.", "",
           "| mode | file | passed | failed | error | skipped | baseline | xfail | xpass | rate | torch_xla ≤ | time |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, name, c in rows:
        out.append(_row(mode, name, c, seconds.get((mode, name))))
    for mode in MODES:
        if mode in totals:
            n = sum(1 for m, _, _ in rows if m == mode)
            label = "all four" if n == len(FILES) else f"{n} of {len(FILES)} files"
            out.append(_row(f"**{mode}**", f"**{label}**", totals[mode],
                            sum(v for (m, _), v in seconds.items() if m == mode)))
    for mode in MODES:
        missing = [f for f in FILES if mode in totals and (mode, f) not in {(m, n) for m, n, _ in rows}]
        if missing:
            out.append(f"\n*{mode}*: no result for {', '.join(missing)} in these runs.")
    out += ["", "## Known failures, by their cause on the xfail list", "",
            "`tests/pytorch_suite/xfails.py`: every entry names its cause. Each group: how "
            "many test runs (summed over the modes), in which modes, and up to three of them.", ""]
    for cause, items in sorted(xgroups.items(), key=lambda kv: -len(kv[1])):
        modes = sorted({m for m, *_ in items})
        out.append(f"- **{len(items)}** ({', '.join(modes)}): {_md(cause)}")
        for _, f, test in items[:3]:
            out.append(f"  - {f}::{test}")
    out += ["", "## Other failures grouped by cause", "",
            "Each group: how many failures share the message (numbers, shapes and quoted "
            "names taken out), in which modes, and up to three of the tests.", ""]
    if not groups:
        out.append("None: every failure is on the xfail list.")
    for key, items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        modes = sorted({m for m, *_ in items})
        files = sorted({f for _, f, *_ in items})
        out.append(f"- **{len(items)}** ({', '.join(modes)}; {', '.join(files)}): `{_md(items[0][3][:200])}`")
        for _, f, test, _ in items[:3]:
            out.append(f"  - {f}::{test}")
    text = "\n".join(out) + "\n"
    with open(PAGE, "w") as f:
        f.write(text)
    return text


def _md(s: str) -> str:
    return s.replace("`", "'").replace("|", "\\|")


def _row(mode, name, c, secs) -> str:
    ran = c.get("passed", 0) + c.get("failed", 0) + c.get("error", 0) + c.get("xfailed", 0) \
        + c.get("xpassed", 0)
    rate = f"{100 * c.get('passed', 0) / ran:.1f}%" if ran else "-"
    t = f"{secs / 60:.1f} min" if secs else ""
    return (f"| {mode} | {name} | {c.get('passed', 0)} | {c.get('failed', 0)} | {c.get('error', 0)} "
            f"| {c.get('skipped', 0)} | {c.get('baseline', 0)} | {c.get('xfailed', 0)} "
            f"| {c.get('xpassed', 0)} | {rate} | {c.get('torch_xla_max', 0)} | {t} |")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f", {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{os.cpu_count()} cores"


def _torch_version() -> str:
    import torch
    return torch.__version__


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="*", default=list(FILES), choices=FILES)
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    ap.add_argument("--results", default=os.path.join(ROOT, ".pytorch-suite"))
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args(argv)
    if not os.path.isdir(tests_dir()):
        print(f"no PyTorch test files at {tests_dir()} (set XLANB_PYTORCH_TESTS)")
        return 1
    os.makedirs(a.results, exist_ok=True)
    if not a.report_only:
        for mode in a.modes:
            for name in a.files:
                t0 = time.time()
                run_file(name, mode, a.results)
                print(f"{mode:10} {name:22} {time.time() - t0:7.1f} s", flush=True)
    print(write_page(a.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
