"""Where torch versions differ, in one place: which torch xlanb runs on, what each version
lacks, and what one version does differently.

Supported: torch 2.11 to 2.14 (each one is tested: docs/compat.md, ``.ci/run``).

- The floor is the device guard. xlanb registers the ``xla`` device in pure Python through
  ``torch._C._acc`` (a Python ``DeviceGuard`` and ``PrivateUse1Hooks``); torch 2.10 is
  the first release that has it (pytorch#157859), so an older torch cannot work
  (``GUARD``). 2.10 runs the demo but is not tested: the tested range starts at 2.11, the
  oldest CI installs (PyPI's 2.10 is a CUDA 12 build, 2.11-2.14 share CUDA 13 libraries).
- Ops one version has and another lacks are looked up by name (``aten_op``): a lowering of
  an op this torch lacks is skipped at registration, not an ``AttributeError`` at import.
  ``OP_VERSIONS`` lists the known ones, with the versions checked.
- Behaviour that one version gets wrong for xlanb is fixed by ``patch()``, which says
  which versions (2.11's fake-tensor checks).

Only this module reads ``torch.__version__`` to decide anything.
"""
from __future__ import annotations

import re
import warnings

import torch

__all__ = ["GUARD", "FLOOR", "NEWEST", "PIP_SPEC", "version", "supported", "check", "patch",
           "aten_op", "missing", "has_op", "OP_VERSIONS", "UnsupportedTorchError"]

# The oldest torch that can work (the device guard), and the tested range: the oldest and
# the newest torch (major, minor) CI runs.
GUARD = (2, 10)
FLOOR = (2, 11)
NEWEST = (2, 14)
PIP_SPEC = f"torch>={FLOOR[0]}.{FLOOR[1]},<{NEWEST[0]}.{NEWEST[1] + 1}"

# aten ops that only some supported versions have: name -> (the first torch that has it,
# the first that no longer does, why). None: every supported version. Checked on 2.11.0,
# 2.12.1, 2.13.0 and 2.14.1; their lowerings register only where the op exists.
OP_VERSIONS: dict[str, tuple[tuple[int, int] | None, tuple[int, int] | None, str]] = {
    "_foreach_clone": ((2, 12), None, "new in torch 2.12"),
    "cholesky": (None, (2, 14), "removed in torch 2.14: torch.cholesky raises there, "
                 "torch.linalg.cholesky (linalg_cholesky_ex) remains"),
}


def has_op(name: str, text: str | None = None) -> bool:
    """Whether torch ``text`` (default: this one) has aten op ``name``, by ``OP_VERSIONS``
    (an op not listed there is in every supported version)."""
    first, gone, _ = OP_VERSIONS.get(name, (None, None, ""))
    v = version(text)
    return (first is None or v >= first) and (gone is None or v < gone)


class UnsupportedTorchError(ImportError):
    """``import xlanb`` on a torch that cannot run it: one line, with the fix."""


def version(text: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``text`` (default: this torch's version), e.g. ``2.11.0+cu130``."""
    text = torch.__version__ if text is None else text
    m = re.match(r"(\d+)\.(\d+)", str(text))
    if m is None:
        raise ValueError(f"not a torch version: {text!r}")
    return int(m.group(1)), int(m.group(2))


def supported(text: str | None = None) -> bool:
    """Whether ``text`` (default: this torch) is in the tested range."""
    return FLOOR <= version(text) <= NEWEST


def _message(found: str) -> str:
    return (f"xlanb supports torch {FLOOR[0]}.{FLOOR[1]} to {NEWEST[0]}.{NEWEST[1]}; "
            f"found torch {found}. Fix: pip install '{PIP_SPEC}'")


def check() -> None:
    """Called first by ``import xlanb``. A torch without the Python device guard (older
    than ``GUARD``) raises ``UnsupportedTorchError``; one that has it but is outside the
    tested range (2.10, or newer than ``NEWEST``) warns and goes on (ops it lacks are
    skipped, as for any version)."""
    found = str(torch.__version__)
    if version(found) < GUARD or not hasattr(torch._C, "_acc"):
        raise UnsupportedTorchError(_message(found))
    if not supported(found):
        warnings.warn(_message(found) + " (untested: going on)", stacklevel=3)


_missing: list[str] = []


def aten_op(name: str):
    """``torch.ops.aten.<name>``, e.g. ``"cholesky.default"`` or ``"_foreach_clone"`` (the
    packet), or None where this torch has no such op or overload (``missing()`` names it)."""
    packet_name, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, packet_name, None)  # _OpNamespace raises AttributeError
    op = getattr(packet, overload, None) if packet is not None and overload else packet
    if op is None and name not in _missing:
        _missing.append(name)
    return op


def missing() -> list[str]:
    """The ops asked for through ``aten_op`` that this torch lacks (their lowerings were
    skipped)."""
    return list(_missing)


# Modules of torch 2.11.0 that bind these names of fake_tensor's (``from ... import``).
_FAKE_USERS = ("torch._subclasses.fake_tensor", "torch._subclasses.meta_utils",
               "torch._dynamo.utils", "torch._dynamo.variables.builder",
               "torch._functorch._aot_autograd.schemas", "torch.export.graph_signature",
               "torch._inductor.cudagraph_utils")


def patch() -> None:
    """Fixes for behaviour of one torch version, applied by ``import xlanb``.

    - torch < 2.12: ``fake_tensor.is_fake`` and ``maybe_get_fake_mode`` fail for a
      traceable wrapper subclass with no inner tensors ("got mixed fake and real
      tensors!", ``modes[0]``), which every XlaTensor is: ``torch.compile`` stopped at its
      inputs. 2.12 answers False and None for it; this gives 2.11 those answers and leaves
      every other case to torch.
    """
    if version() >= (2, 12):
        return
    import sys
    from torch._subclasses import fake_tensor
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    if getattr(fake_tensor.is_fake, "_xlanb_patched", False):
        return

    def no_inner(x) -> bool:
        return is_traceable_wrapper_subclass(x) and not type(x).__tensor_flatten__(x)[0]

    def fixed(orig, empty_answer):
        def fn(x):
            return empty_answer if no_inner(x) else orig(x)
        fn._xlanb_patched = True
        return fn

    for name, answer in (("is_fake", False), ("maybe_get_fake_mode", None)):
        orig = getattr(fake_tensor, name)
        new = fixed(orig, answer)
        for module_name in _FAKE_USERS:  # later imports read fake_tensor's own
            module = sys.modules.get(module_name)
            if module is not None and getattr(module, name, None) is orig:
                setattr(module, name, new)
