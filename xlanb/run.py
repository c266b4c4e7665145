"""``python -m xlanb.run [--shadow] [--target T] script.py [args]``: run a torch_xla
program unchanged on xlanb (``-m module`` runs a module instead of a script).

The program runs as ``__main__`` with ``sys.argv`` set to ``[script, *args]`` and its
folder first on ``sys.path``, as ``python script.py args`` would. ``import torch_xla``
gives xlanb's modules (``xlanb.compat``), so every xlanb tool works on it: ``breakpoint()``
opens xlanb's pdb (``PYTHONBREAKPOINT=xlanb.set_trace`` unless you set it), and
``XLANB_MODE=eager`` runs a lazy program op by op. ``faulthandler`` is on, so a native
crash still prints the Python stack. If the real torch_xla is installed, it is used
unless ``--shadow`` is given.

torch_xla's debugging variables work as they do there (``PT_XLA_DEBUG_LEVEL``,
``XLA_SAVE_TENSORS_FILE``, ``XLA_METRICS_FILE``, ``XLA_FLAGS=--xla_dump_to``, ...: see
``xlanb.compat.debug_env``), and so does ``torch_xla.debug.profiler``.

With a TPU target (``XLANB_TARGET=v5e:2x2``, or ``--target v5e:2x2``, which sets it),
every graph the program compiles is also compiled for that TPU topology with libtpu, in
the background, and at exit one line per graph goes to stderr: its per-chip HBM peak,
whether it fits, the estimated step time and the TPU compile time.

``--compile-profile`` prints, at exit, where the program's compile time went: every
graph's compile summed by phase, source line and scope (``xlanb.compile_summary``).
"""
from __future__ import annotations

import faulthandler
import os
import runpy
import sys

from .base.formats import format_hash

USAGE = ("usage: python -m xlanb.run [--shadow] [--target T] [--compile-profile] script.py [args ...]\n"
         "       python -m xlanb.run [--shadow] [--target T] [--compile-profile] -m module [args ...]\n"
         "Runs a torch_xla program unchanged on xlanb; --shadow runs it on xlanb even "
         "when the real torch_xla is installed; --target v5e:2x2 (or XLANB_TARGET) also "
         "compiles every graph for that TPU topology and prints one line per graph at exit; "
         "--compile-profile prints where the compile time went, by phase, line and scope.")


def target_summary(file=None) -> None:
    """One line per graph compiled for a target (``xlanb.graphs()[i].target``), to
    ``file`` (stderr): waits for the TPU compiles still running."""
    file = file or sys.stderr
    xlanb = sys.modules.get("xlanb")
    if xlanb is None:
        return
    gs = list(xlanb.graphs())
    lines = []
    for i, g in enumerate(gs):
        try:
            report = g.target
        except Exception as e:  # noqa: BLE001 - one graph's failure is one line
            lines.append(f"xlanb.run: graph #{i} {format_hash(g.hash)}: no target report "
                         f"({type(e).__name__}: {e})")
            continue
        if report is None:
            continue
        where = f" at {g.src.short}" if g.src is not None else ""
        ops = f"{g.n_nodes} op" + ("" if g.n_nodes == 1 else "s")
        lines.append(f"xlanb.run: graph #{i} {format_hash(g.hash)} ({ops}{where}) on "
                     f"{report.summary_line()}")
    for line in lines:
        print(line, file=file)
    file.flush()


def _missing(target: str, module: bool) -> str | None:
    """Why ``target`` cannot run (no such file, no such module), or None."""
    if not module:
        if os.path.isdir(target) and not os.path.exists(os.path.join(target, "__main__.py")):
            return f"can't find '__main__.py' in {target!r}"
        if not os.path.exists(target):
            return f"can't open file {os.path.abspath(target)!r}: no such file"
        return None
    import importlib.util
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError) as e:  # a parent package that is missing, or ""
        return f"no module named {target!r} ({e})"
    return None if found is not None else f"no module named {target!r}"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    shadow = False
    target_name = None
    compile_profile = False
    while argv and argv[0].startswith("-") and argv[0] != "-m":
        opt = argv.pop(0)
        if opt == "--shadow":
            shadow = True
        elif opt == "--target" or opt.startswith("--target="):
            name = opt.partition("=")[2] if "=" in opt else (argv.pop(0) if argv else "")
            if not name:
                sys.exit(f"xlanb.run: --target needs a TPU topology, e.g. v5e:2x2\n{USAGE}")
            target_name = name
        elif opt == "--compile-profile":
            compile_profile = True
        elif opt in ("-h", "--help"):
            print(USAGE)
            return
        else:
            sys.exit(f"xlanb.run: unknown option {opt!r}\n{USAGE}")
    module = argv[:1] == ["-m"]
    if module:
        argv.pop(0)
    if not argv:
        sys.exit(USAGE)

    faulthandler.enable()
    os.environ.setdefault("PYTHONBREAKPOINT", "xlanb.set_trace")
    import xlanb.compat  # xlanb itself is imported already (XLANB_TARGET is read then)
    if target_name is not None:
        try:
            xlanb.set_target(target_name)
        except (ValueError, ImportError) as e:  # an unknown topology, or no libtpu
            sys.exit(f"xlanb.run: --target {target_name}: {e}")
        os.environ["XLANB_TARGET"] = target_name  # for the processes it starts
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            on = xlanb.compat.install(shadow=shadow)
        except ValueError as e:  # a torch_xla debugging variable with a bad value
            print(f"xlanb.run: {e}", file=sys.stderr)
            sys.exit(2)
    if not on:
        for w in caught:
            print(f"xlanb.run: {w.message}", file=sys.stderr)

    target = argv[0]
    missing = _missing(target, module)
    if missing:  # one line, as `python nosuch.py` says it, not runpy's traceback
        print(f"xlanb.run: {missing}", file=sys.stderr)
        sys.exit(2)
    sys.argv = argv
    interrupted = False
    try:
        if module:  # sys.path[0] is already the working folder, as for `python -m`
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py`
            runpy.run_path(target, run_name="__main__")
    except KeyboardInterrupt:
        interrupted = True  # no summary after a Ctrl-C (executables/target.py still ends
        # the compile in progress before exit: Ctrl-C again ends it at once)
        raise
    finally:
        if not interrupted:
            try:
                target_summary()
            except Exception as e:  # noqa: BLE001 - the summary never hides the program's end
                print(f"xlanb.run: no target summary ({type(e).__name__}: {e})", file=sys.stderr)
            if compile_profile:
                try:
                    print("xlanb.run: " + str(xlanb.compile_summary()).replace(
                        "\n", "\nxlanb.run: "), file=sys.stderr)
                except Exception as e:  # noqa: BLE001 - as above
                    print(f"xlanb.run: no compile profile ({type(e).__name__}: {e})",
                          file=sys.stderr)


if __name__ == "__main__":
    main()
