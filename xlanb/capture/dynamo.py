"""``torch.compile(fn, backend="xlanb")``: dynamo captures the Python, xlanb runs the graph.

Dynamo traces the function with fake tensors on the xla device (``XlaTensor`` unflattens
into one) and hands this backend a graph of torch ops. No AOTAutograd: the graph runs on
the real ``XlaTensor`` s, so

- with autograd recording (an input requires grad and grad mode is on), its ops are
  traced lazily like any user code, and autograd builds the backward from them;
- otherwise the graph goes through ``xlanb.compile``: traced until two calls agree, then
  its executable replays without Python.

Either way the graphs show up in ``xlanb.graphs()`` and the ``%xla_*`` magics. Found by
torch through the ``torch_dynamo_backends`` entry point, so ``import torch._dynamo`` (about
a second) is paid only by those who use it.
"""
from __future__ import annotations

import pkgutil
import warnings

import torch
import torch._dynamo.trace_rules
from torch._dynamo.backends.registry import register_backend

from ..base.frames import PACKAGE_DIR
from .function import compile as xlanb_compile


def _skip_xlanb_frames() -> None:
    # Between dynamo's graphs (after a graph break) ops run eagerly with dynamo's frame
    # hook on; without this it would compile xlanb's own dispatch code as user code.
    # xlanb.base.scopes stays traceable: its module hooks run inside every module call
    # dynamo traces, and a skipped hook would break the graph there. Modules one by one:
    # skipping a package skips its whole folder, scopes included.
    root = PACKAGE_DIR
    names = [m.name for m in pkgutil.walk_packages([root], "xlanb.") if not m.ispkg]
    names += ["xlanb.extensions", "xlanb.kernel"]
    for name in names:
        if name != "xlanb.base.scopes":
            torch._dynamo.trace_rules.add(name)


_skip_xlanb_frames()
# torch warns that global module hooks fire once more for torch.compile's wrapper module;
# xlanb's scope hooks name the wrapped model instead, so the extra call is harmless.
warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")


def _needs_autograd(args) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def xlanb_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The dynamo backend: returns the callable dynamo runs in place of the graph."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    forward = gm.forward
    replay = xlanb_compile(forward, name=f"torch.compile graph {compile_id}")

    def run(*args):
        if _needs_autograd(args):
            return forward(*args)
        return replay(*args)

    run.xlanb_compiled = replay  # .status(), .replays: what happened to this graph
    return run


# Installed, torch finds the backend through the entry point and registers it itself;
# from a source tree without one, importing this module registers it.
if "xlanb" not in torch._dynamo.list_backends(exclude_tags=()):
    register_backend(xlanb_backend, name="xlanb")
