"""Start the xlanb kernel: ipykernel's IPKernelApp with the xlanb extension loaded.

The extension is loaded on top of whatever the user's IPython profile loads, so their own
extensions still load too.
"""
from __future__ import annotations

import faulthandler
import os


def main(argv: list[str]) -> None:
    """Run the kernel; ``argv`` is what ipykernel takes (``-f CONNECTION_FILE`` ...), plus
    an optional ``--mode M`` that sets XLANB_MODE before xlanb is imported."""
    # A native crash (XLA, a compile thread) then leaves every thread's Python stack in
    # the kernel's log, for the user to report, instead of a silent dead kernel.
    faulthandler.enable()
    argv = list(argv)
    if "--mode" in argv:
        i = argv.index("--mode")
        os.environ["XLANB_MODE"] = argv[i + 1]
        del argv[i:i + 2]
    from ipykernel.kernelapp import IPKernelApp
    app = IPKernelApp.instance()
    app.initialize(argv)
    # Loaded directly rather than through IPython's extension manager (``--ext``), so a
    # notebook's own ``%load_ext xlanb`` (needed on a plain python3 kernel) is silent
    # here instead of printing "already loaded".
    try:
        import xlanb
        xlanb.load_ipython_extension(app.shell)
    except Exception:  # as IPython does for --ext: the kernel still starts, and says why
        app.log.exception("xlanb: the IPython extension failed to load")
    app.start()
