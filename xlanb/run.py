"""``python -m xlanb.run [--shadow] script.py [args]``: run a torch_xla program unchanged
on xlanb (``-m module`` runs a module instead of a script).

The program runs as ``__main__`` with ``sys.argv`` set to ``[script, *args]`` and its
folder first on ``sys.path``, as ``python script.py args`` would. ``import torch_xla``
gives xlanb's modules (``xlanb.compat``), so every xlanb tool works on it: ``breakpoint()``
opens xlanb's pdb (``PYTHONBREAKPOINT=xlanb.set_trace`` unless you set it), and
``XLANB_MODE=eager`` runs a lazy program op by op. ``faulthandler`` is on, so a native
crash still prints the Python stack. If the real torch_xla is installed, it is used
unless ``--shadow`` is given.
"""
from __future__ import annotations

import faulthandler
import os
import runpy
import sys

USAGE = ("usage: python -m xlanb.run [--shadow] script.py [args ...]\n"
         "       python -m xlanb.run [--shadow] -m module [args ...]\n"
         "Runs a torch_xla program unchanged on xlanb; --shadow runs it on xlanb even "
         "when the real torch_xla is installed.")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    shadow = False
    while argv and argv[0].startswith("-") and argv[0] != "-m":
        opt = argv.pop(0)
        if opt == "--shadow":
            shadow = True
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
    import xlanb.compat
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        on = xlanb.compat.install(shadow=shadow)
    if not on:
        for w in caught:
            print(f"xlanb.run: {w.message}", file=sys.stderr)

    target = argv[0]
    sys.argv = argv
    if module:  # sys.path[0] is already the working folder, as for `python -m`
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py`
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
