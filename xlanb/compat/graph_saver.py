"""``torch_xla.debug.graph_saver``: ``save_tensors_graph(save_dir, name, tensors)`` writes
the pending graph of ``tensors`` (nothing runs) to ``save_dir/<name>-<thread>-<n>.<fmt>``,
``n`` counting the saves of ``name`` on the thread, in the format ``SAVE_GRAPH_FMT`` names:
``text`` (xlanb's pending IR, the default), ``dot`` or ``hlo``. ``XLA_SAVE_TENSORS_FILE``
saves every synced graph instead."""
from __future__ import annotations

import os
import threading
from collections import defaultdict

from . import xlac as _xlac
from .missing import module_getattr

NAME = "torch_xla.debug.graph_saver"

__all__ = ["save_tensors_graph"]

__getattr__ = module_getattr(NAME)

_FORMATS = {"text": _xlac._get_xla_tensors_text, "dot": _xlac._get_xla_tensors_dot,
            "hlo": _xlac._get_xla_tensors_hlo}
_lock = threading.Lock()
_counts: dict = defaultdict(int)  # (thread, name) -> saves so far


def save_tensors_graph(save_dir, name: str, tensors) -> str:
    """Write the graph that computes ``tensors`` under ``save_dir``; returns the path."""
    fmt = os.environ.get("SAVE_GRAPH_FMT", "text")
    if fmt not in _FORMATS:
        raise RuntimeError(f"Invalid save graph format: {fmt} (SAVE_GRAPH_FMT takes "
                           f"{', '.join(_FORMATS)})")
    graph = _FORMATS[fmt](list(tensors))
    tid = threading.get_ident()
    with _lock:
        n = _counts[(tid, name)]
        _counts[(tid, name)] = n + 1
    path = os.path.join(save_dir, f"{name}-{tid}-{n}.{fmt}")
    with open(path, "w") as f:
        f.write(graph)
    return path
