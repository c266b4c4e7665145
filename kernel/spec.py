"""The "Python 3 (xlanb)" Jupyter kernel spec: build it, install it, remove it.

The spec runs ``python -m xlanb.kernel launch -f {connection_file}``: an ordinary
ipykernel with ``%load_ext xlanb`` already done. ``mode`` (install time) is written to the
spec's ``env`` as ``XLANB_MODE``; without it the kernel takes ``XLANB_MODE`` from the
environment Jupyter runs in, and xlanb's default (lazy) otherwise.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

DEFAULT_NAME = "xlanb"
DISPLAY_NAME = "Python 3 (xlanb)"
MODES = ("lazy", "eager", "opbyop")  # xlanb.MODES, without importing torch and jax here


def kernel_json(mode: str | None = None, display_name: str | None = None,
                python: str | None = None) -> dict:
    """The kernel.json contents."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown xlanb mode {mode!r}; valid modes are: {', '.join(MODES)}")
    spec = {
        "argv": [python or sys.executable, "-m", "xlanb.kernel", "launch",
                 "-f", "{connection_file}"],
        "display_name": display_name or (DISPLAY_NAME if mode is None
                                         else f"{DISPLAY_NAME[:-1]}, {mode})"),
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": True, "xlanb": {"mode": mode}},
    }
    if mode is not None:
        spec["env"] = {"XLANB_MODE": mode}
    return spec


def write_spec(path: str, **kw) -> str:
    """Write kernel.json (and ipykernel's logos, where available) into ``path``."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "kernel.json"), "w") as f:
        json.dump(kernel_json(**kw), f, indent=1)
    try:
        from ipykernel.kernelspec import RESOURCES
        for logo in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
            src = os.path.join(RESOURCES, logo)
            if os.path.exists(src):
                shutil.copy(src, path)
    except Exception:  # logos are decoration
        pass
    return path


def install(name: str = DEFAULT_NAME, *, user: bool = False, prefix: str | None = None,
            mode: str | None = None, display_name: str | None = None) -> str:
    """Install the spec; returns the directory it went to. ``user``: the per-user Jupyter
    data dir; ``prefix``: PREFIX/share/jupyter/kernels (sys.prefix for --sys-prefix);
    neither: the system-wide dir."""
    from jupyter_client.kernelspec import KernelSpecManager
    with tempfile.TemporaryDirectory() as tmp:
        src = write_spec(os.path.join(tmp, name), mode=mode, display_name=display_name)
        return KernelSpecManager().install_kernel_spec(src, name, user=user, prefix=prefix)


def spec_dir(name: str, *, user: bool = False, prefix: str | None = None) -> str | None:
    """Where ``name`` is installed: at that location, or (neither given) wherever Jupyter
    finds it first. None when it is not installed."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_core.paths import jupyter_data_dir
    if user:
        path = os.path.join(jupyter_data_dir(), "kernels", name)
    elif prefix:
        path = os.path.join(prefix, "share", "jupyter", "kernels", name)
    else:
        return KernelSpecManager().find_kernel_specs().get(name)
    return path if os.path.isdir(path) else None


def uninstall(name: str = DEFAULT_NAME, *, user: bool = False,
              prefix: str | None = None) -> str:
    """Remove the spec; returns the directory removed. FileNotFoundError if absent."""
    path = spec_dir(name, user=user, prefix=prefix)
    if path is None:
        raise FileNotFoundError(f"no kernel spec named {name!r} is installed"
                                + (" there" if user or prefix else ""))
    shutil.rmtree(path)
    return path
