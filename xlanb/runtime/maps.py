"""How close this process is to the kernel's cap on memory mappings (issue 26).

Every XLA:CPU executable loaded in a process keeps its JIT-compiled code in memory
mappings of its own: about 3.2 per single-op executable, measured with jaxlib 0.10.2.
Linux caps a process at ``vm.max_map_count`` mappings (65,530 by default). Past it, LLVM
cannot map the next executable's code (XLA logs "LLVM compilation error: Cannot allocate
memory") and XLA goes on to crash the process with SIGSEGV wherever it next needs a
mapping: inside a compile, or inside ``serialize_executable`` on a compile thread, which
is where a long eager session first met it. xlanb keeps a bounded set of executables
loaded (``executables/resident.py``) and checks the headroom here before it compiles or
loads another, so the process gets a Python error it can survive instead.
"""
from __future__ import annotations

import functools

_MAPS = "/proc/self/maps"


@functools.cache
def limit() -> int | None:
    """The process's cap on memory mappings, or None where there is none to read (not
    Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def count() -> int:
    """Memory mappings the process holds now (one line of /proc/self/maps each). Costs
    about 1 ms per 10,000 mappings: callers sample it."""
    try:
        with open(_MAPS, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0
