"""User-facing settings, read once from the environment and changeable at run time.

``XLANB_MODE``       initial execution mode (lazy | eager | opbyop)
``XLANB_PLATFORM``   JAX platform for the xla device (cpu | gpu | tpu); default: JAX's default
``XLANB_CACHE_DIR``  where executables persist between processes; empty turns it off
``XLANB_INSPECT``    how repr/print show a pending tensor (peek | sync | meta)
``XLANB_DEBUG``      1: print each recompile and its explanation as it happens
``XLANB_BACKGROUND_COMPILE``  0: eager mode compiles each new op before running it,
                     instead of going on while XLA compiles it on a background thread
``XLANB_PEEK_CACHE_BYTES``  how many bytes of values peeks keep until the next sync
                     (default 256 MiB); past that the least recently used are recomputed
"""
from __future__ import annotations

import os

INSPECT_CHOICES = ("peek", "sync", "meta")
MODES = ("lazy", "eager", "opbyop")


def check_mode(name) -> str:
    """``name`` if it is an execution mode; the one ValueError, listing them, if not."""
    if name not in MODES:
        raise ValueError(f"unknown xlanb mode {name!r}; valid modes are: {', '.join(MODES)}")
    return name


def _default_cache_dir() -> str | None:
    if "XLANB_CACHE_DIR" in os.environ:
        return os.environ["XLANB_CACHE_DIR"] or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xlanb", "jax")


class Config:
    """``xlanb.config``: a plain object whose setters validate."""

    def __init__(self) -> None:
        self.platform: str | None = os.environ.get("XLANB_PLATFORM") or None
        self.cache_dir: str | None = _default_cache_dir()
        self._inspect = "peek"
        self.inspect = os.environ.get("XLANB_INSPECT", "peek")
        # Warn once per op that falls back to CPU torch.
        self.warn_fallbacks = True
        # Print every recompile with its explanation (XLANB_DEBUG=1).
        self.debug = os.environ.get("XLANB_DEBUG", "") not in ("", "0")
        # Eager mode: compile new ops' executables on background threads (dispatch.py).
        self.background_compile = os.environ.get("XLANB_BACKGROUND_COMPILE", "1") not in ("", "0")
        # Warn when one source line compiles this many graphs in at most twice as many syncs.
        self.frequent_compiles = 3
        # Bytes of peeked values kept until the next sync (base/session.py PeekCache).
        self.peek_cache_bytes = int(os.environ.get("XLANB_PEEK_CACHE_BYTES") or 256 << 20)

    @property
    def inspect(self) -> str:
        return self._inspect

    @inspect.setter
    def inspect(self, value: str) -> None:
        if value not in INSPECT_CHOICES:
            raise ValueError(f"xlanb.config.inspect must be one of {', '.join(INSPECT_CHOICES)}; got {value!r}")
        self._inspect = value

    def __repr__(self) -> str:
        return (f"xlanb.config(platform={self.platform!r}, cache_dir={self.cache_dir!r}, "
                f"inspect={self.inspect!r})")


config = Config()
