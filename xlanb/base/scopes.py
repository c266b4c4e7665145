"""The nn.Module path of each recorded op, kept by two global module hooks.

Its own module because ``torch.compile`` must trace these hooks (they run inside every
module call it traces) while it skips the rest of xlanb: under dynamo they do nothing.
"""
from __future__ import annotations

import contextlib
import weakref

import torch

from .caches import cache

scope_stack = cache([], "nn.Module paths being run")  # list[str]
_module_names = cache(weakref.WeakKeyDictionary(), "nn.Module -> its path")
# The iteration of a loop the program asked for (xlanb.scan) being recorded: every module
# it enters is named under it, so that each iteration's ops form one numbered segment
# (graph/repeats.py), whichever modules the loop's body calls.
_iterations = cache([], "scopes of the loop iterations being recorded")  # list[str]


def current_scope() -> str:
    return scope_stack[-1] if scope_stack else ""


def _enter_module(module, _args):
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if torch.compiler.is_compiling():
        return  # a graph being captured has no scope to track
    module = getattr(module, "_orig_mod", module)  # torch.compile's wrapper: name the model
    name = _module_names.get(module)
    if name is None:
        if scope_stack and isinstance(module, torch.fx.GraphModule):
            name = scope_stack[-1]  # a torch.compile graph runs in its model's scope
        elif scope_stack:
            name = f"{scope_stack[-1]}.?{type(module).__name__}"
        else:
            root = type(module).__name__
            for sub_name, sub in module.named_modules():
                _module_names.setdefault(sub, f"{root}.{sub_name}" if sub_name else root)
            name = _module_names[module]
    if _iterations and not name.startswith(_iterations[-1]):
        name = f"{_iterations[-1]}.{name}"
    scope_stack.append(name)


def _exit_module(module, _args, _out):
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if torch.compiler.is_compiling():
        return
    if scope_stack:
        scope_stack.pop()


def module_name(module) -> str | None:
    """The path ``module`` is known by (None before it first runs under a root)."""
    return _module_names.get(module)


@contextlib.contextmanager
def iteration(scope: str):
    """Record one iteration of a loop the program asked for under ``scope`` (``...scan.3``):
    its own ops, and every module it enters, named under it."""
    scope_stack.append(scope)
    _iterations.append(scope)
    try:
        yield
    finally:
        _iterations.pop()
        scope_stack.pop()


@contextlib.contextmanager
def in_scope(scope: str):
    """Record the ops of the block under ``scope``."""
    scope_stack.append(scope)
    try:
        yield
    finally:
        scope_stack.pop()


_scope_hooks = []


def install_scope_hooks() -> None:
    """Track the nn.Module path of each recorded op (global module hooks, once)."""
    if _scope_hooks:
        return
    from torch.nn.modules import module as m
    _scope_hooks.append(m.register_module_forward_pre_hook(_enter_module))
    _scope_hooks.append(m.register_module_forward_hook(_exit_module, always_call=True))
