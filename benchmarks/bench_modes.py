"""Per-mode speed of xlanb, side by side with native CPU torch and (optionally) torch_xla,
measured in one run. Each backend runs ``scenarios.py`` in fresh processes.

    python benchmarks/bench_modes.py [--steps N] [--torch-xla /path/to/venv/bin/python]
                                     [--only ops,bert,inspect,coldwarm] [--out FILE] [--json FILE]

Prints a table and writes docs/benchmarks.md (machine, versions, date); ``--out`` writes
elsewhere (trial runs), ``--only`` runs some of the scenarios:

``ops``       per-op overhead of eager dispatch and of lazy tracing
``bert``      BERT training step per mode: steady and first step, compiles
``inspect``   seeds/003: looking at a layer's output at a moving pdb breakpoint (each
              look timed), and the graph compiles that costs; plus the same steps without
              looking, as a reference; each run in its own fresh process
``coldwarm``  first BERT step in a fresh process with an empty persistent compilation
              cache, then in a second fresh process reusing that cache

torch_xla is measured only when a Python with torch_xla installed is given (keep it out of
CI: it is a download of several GB). XLANB_STORE_DIR is pointed at an empty directory for
every process (except the warm half of ``coldwarm``) so first-step figures include real
compiles.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GROUPS = ("ops", "bert", "inspect", "coldwarm", "depth")
DEPTHS = (2, 8, 24)  # BERT layers of the depth-scaling scenario
# the depth scenario's runs: xlanb's lazy mode (its graph unrolled, the default), lazy with
# its repeated layers compiled once as loops (XLANB_SCAN_LAYERS=1, graph/repeats.py), eager
DEPTH_MODES = ("lazy", "lazy_scan", "eager")


def run_backend(python: str, backend: str, steps: int, modes: str, only: str = "ops,bert",
                cache_dir: str | None = None, layers: int = 2, env_extra: dict | None = None) -> dict:
    """Run ``scenarios.py`` once in a fresh process; ``cache_dir`` (default: a new empty
    one) is both xlanb's XLANB_STORE_DIR and torch_xla's persistent cache."""
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="xlanb-bench-")
    env = dict(os.environ, PJRT_DEVICE="CPU", XLANB_STORE_DIR=cache_dir, **(env_extra or {}))
    cmd = [python, os.path.join(HERE, "scenarios.py"), backend, "--steps", str(steps),
           "--modes", modes, "--only", only, "--layers", str(layers)]
    if backend == "torch_xla" and only == "first_step":
        cmd += ["--cache-dir", cache_dir]  # torch_xla's cache is off unless asked for
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{backend} {only} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(python: str, backend: str, steps: int, modes: list[str], groups: list[str]) -> dict:
    """The scenarios in ``groups`` for one backend; ``modes`` are the BERT step's modes."""
    res: dict = {}
    if "ops" in groups:
        res.update(run_backend(python, backend, steps, ",".join(modes), "ops"))
    if "bert" in groups:
        # one process per mode: a mode measured after another would inherit its heap,
        # its threads and its caches, and its figures would depend on the order
        res["bert"] = {}
        for mode in modes:
            r = run_backend(python, backend, steps, mode, "bert")
            res["bert"].update(r["bert"])
            res.setdefault("torch", r["torch"])
        if "compile" in modes:
            # the same xlanb.compile step with graphs compiled optimized at once: what its
            # steady step must come back to once it tiered up (issue 57)
            r = run_backend(python, backend, steps, "compile", "bert",
                            env_extra={"XLANB_QUICK_COMPILES": "0"})
            res["bert"]["compile_quick_off"] = r["bert"]["compile"]
    if "inspect" in groups:
        # a user's first debugging session: nothing compiled yet, in memory or on disk
        res.update(run_backend(python, backend, steps, "lazy", "inspect"))
        res["inspect_ref"] = run_backend(python, backend, steps, "lazy", "inspect_ref")["inspect_ref"]
    if "depth" in groups:
        # BERT (hidden 256) at several depths, one fresh process per depth and mode, an
        # empty cache each: the first step's compiles and the steady step
        res["depth"] = {}
        for layers in DEPTHS:
            for mode in DEPTH_MODES:
                if mode == "lazy_scan" and backend != "xlanb":
                    continue
                scan = mode == "lazy_scan"
                r = run_backend(python, backend, 4, "lazy" if scan else mode, "depth",
                                layers=layers, env_extra={"XLANB_SCAN_LAYERS": "1" if scan else "0"})
                res["depth"].setdefault(str(layers), {})[mode] = r["depth"]["lazy" if scan else mode]
    if "coldwarm" in groups:
        res["coldwarm"] = {}
        for mode in ("lazy", "eager"):  # opbyop compiles nothing worth caching
            d = tempfile.mkdtemp(prefix="xlanb-bench-")  # one cache per mode: cold is cold
            cold = run_backend(python, backend, 1, mode, "first_step", d)
            warm = run_backend(python, backend, 1, mode, "first_step", d)
            res["coldwarm"][mode] = {"cold": cold["first_step"][mode], "warm": warm["first_step"][mode]}
            res.setdefault("torch", cold["torch"])
    return res


def fmt(v, unit="", digits=2) -> str:
    return "–" if v is None else f"{v:.{digits}f}{unit}"


def targets(results: dict) -> str:
    """Issue 8's targets, checked against this run: met or missed, and for a miss where
    the time goes (from the run's own counters)."""
    x, t, c = results.get("xlanb") or {}, results.get("torch_xla") or {}, results.get("cpu") or {}
    if not t:
        return ""
    out = ["## Targets (ratios against torch_xla 2.9 in this run)", "",
           "| target | measured | |", "|---|---|---|"]

    def check(label, ratio, limit, why=""):
        if ratio is None:
            return
        ok = ratio <= limit
        out.append(f"| {label} ≤ {limit:g}× | {ratio:.2f}× | {'met' if ok else 'missed' + (': ' + why if why else '')} |")

    def ratio(a, b):
        return a / b if a is not None and b else None

    fl = x.get("per_op_floors") or {}
    sub, call = fl.get("torch_subclass_us"), fl.get("jax_call_us")
    eager_why = lazy_why = ""
    if sub is not None and x.get("eager_op_us") is not None:
        eager_why = (f"{x['eager_op_us']:.1f} µs/op: torch dispatching to a Python subclass {sub:.1f} µs "
                     f"and calling a cached JAX executable {call:.1f} µs (the floor of any Python "
                     f"per-op path on this machine), xlanb's own Python "
                     f"{x['eager_op_us'] - sub - call:.1f} µs")
        lazy_why = (f"{x['lazy_trace_us']:.1f} µs/op: torch dispatching to a Python subclass "
                    f"{sub:.1f} µs, xlanb's recording {x['lazy_trace_us'] - sub:.1f} µs")
    check("eager per-op overhead", ratio(x.get("eager_op_us"), t.get("eager_op_us")), 0.8, eager_why)
    check("eager per-op, dependent chain", ratio(x.get("eager_chain_us"), t.get("eager_chain_us")), 0.8)
    check("eager per-op, dependent chain with a Python scalar",
          ratio(x.get("eager_scalar_us"), t.get("eager_scalar_us")), 0.8)
    check("lazy tracing cost", ratio(x.get("lazy_trace_us"), t.get("lazy_trace_us")), 1.5, lazy_why)
    xb, tb = x.get("bert", {}), t.get("bert", {})
    for mode in ("lazy", "eager"):
        if mode in xb and mode in tb:
            check(f"BERT steady step, {mode}", ratio(xb[mode]["steady_step_s"], tb[mode]["steady_step_s"]), 0.8)
            xm = xb[mode]
            threads = " (summed over the compile threads, which overlap)" if (
                xm.get("first_step_profile") or {}).get("background_compile_s") else ""
            why = (f"{xm['compiles']} compiles took {xm['compile_s']:.1f} s{threads} during the "
                   f"{xm['first_step_s']:.1f} s step" + _split(xm.get("first_step_profile"))
                   + f"; torch_xla: {tb[mode].get('compiles')} compiles, {tb[mode].get('compile_s', 0):.1f} s")
            check(f"BERT first step, {mode}", ratio(xm["first_step_s"], tb[mode]["first_step_s"]), 1.0, why)
    if "compile" in xb and "lazy" in tb:
        cpu = c.get("bert", {}).get("cpu", {}).get("steady_step_s")
        gap = f"; {xb['compile']['steady_step_s'] / cpu:.2f}× native CPU torch" if cpu else ""
        run = xb["compile"].get("steady_execute_s")
        floor = (f"running the executable takes {run:.3f} s of the {xb['compile']['steady_step_s']:.3f} s "
                 "step, the floor on this CPU" if run else "the executable's own run time is the floor")
        check("xlanb.compile BERT step vs torch_xla lazy",
              ratio(xb["compile"]["steady_step_s"], tb["lazy"]["steady_step_s"]), 0.6, floor + gap)
    xi, ti = x.get("inspect"), t.get("inspect")
    if xi and ti:
        check("pdb inspection, breakpoint to value (median)", ratio(xi["look_median_s"], ti["look_median_s"]), 0.3,
              f"the first look compiles {xi['OpCompile']} single ops")
        first = (f"the first look compiles its prefix once, quickly ({xi['PeekCompile']} prefix "
                 "graph): lowering it, compiling it and its first run; see 'The first look' below"
                 if xi.get("PeekCompile") else f"the first look compiles {xi['OpCompile']} single ops")
        check("pdb inspection, first look vs torch_xla's first", ratio(xi["look_s"][0], ti["look_s"][0]), 0.5,
              first)
        ref = x.get("inspect_ref", {}).get("graph_compiles")
        out.append(f"| pdb inspection: 1 graph compile over 3 steps (torch_xla: 3) | xlanb "
                   f"{xi['graph_compiles']}, torch_xla {ti['graph_compiles']} | "
                   + ("met" if xi["graph_compiles"] <= 1 else
                      f"missed: {ref} without looking; " + "; ".join(xi.get("recompile_why", []))[:300])
                   + " |")
    for mode, cw in x.get("coldwarm", {}).items():
        check(f"warm process first step ÷ cold, {mode}", ratio(cw["warm"]["first_step_s"], cw["cold"]["first_step_s"]),
              0.3, f"warm first step {cw['warm']['first_step_s']:.2f} s" + _split(cw["warm"].get("profile"))
              + f"; {cw['warm']['PersistentCacheHit']} executables loaded from the cache")
    return "\n".join(out)


def _split(p: dict | None) -> str:
    """Where a step's time went (xlanb's profile of it), as a clause."""
    if not p:
        return ""
    bg = p.get("background_compile_s", 0.0)
    overlap = (f" ({bg:.2f} s of it on background threads, while Python went on; the main "
               f"thread waited {p.get('compile_wait_s', 0.0):.2f} s for them)") if bg else ""
    return (f": Python {p['python_s']:.2f} s (dispatch and recording; in eager mode also running "
            f"each op), JAX tracing and lowering {p['lower_s']:.2f} s, XLA compiling or loading from "
            f"the cache {p['xla_compile_s']:.2f} s{overlap}, running graphs {p['execute_s']:.2f} s")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def table(results: dict) -> tuple[str, list[str]]:
    """The markdown table and the notes under it."""
    x, t, c = results.get("xlanb"), results.get("torch_xla"), results.get("cpu")
    t = t or {}
    notes: list[str] = []
    lines = ["| scenario | xlanb | torch_xla 2.9 | native CPU torch |", "|---|---|---|---|"]

    def row(label, xv, tv, cv="–"):
        lines.append(f"| {label} | {xv} | {tv} | {cv} |")

    for key, label in (("eager_op_us", "eager per-op overhead, cached add 16x16 (µs/op, median of 5 rounds)"),
                       ("eager_chain_us", "eager per-op, dependent chain z = z + y, f32 16x16 (µs/op)"),
                       ("eager_scalar_us", "eager per-op, dependent chain z.add(y, alpha=0.5) (µs/op)"),
                       ("lazy_trace_us", "lazy tracing cost, mul+add 16x16 (µs/op, median of 5 rounds)")):
        if key in x:
            row(label, fmt(x.get(key), digits=1), fmt(t.get(key), digits=1))
    for key, label in (("torch_subclass_us", "floor: torch dispatching an op to a bare Python tensor subclass (µs)"),
                       ("jax_call_us", "floor: calling a cached JAX executable, add 16x16 (µs)")):
        if key in (x.get("per_op_floors") or {}):
            row(label, fmt(x["per_op_floors"][key], digits=1), "–")
    for mode in ("lazy", "eager", "opbyop", "compile", "compile_quick_off"):
        xb = x.get("bert", {}).get(mode)
        tb = t.get("bert", {}).get(mode)
        if xb is None:
            continue
        cb = c["bert"]["cpu"]["steady_step_s"] if c and "bert" in c else None
        row(f"BERT step, {mode}: steady (s)", fmt(xb["steady_step_s"], digits=3),
            fmt(tb["steady_step_s"] if tb else None, digits=3), fmt(cb, digits=3))
        row(f"BERT step, {mode}: first step (s)", fmt(xb["first_step_s"]),
            fmt(tb["first_step_s"] if tb else None))
        row(f"BERT step, {mode}: compiles (compile s)", f"{xb['compiles']} ({fmt(xb['compile_s'])})",
            f"{tb['compiles']} ({fmt(tb['compile_s'])})" if tb else "–")

    xc, tl = x.get("bert", {}).get("compile"), t.get("bert", {}).get("lazy")
    if xc and xc.get("steady_step_s"):
        cb = c["bert"]["cpu"]["steady_step_s"] if c and "bert" in c else None
        row("BERT step, xlanb.compile ÷ torch_xla lazy (steady)",
            fmt(xc["steady_step_s"] / tl["steady_step_s"]) + "×" if tl else "–", "–",
            f"xlanb.compile = {xc['steady_step_s'] / cb:.2f}× CPU torch" if cb else "–")
        xo = x.get("bert", {}).get("compile_quick_off")
        if xo and xo.get("steady_step_s"):
            row("BERT step, xlanb.compile steady ÷ the same with XLANB_QUICK_COMPILES=0",
                fmt(xc["steady_step_s"] / xo["steady_step_s"]) + "×", "–", "–")
            notes.append("BERT step, compile_quick_off: the same `xlanb.compile` step in a "
                         "process with XLANB_QUICK_COMPILES=0 (its graph compiled optimized "
                         "at once). With quick compiles, the replays tier up: "
                         f"{xc.get('quick_compiles', '?')} quick compile(s), "
                         f"{xc.get('tier_ups', '?')} GraphTierUp; steps "
                         + ", ".join(f"{t:.2f}" for t in xc.get("step_s", [])) + " s")
        notes.append("BERT step, compile: `xlanb.compile` over the same step with "
                     "AdamW(capturable=True), so that no Python number changes between steps; "
                     "steady = median from step 4 on (calls 1 and 2 are traced and agree, later calls "
                     "replay the executable without running Python). Its status: "
                     + xc.get("status", "").replace("\n", "; "))

    xi, ti = x.get("inspect"), t.get("inspect")
    if xi:
        xr, tr = x["inspect_ref"], t.get("inspect_ref")
        ratio = (f" = {xi['look_median_s'] / ti['look_median_s']:.2f}× torch_xla" if ti else "")
        row("pdb inspection (seeds/003): breakpoint → value, median of 3 looks (s)",
            fmt(xi["look_median_s"], digits=3) + ratio, fmt(ti["look_median_s"], digits=3) if ti else "–")
        row("pdb inspection: each look, steps 1 / 2 / 3 (s)", " / ".join(fmt(v) for v in xi["look_s"]),
            " / ".join(fmt(v) for v in ti["look_s"]) if ti else "–")
        row("pdb inspection: graph compiles over the 3 steps (same steps without looking)",
            f"{xi['graph_compiles']} ({xr['graph_compiles']})",
            f"{ti['graph_compiles']} ({tr['graph_compiles']})" if ti else "–")
        row("pdb inspection: single-op compiles for the looks (OpCompile), and quick prefix "
            "graphs of first looks (PeekCompile)",
            f"{xi['OpCompile']}, {xi.get('PeekCompile', 0)}", "–")
        row("pdb inspection: step times, steps 1 / 2 / 3 (s)", " / ".join(fmt(v) for v in xi["step_s"]),
            " / ".join(fmt(v) for v in ti["step_s"]) if ti else "–")
        notes.append("pdb inspection: 4-layer BERT (otherwise as below), lazy mode, 3 training steps in a "
                     "fresh process with an empty compilation cache; in step k a forward hook after "
                     "encoder layer k stands in for the breakpoint and runs `repr(t)` on the layer's "
                     "output, as pdb's `p t` does: xlanb peeks op by op and leaves the pending graph "
                     "alone, torch_xla runs the pending graph up to `t`, cutting the step's graph. "
                     "xlanb's graph compiles are UncachedCompile, torch_xla's are CompileTime samples.")
        for why in xi.get("recompile_why", []):
            notes.append(f"xlanb's reason for a graph compile after the first in the inspection run: {why}")

    dx, dt = x.get("depth", {}), t.get("depth", {})
    for layers in sorted(dx, key=int):
        for mode in DEPTH_MODES:
            xm, tm = dx[layers].get(mode), dt.get(layers, {}).get(mode)
            if xm is None:
                continue
            row(f"depth {layers} layers, {mode}: first step / steady (s)",
                f"{fmt(xm['first_step_s'])} / {fmt(xm['steady_step_s'], digits=3)}",
                f"{fmt(tm['first_step_s'])} / {fmt(tm['steady_step_s'], digits=3)}" if tm else "–")
            row(f"depth {layers} layers, {mode}: compiles (compile s)",
                f"{xm['compiles']} ({fmt(xm['compile_s'])})",
                f"{tm['compiles']} ({fmt(tm['compile_s'])})" if tm else "–")
    if dx:
        notes.append("depth: BertForSequenceClassification, hidden 256, 4 heads, intermediate "
                     "1024, sequence 128, batch 8, AdamW, at each depth; one fresh process per "
                     "depth and mode with an empty persistent cache; 4 steps, steady = median of "
                     "steps 2 to 4. lazy: the graph unrolled (XLANB_SCAN_LAYERS=0, the default); "
                     "lazy_scan: the repeated encoder layers lowered as one loop each, forward "
                     "and backward (XLANB_SCAN_LAYERS=1; graph/repeats.py).")
        notes += depth_notes(dx)

    cw_x, cw_t = x.get("coldwarm", {}), t.get("coldwarm", {})
    for mode in ("lazy", "eager"):
        xc, tc = cw_x.get(mode), cw_t.get(mode)
        if xc is None:
            continue
        t_broken = tc is not None and tc["warm"].get("PersistentCacheDeserializeFailure")
        row(f"BERT first step, {mode}: cold process, empty persistent cache (s)",
            fmt(xc["cold"]["first_step_s"]), fmt(tc["cold"]["first_step_s"]) if tc else "–")
        tw = "–" if not tc else (f"– (cache unusable, recompiled: {fmt(tc['warm']['first_step_s'])})"
                                 if t_broken else fmt(tc["warm"]["first_step_s"]))
        row(f"BERT first step, {mode}: warm process, same cache (s)", fmt(xc["warm"]["first_step_s"]), tw)
        row(f"BERT first step, {mode}: warm ÷ cold",
            fmt(xc["warm"]["first_step_s"] / xc["cold"]["first_step_s"]),
            "–" if not tc or t_broken else fmt(tc["warm"]["first_step_s"] / tc["cold"]["first_step_s"]))
        row(f"BERT first step, {mode}: persistent cache hits / misses, warm process",
            f"{xc['warm']['PersistentCacheHit']} / {xc['warm']['PersistentCacheMiss']}",
            f"{tc['warm']['PersistentCacheHit']} / {tc['warm']['PersistentCacheMiss']}" if tc else "–")
        if t_broken:
            notes.append(f"torch_xla, {mode}: `torch_xla.runtime.initialize_cache(path, readonly=False)` "
                         "writes the cache, but the CPU PJRT client cannot load it (\"Deserializing "
                         "serialized executable not supported\"; counter PersistentCacheDeserializeFailure="
                         f"{tc['warm']['PersistentCacheDeserializeFailure']}), so the warm process "
                         "compiles again.")
    if cw_x:
        notes.append("cold vs warm: the 2-layer BERT step below, one mode per process, timing only the "
                     "first step (model setup excluded); the warm process reuses the cold one's "
                     "persistent cache directory (XLANB_STORE_DIR; for torch_xla initialize_cache).")
    return "\n".join(lines), notes


def depth_notes(dx: dict) -> list[str]:
    """Issue 36's figures: the first step at the deepest depth over the shallowest, with
    and without the layers compiled once; the steady step with over without; the losses."""
    out = []
    depths = sorted(dx, key=int)
    lo, hi = depths[0], depths[-1]
    for mode in ("lazy_scan", "lazy"):
        a, b = dx[lo].get(mode), dx[hi].get(mode)
        if a and b:
            out.append(f"depth, {mode}: first step at {hi} layers ÷ {lo} layers = "
                       f"{b['first_step_s'] / a['first_step_s']:.2f}× "
                       f"({b['first_step_s']:.2f} s / {a['first_step_s']:.2f} s)")
    for layers in depths:
        s, u = dx[layers].get("lazy_scan"), dx[layers].get("lazy")
        if s and u:
            same = s.get("losses") == u.get("losses")
            out.append(f"depth {layers} layers: steady step with the loop ÷ unrolled = "
                       f"{s['steady_step_s'] / u['steady_step_s']:.2f}×; losses over "
                       f"{len(s.get('losses') or ())} steps "
                       + ("equal" if same else f"{s.get('losses')} vs {u.get('losses')}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--torch-xla", metavar="PYTHON", help="a Python with torch_xla installed")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                    help="markdown file to write (default docs/benchmarks.md)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    ap.add_argument("--only", default=",".join(GROUPS), help=f"comma list of {', '.join(GROUPS)}")
    ap.add_argument("--from-json", metavar="FILE",
                    help="render the results of an earlier --json run instead of measuring")
    args = ap.parse_args()
    groups = args.only.split(",")
    if unknown := set(groups) - set(GROUPS):
        ap.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        args.torch_xla = args.torch_xla or ("torch_xla" in results)
        return write(args, groups, results)
    results = {"xlanb": measure(sys.executable, "xlanb", args.steps,
                                 ["lazy", "eager", "opbyop", "compile"], groups)}
    if "bert" in groups:
        results["cpu"] = run_backend(sys.executable, "cpu", args.steps, "", "bert")
    if args.torch_xla:
        results["torch_xla"] = measure(args.torch_xla, "torch_xla", args.steps, ["lazy", "eager"], groups)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)  # the raw figures, for a closer look
    write(args, groups, results)


# The heading under which other scripts' results sit in docs/benchmarks.md.
OTHERS = "## Measured by other scripts"


def write(args, groups, results) -> None:
    import jax
    import torch
    head = (f"Measured {datetime.date.today()} on {platform.machine()} ({_cpu_model()}), {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, torch {torch.__version__}, jax {jax.__version__}"
            + (f", torch_xla under torch {results['torch_xla']['torch']}" if "torch_xla" in results else "")
            + f"; {args.steps} steps per BERT run (BertForSequenceClassification: 2 layers, hidden "
            "256, 4 heads, intermediate 1024, sequence 128, batch 8, AdamW); steady = median of "
            "steps 2..N. All on the CPU. Figures come from one run; on a shared VM they move "
            "between runs (the same eager per-op loop measured 48-80 µs on one machine in one "
            "day), so compare within a run, not across runs.")
    body, notes = table(results)
    text = head + "\n\n" + body + ("\n\n" + "\n".join(f"- {n}" for n in notes) if notes else "")
    goals = targets(results)
    if goals:
        text += "\n\n" + goals
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    # what other benchmark scripts recorded, from OTHERS on, is kept as it is
    kept = ""
    if os.path.exists(args.out):
        with open(args.out) as f:
            old = f.read()
        if OTHERS in old:
            kept = "\n" + old[old.index(OTHERS):]
    with open(args.out, "w") as f:
        f.write("# Benchmarks\n\nGenerated by `python benchmarks/bench_modes.py"
                + (" --torch-xla PYTHON" if args.torch_xla else "")
                + (f" --only {args.only}" if set(groups) != set(GROUPS) else "") + "`.\n\n"
                + text + "\n" + kept)


if __name__ == "__main__":
    main()
