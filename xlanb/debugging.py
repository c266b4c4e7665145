"""Is a debugger stopped in this process? (pdb, ipdb, IPython's debugger: all bdb-based.)

While one is, ``.cpu()``, ``.item()`` and ``.tolist()`` peek instead of syncing, so that
inspecting a value from a breakpoint never changes what the program compiles.
"""
from __future__ import annotations

import bdb
import sys


def debugger_active() -> bool:
    trace = sys.gettrace()
    if trace is not None and isinstance(getattr(trace, "__self__", None), bdb.Bdb):
        return True
    # Python 3.12+ debuggers may trace through sys.monitoring instead of settrace.
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None and monitoring.get_tool(monitoring.DEBUGGER_ID) is not None:
        return True
    return False
