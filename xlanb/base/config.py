"""User-facing settings, read once from the environment and changeable at run time.

``XLANB_MODE``       initial execution mode (lazy | eager | opbyop)
``XLANB_PLATFORM``   JAX platform for the xla device (cpu | gpu | tpu); default: JAX's default
``XLANB_CACHE_DIR``  where executables persist between processes; empty turns it off
``XLANB_CACHE_MAX_BYTES``  the cap on that store, in bytes or with a K, M, G or T suffix
                     (powers of 1024); default 2G
``XLANB_STORE_KEY``  the file holding the secret that signs the store's entries;
                     default ``$XDG_CONFIG_HOME/xlanb/store-key`` (``~/.config/...``)
``XLANB_INSPECT``    how repr/print show a pending tensor (peek | sync | meta)
``XLANB_DEBUG``      1: print each recompile and its explanation as it happens
``XLANB_BACKGROUND_COMPILE``  0: eager mode compiles each new op before running it,
                     instead of going on while XLA compiles it on a background thread
``XLANB_DEBUG_NANS``  1: find the first op that makes a NaN or Inf (``xlanb.debug_nans``)
``XLANB_MEMORY_LIMIT``  device bytes a graph may take, checked before it runs (``16G``;
                     ``xlanb.memory_limit``)
``XLANB_MEMORY_LINE_BYTES``  eager results of at least this size remember their line for
                     ``xlanb.memory_by_line`` (default 256 KiB; lazy and opbyop: all)
``XLANB_TARGET``     a TPU topology (``v5e:2x2``) every graph also compiles for, with
                     libtpu and no TPU (``xlanb.target``); execution stays here
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


def _default_store_key() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "xlanb", "store-key")


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"2G"`` -> 2147483648: a positive byte count, with an optional K/M/G/T suffix."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    try:
        n = int(float(t[:len(t) - len(unit)]) * _UNITS[unit])
    except (ValueError, OverflowError):
        n = 0
    if n <= 0:
        raise ValueError(f"not a positive size in bytes (e.g. 2147483648, 500M, 2G): {text!r}")
    return n


class Config:
    """``xlanb.config``: a plain object whose setters validate."""

    def __init__(self) -> None:
        self.platform: str | None = os.environ.get("XLANB_PLATFORM") or None
        # checked (and resolved) at import by xlanb.set_target
        self.target: str | None = os.environ.get("XLANB_TARGET") or None
        self.cache_dir: str | None = _default_cache_dir()
        # The executable store's cap; least recently used entries go first.
        try:
            self.cache_max_bytes: int = parse_bytes(os.environ.get("XLANB_CACHE_MAX_BYTES") or "2G")
        except ValueError as e:
            raise ValueError(f"XLANB_CACHE_MAX_BYTES: {e}") from None
        # Signs the store's entries; outside the cache directory, readable only by the user.
        self.store_key_file: str = os.environ.get("XLANB_STORE_KEY") or _default_store_key()
        self._inspect = "peek"
        self.inspect = os.environ.get("XLANB_INSPECT", "peek")
        # Warn once per op that falls back to CPU torch.
        self.warn_fallbacks = True
        # XLA clamps an out-of-range index where torch raises IndexError. Index values the
        # host has are always checked (free); with this on, so are small index tensors
        # already on the device (read back: a transfer, never a sync of pending work).
        self.check_device_indices = os.environ.get("XLANB_CHECK_DEVICE_INDICES", "1") not in ("", "0")
        # Print every recompile with its explanation (XLANB_DEBUG=1).
        self.debug = os.environ.get("XLANB_DEBUG", "") not in ("", "0")
        # Eager mode: compile new ops' executables on background threads (dispatch.py).
        self.background_compile = os.environ.get("XLANB_BACKGROUND_COMPILE", "1") not in ("", "0")
        # Peeks (a look in pdb) first compile missing single-op executables quickly, with
        # LLVM's optimizations off, and the optimized ones after, in the background.
        self.quick_peeks = os.environ.get("XLANB_QUICK_PEEKS", "1") not in ("", "0")
        # Warn when one source line compiles this many graphs in at most twice as many syncs.
        self.frequent_compiles = 3
        # Check every sync (and every eager op) for NaN/Inf and name the first op that
        # made one. Turned on and off with xlanb.debug_nans(), which also records where
        # backward ops come from; XLANB_DEBUG_NANS=1 turns it on at import.
        self.debug_nans = os.environ.get("XLANB_DEBUG_NANS", "") not in ("", "0")
        # Bytes of peeked values kept until the next sync (base/session.py PeekCache).
        self.peek_cache_bytes = int(os.environ.get("XLANB_PEEK_CACHE_BYTES") or 256 << 20)
        # Single-op executables kept loaded (execute/resident.py); 0: derived from the
        # kernel's limit on memory mappings, which XLA's executables use up.
        self.max_executables = int(os.environ.get("XLANB_MAX_EXECUTABLES") or 0)
        # Graph executables kept loaded (execute/resident.py); a dropped one comes back
        # from the executable store, or compiles again, when its graph runs again.
        self.max_graphs = int(os.environ.get("XLANB_MAX_GRAPHS") or 256)
        # Device bytes a graph (or an eager op) may take, checked before it runs
        # (execute/memory.py; xlanb.memory_limit); None: no check.
        try:
            limit = os.environ.get("XLANB_MEMORY_LIMIT") or ""
            self.memory_limit: int | None = parse_bytes(limit) if limit else None
            # xlanb.memory_limit("target"): every graph must fit the target's HBM per
            # chip, as the TPU compiler says (execute/target.py), before it runs here
            self.memory_limit_target = False
        except ValueError as e:
            raise ValueError(f"XLANB_MEMORY_LIMIT: {e}") from None

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
