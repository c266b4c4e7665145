"""libtpu on a machine without a TPU: the TPU compiler, for ahead-of-time compiles only.

With the ``libtpu`` package installed, JAX loads it the first time it looks for devices,
even where no TPU exists. On such a machine libtpu prints start-up warnings (no
``TPU_ACCELERATOR_TYPE``, no ``TPU_WORKER_HOSTNAMES``) and takes a lock file that keeps
any other process from loading it, so a second process could not compile for a TPU
topology at all ("Internal error when accessing libtpu multi-process lockfile"). Without
a TPU there is nothing the lock protects: ``prepare()`` lifts it, and ``quiet()`` keeps
the warnings from the user's terminal (they stay readable in ``startup_log``).
"""
from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import re
import sys
import tempfile
import threading

from ..base.config import config

# What libtpu prints when it starts on a machine with no TPU: expected, and no help.
_NOISE = re.compile(
    r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Logging before InitGoogle|"
    r"Source Location Trace|libtpu_init_utils|Failed to find host bounds|"
    r"^\s*$|^learning/|common_lib\.cc|could not determine TPU")

startup_log: list[str] = []  # the libtpu output ``quiet`` kept from the terminal
_lock = threading.Lock()
# Whether libtpu's plugin was loaded into this process with no TPU here (for a target).
# JAX's profiler then crashes the process (SIGSEGV in xla::profiler::PluginTracer::Start,
# libtpu 0.0.52, jax 0.10.2): ``profiler_safe`` says whether it may start.
_plugin_loaded = [False]


def installed() -> bool:
    """Whether the ``libtpu`` package (the TPU compiler) is importable."""
    return importlib.util.find_spec("libtpu") is not None


def has_tpu() -> bool:
    """Whether this machine has TPU chips (their device files: ``/dev/accel*`` on v2-v5e,
    ``/dev/vfio/N`` on v5p and v6e)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _gpu_plugin_installed() -> bool:
    return any(importlib.util.find_spec(name) is not None for name in
               ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin"))


def prepare() -> None:
    """Before JAX first looks for devices, where libtpu is installed and no TPU is here:
    let every process load libtpu (for targets), and keep JAX's own search for devices
    from loading it. JAX would try the TPU, fail, and go on with the CPU, but with the
    plugin loaded its profiler crashes the process. With no GPU plugin either, the CPU
    is the only platform there is, so JAX is told so (``jax_platforms="cpu"``: what the
    user's own JAX code gets is unchanged). The user's own settings win.

    libtpu logs each compile's stage durations, and holds its log lines back for up to
    30 s: ``--logbufsecs=0`` writes them at once, for the compile profile
    (``compile_profile.py``), unless the user set it or turned the profile off."""
    if not installed():
        return
    flags = os.environ.get("LIBTPU_INIT_ARGS", "")
    if config.compile_profile and "logbufsecs" not in flags:
        os.environ["LIBTPU_INIT_ARGS"] = (flags + " --logbufsecs=0").strip()
    if has_tpu():
        return
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if "JAX_PLATFORMS" in os.environ or _gpu_plugin_installed():
        return
    import jax
    from .jax_compat import backends_started
    if jax.config.jax_platforms is None and not backends_started():
        jax.config.update("jax_platforms", "cpu")


def plugin_loaded() -> None:
    """A target loaded libtpu's plugin into this process (see ``_plugin_loaded``)."""
    if not has_tpu():
        _plugin_loaded[0] = True


def profiler_safe() -> bool:
    """Whether JAX's profiler can start here without crashing (see ``_plugin_loaded``):
    not where libtpu is loaded (by a target, or by anything else) with no TPU here."""
    if _plugin_loaded[0]:  # first: whatever installed() says now, it is loaded
        return False
    if not installed() or has_tpu():
        return True
    try:
        with open("/proc/self/maps") as f:
            return "libtpu" not in f.read()
    except OSError:  # not Linux: only what xlanb loaded is known
        return True


@contextlib.contextmanager
def quiet():
    """Keep what native code writes to stderr meanwhile (libtpu's start-up warnings)
    from the terminal; lines that are not libtpu's known no-TPU warnings are written
    out afterwards. Only where libtpu is installed and no TPU is here."""
    if not installed() or has_tpu():
        yield
        return
    with _lock:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no real stderr (an embedded interpreter)
            yield
            return
        with tempfile.TemporaryFile(mode="w+b") as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                text = tmp.read().decode(errors="replace")
        kept = text.splitlines()
        startup_log.extend(kept)
        other = [line for line in kept if not _NOISE.search(line)]
        if other:
            sys.stderr.write("\n".join(other) + "\n")
