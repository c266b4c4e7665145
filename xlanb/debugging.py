"""Is a debugger stopped at its prompt in this process? (pdb, ipdb, IPython's debugger,
post-mortem included: all call ``bdb.Bdb.interaction``-style entry points.)

While one is, ``.cpu()``, ``.item()`` and ``.tolist()`` peek instead of syncing, so that
inspecting a value from a breakpoint never changes what the program compiles. Tracing
being on is not enough: with a breakpoint set further down, the program's own
``.item()`` calls must keep their normal meaning until the debugger actually stops.
"""
from __future__ import annotations

import bdb
import sys


def debugger_active() -> bool:
    """True when called (indirectly) from a debugger's interactive prompt."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "interaction" and isinstance(f.f_locals.get("self"), bdb.Bdb):
            return True
        f = f.f_back
    return False
