"""What several test files share: the one environment policy for the processes tests
start, and IPython's shell with the extension loaded."""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The parent's variables a child never inherits: xlanb's settings (a test that sets one
# for itself must not set it for the programs it starts), JAX's cache (the user's), and a
# breakpoint hook (a child that stops would hang the test).
_NOT_INHERITED = ("XLANB_", "JAX_COMPILATION_CACHE", "PYTHONBREAKPOINT", "PYTEST_ADDOPTS")


def child_env(extra: dict | None = None, **more) -> dict:
    """The environment of a process a test starts: the parent's, without its xlanb
    settings; this checkout first on ``PYTHONPATH`` (the child imports the xlanb under
    test); warnings off; the executable store off. ``extra`` and ``more`` are added
    last (a value of None removes the variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["XLANB_STORE_DIR"] = ""
    for k, v in {**(extra or {}), **more}.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def loaded_shell(shell, kind: str, names=()):
    """A generator for a fixture: ``shell`` (IPython's InteractiveShell) with the
    extension loaded and ``torch, xlanb`` imported, in a notebook-like (every mime type)
    or terminal-like (text/plain only) display set-up; afterwards the extension is
    unloaded, the display restored, and ``names`` dropped from the namespace."""
    from IPython.utils.capture import capture_output
    fmt = shell.display_formatter
    saved = list(fmt.active_types)
    fmt.active_types = list(fmt.format_types) if kind == "notebook" else ["text/plain"]
    shell.run_line_magic("load_ext", "xlanb")
    shell.run_cell("import torch, xlanb", store_history=True)
    shell.display_kind = kind
    try:
        yield shell
    finally:
        with capture_output():
            shell.run_line_magic("unload_ext", "xlanb")
        fmt.active_types = saved
        for name in names:
            shell.user_ns.pop(name, None)
