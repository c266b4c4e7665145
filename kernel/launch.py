"""Start the xlanb kernel: ipykernel's IPKernelApp with the xlanb extension loaded.

The extension is added as an *extra* extension (``--ext xlanb``), so extensions the user
configured in their IPython profile still load too.
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
    IPKernelApp.launch_instance(argv=["--ext", "xlanb", *argv])
