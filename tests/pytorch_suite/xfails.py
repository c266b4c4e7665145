"""The known failures of PyTorch's device-generic tests on ``xla``: each entry names its
cause and what it waits for. Nothing else is disabled (see xla_device.py).

Keys are ``Class::test`` patterns (``fnmatch``: ``*`` for a dtype family); values are
``(cause, waits_for, modes)`` with ``modes`` None for every mode, or a tuple of
``eager`` / ``lazy-sync`` / ``opbyop``. A listed test that passes is reported as an
unexpected success, so the list cannot go stale silently.
"""
from __future__ import annotations

import fnmatch

XFAILS: dict[str, tuple[str, str, tuple | None]] = {
}


def xfail_cause(cls_name: str, test_name: str, mode: str) -> str | None:
    """The cause of ``cls_name::test_name``'s listed failure in ``mode``, else None."""
    full = f"{cls_name}::{test_name}"
    for pattern, (cause, _waits, modes) in XFAILS.items():
        if (modes is None or mode in modes) and fnmatch.fnmatchcase(full, pattern):
            return cause
    return None
