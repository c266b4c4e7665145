"""User-facing settings, read once from the environment and changeable at run time.

``XLANB_MODE``       initial execution mode (lazy | eager | opbyop)
``XLANB_PLATFORM``   JAX platform for the xla device (cpu | gpu | tpu); default: JAX's default
``XLANB_STORE_DIR``  where the executable store keeps executables between processes;
                     empty turns it off (``XLANB_CACHE_DIR``, its first name, still works)
``XLANB_STORE_MAX_BYTES``  the cap on that store, in bytes or with a K, M, G or T suffix
                     (powers of 1024); default 2G (``XLANB_CACHE_MAX_BYTES`` still works)
``XLANB_STORE_KEY``  the file holding the secret that signs the store's entries;
                     default ``$XDG_CONFIG_HOME/xlanb/store-key`` (``~/.config/...``)
``XLANB_INSPECT``    how repr/print show a pending tensor (peek | sync | meta)
``XLANB_DEBUG``      1: print each recompile and its explanation as it happens
``XLANB_BACKGROUND_COMPILE``  0: eager mode compiles each new op before running it,
                     instead of going on while XLA compiles it on a background thread
``XLANB_EAGER_RUNS``  the most ops eager mode compiles as one run (default 2048); 0: each
                     new op compiles alone, as before (``execute/graphs.py``)
``XLANB_QUICK_COMPILES``  0: lazy graphs and eager runs compile with XLA's full optimizations at once
``XLANB_SEGMENTS``   0: a graph whose shapes changed compiles whole again, instead of
                     only its segments whose shapes changed (``graph/segments.py``)
``XLANB_STRICT_RECOMPILES``  1: a recompile after warm-up (the ops of a graph compiled
                     before, at other shapes; or a line's third new graph) raises
                     ``xlanb.RecompileError`` with its explanation instead of compiling
                     (vLLM's ``VLLM_XLA_CHECK_RECOMPILATION``; default off)
``XLANB_HOST_SEGMENT_BYTES``  a changed segment of at most these bytes (inputs and
                     outputs) runs on CPU torch instead of compiling (default 64K; 0: never;
                     ``execute/host.py``)
``XLANB_TIER_UP``    sightings of an op signature after which its own optimized
                     executable compiles in the background (default 3; 0: never)
``XLANB_IDLE_TIER_UP``  runs after which a quick eager run starts its optimized compile
                     when a notebook cell ends, in the user's think time (default 4; 0:
                     never; ``xlanb.optimize_hot_graphs``)
``XLANB_DEBUG_NANS``  1: find the first op that makes a NaN or Inf (``xlanb.debug_nans``)
``XLANB_MEMORY_LIMIT``  device bytes a graph may take, checked before it runs (``16G``;
                     ``xlanb.memory_limit``)
``XLANB_MEMORY_LINE_BYTES``  eager results of at least this size remember their line for
                     ``xlanb.memory_by_line`` (default 256 KiB; lazy and opbyop: all)
``XLANB_TARGET``     a TPU topology (``v5e:2x2``) every graph also compiles for, with
                     libtpu and no TPU (``xlanb.target``); execution stays here
``XLANB_SCAN_LAYERS``  1: lower a graph's repeated layers (a transformer's, a ResNet
                     stage's) as one loop each, so XLA compiles one layer's body; 0:
                     unrolled; auto (the default): loops in TPU compiles of 8 or more
                     layers (on XLA:CPU the loop did not compile faster)
``XLANB_COMPILE_PROFILE``  0: graph compiles are timed only, without XLA's own phase
                     spans (``graphs()[i].compile_profile``; default on)
``XLANB_PEEK_CACHE_BYTES``  how many bytes of values peeks keep until the next sync
                     (default 256 MiB); past that the least recently used are recomputed
``XLANB_DIST_CHECK``  0: several processes do not check that they agree before each run
                     over all of them (``xlanb.distributed``; default on)
``XLANB_DIST_TIMEOUT``  seconds a process waits for the others at that check before it
                     names the missing one and every process stops (default 600)
``XLANB_DIST_RECENT``  multi-process runs each process remembers (``xlanb.distributed.recent()``)
"""
from __future__ import annotations

import os
from typing import NamedTuple

from .formats import parse_bytes

INSPECT_CHOICES = ("peek", "sync", "meta")
MODES = ("lazy", "eager", "opbyop")
# XLA's precisions for float32 dots and convolutions (torch_xla's set_mat_mul_precision)
MAT_MUL_PRECISIONS = ("default", "high", "highest")


def check_mode(name) -> str:
    """``name`` if it is an execution mode; the one ValueError, listing them, if not."""
    if name not in MODES:
        raise ValueError(f"unknown xlanb mode {name!r}; valid modes are: {', '.join(MODES)}")
    return name


# Settings renamed: new name -> the first one, still read when the new one is not set.
RENAMED_VARIABLES = {"XLANB_STORE_DIR": "XLANB_CACHE_DIR",
                     "XLANB_STORE_MAX_BYTES": "XLANB_CACHE_MAX_BYTES"}


def _variable(name: str) -> str:
    """``name``, or its first name when only that is set (so errors name what was set)."""
    old = RENAMED_VARIABLES.get(name)
    return old if old and name not in os.environ and old in os.environ else name


def _default_store_dir() -> str | None:
    var = _variable("XLANB_STORE_DIR")
    if var in os.environ:
        return os.environ[var] or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xlanb", "jax")


def default_store_key() -> str:
    """Where the store's signing key lives unless ``XLANB_STORE_KEY`` says otherwise."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "xlanb", "store-key")




PLATFORMS = ("cpu", "gpu", "cuda", "rocm", "tpu")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


class SettingError(ValueError):
    """An ``XLANB_*`` variable (or ``xlanb.config`` field) with a value it does not take."""


def _refuse(name: str, value, accepts: str):
    raise SettingError(f"{name}={value!r} is not valid: it takes {accepts}")


def check_flag(name: str, value) -> bool:
    """On or off: a bool, 1/0, or text as the environment takes it: 1/0, true/false,
    yes/no, on/off (empty: off)."""
    if isinstance(value, bool) or isinstance(value, int) and value in (0, 1):
        return bool(value)
    v = value.strip().lower() if isinstance(value, str) else None
    if v in _TRUE or v in _FALSE:
        return v in _TRUE
    _refuse(name, value, "1 or 0 (also true/false, yes/no, on/off)")


def env_flag(name: str, default: bool) -> bool:
    """An on/off variable (``check_flag``)."""
    raw = os.environ.get(name)
    return default if raw is None else check_flag(name, raw)


def check_count(name: str, value, minimum: int, accepts: str = "") -> int:
    """``value`` as a whole number of at least ``minimum``, or a SettingError naming ``name``."""
    what = f"a whole number >= {minimum}" + (f" ({accepts})" if accepts else "")
    try:
        n = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        n = None
    if n is None or n < minimum:
        _refuse(name, value, what)
    return n


def env_count(name: str, default: int, minimum: int, accepts: str = "") -> int:
    raw = os.environ.get(name)
    return default if raw in (None, "") else check_count(name, raw, minimum, accepts)


def check_size(name: str, value, minimum: int = 1) -> int:
    """A byte count (an int, or text with a K/M/G/T suffix) of at least ``minimum``."""
    what = ("a size in bytes" + (" > 0" if minimum > 0 else " >= 0")
            + ", as a number or with a K, M, G or T suffix (e.g. 500M, 2G)")
    if isinstance(value, bool):
        _refuse(name, value, what)
    if isinstance(value, int):
        n = value
    elif minimum <= 0 and str(value).strip() == "0":
        n = 0
    else:
        try:
            n = parse_bytes(str(value))
        except ValueError:
            _refuse(name, value, what)
    if n < minimum:
        _refuse(name, value, what)
    return n


def check_seconds(name: str, value) -> float:
    """A positive number of seconds (``1.5`` works)."""
    try:
        n = float(str(value).strip()) if not isinstance(value, bool) else 0.0
    except ValueError:
        n = 0.0
    if not n > 0 or n == float("inf"):
        _refuse(name, value, "a positive number of seconds (e.g. 600, 2.5)")
    return n


def env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return default if raw in (None, "") else check_seconds(name, raw)


def env_size(name: str, default, minimum: int = 1):
    raw = os.environ.get(name)
    return default if raw in (None, "") else check_size(name, raw, minimum)


def check_scan(name: str, value):
    """Repeated layers as loops: "auto" (also None or empty), or on/off (``check_flag``)."""
    if value is None or isinstance(value, str) and value.strip().lower() in ("", "auto"):
        return "auto"
    try:
        return check_flag(name, value)
    except SettingError:
        _refuse(name, value, "auto, 1 or 0 (also true/false, yes/no, on/off)")


def check_choice(name: str, value, choices) -> str:
    """One of ``choices`` (any case)."""
    v = value.strip().lower() if isinstance(value, str) else None
    if v not in choices:
        _refuse(name, value, "one of " + ", ".join(choices))
    return v


def env_choice(name: str, choices, default):
    raw = os.environ.get(name)
    return default if raw in (None, "") else check_choice(name, raw, choices)


def check_platform(name: str, value):
    """None (JAX's default) or JAX platforms, comma-separated."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or \
            not all(p.strip().lower() in PLATFORMS for p in value.split(",")):
        _refuse(name, value, "one of " + ", ".join(PLATFORMS)
                + " (or a comma-separated list of them)")
    return value


def check_path(name: str, value) -> str:
    """A file or folder: text or a path object."""
    try:
        return os.fspath(value)
    except TypeError:
        _refuse(name, value, "a path")


def optional(check):
    """``check``, or None (the setting off)."""
    def check_or_none(name, value, *args):
        return None if value is None else check(name, value, *args)
    return check_or_none


class LaunchSettings(NamedTuple):
    """What ``python -m xlanb.launch`` (or another launcher) tells each process."""
    coordinator: str | None    # XLANB_COORDINATOR_ADDRESS, host:port
    num_processes: int | None  # XLANB_NUM_PROCESSES
    process_id: int | None     # XLANB_PROCESS_ID


def launch_settings() -> LaunchSettings:
    """The launcher's variables, read now (a program may set them before it calls
    ``xlanb.distributed.initialize``); checked at import by ``_check_environment``."""
    env = os.environ
    n, pid = env.get("XLANB_NUM_PROCESSES"), env.get("XLANB_PROCESS_ID")
    return LaunchSettings(env.get("XLANB_COORDINATOR_ADDRESS") or None,
                          int(n) if n else None, int(pid) if pid else None)


def _check_environment() -> None:
    """The variables read elsewhere, when they are read (xlanb.distributed, the launcher),
    checked here at import so a bad one is named before anything runs."""
    n = env_count("XLANB_NUM_PROCESSES", 1, 1)
    pid = env_count("XLANB_PROCESS_ID", 0, 0)
    if pid >= n and os.environ.get("XLANB_NUM_PROCESSES"):  # JAX's own error names neither
        _refuse("XLANB_PROCESS_ID", os.environ["XLANB_PROCESS_ID"],
                f"a process number below XLANB_NUM_PROCESSES={n} (0 to {n - 1})")
    address = os.environ.get("XLANB_COORDINATOR_ADDRESS")
    if address:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            _refuse("XLANB_COORDINATOR_ADDRESS", address, "host:port (e.g. 127.0.0.1:1234)")


class _Checked:
    """A ``Config`` field whose every value, set from the environment or at run time,
    passes ``check(name, value)``."""

    def __init__(self, check, *args):
        self.check, self.args = check, args

    def __set_name__(self, owner, attr):
        self.attr, self.slot = attr, "_" + attr

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj, self.slot)

    def __set__(self, obj, value):
        setattr(obj, self.slot, self.check(f"xlanb.config.{self.attr}", value, *self.args))


class _Renamed:
    """A setting's first name, kept working: reads and writes go to ``new``."""

    def __init__(self, new: str):
        self.new = new

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj, self.new)

    def __set__(self, obj, value):
        setattr(obj, self.new, value)


class Config:
    """``xlanb.config``: a plain object whose setters validate. Every ``XLANB_*`` variable
    is read and checked here, once, at import: a bad value is a ``SettingError`` that names
    the variable, its value and what it takes. Every field is ``_Checked``: set at run
    time, it takes what its variable takes (``scan_layers = "0"`` is off)."""

    start_mode = _Checked(check_choice, MODES)
    platform = _Checked(check_platform)
    store_dir = _Checked(optional(check_path))
    store_max_bytes = _Checked(check_size, 1)
    store_readonly = _Checked(check_flag)
    # the store's settings by their first names, still accepted
    cache_dir = _Renamed("store_dir")
    cache_max_bytes = _Renamed("store_max_bytes")
    cache_readonly = _Renamed("store_readonly")
    store_key_file = _Checked(check_path)
    inspect = _Checked(check_choice, INSPECT_CHOICES)
    warn_fallbacks = _Checked(check_flag)
    check_device_indices = _Checked(check_flag)
    debug = _Checked(check_flag)
    background_compile = _Checked(check_flag)
    quick_peeks = _Checked(check_flag)
    debug_nans = _Checked(check_flag)
    max_executables = _Checked(check_count, 0, "0: from the kernel's limit on memory mappings")
    max_graphs = _Checked(check_count, 1)
    peek_cache_bytes = _Checked(check_size, 0)
    memory_line_bytes = _Checked(check_size, 0)
    memory_limit = _Checked(optional(check_size), 1)
    memory_limit_target = _Checked(check_flag)
    mat_mul_precision = _Checked(optional(check_choice), MAT_MUL_PRECISIONS)
    scan_layers = _Checked(check_scan)
    frequent_compiles = _Checked(check_count, 1)
    dist_check = _Checked(check_flag)
    dist_timeout = _Checked(check_seconds)
    dist_recent = _Checked(check_count, 1)
    eager_runs = _Checked(check_count, 0, "0: off")
    tier_up = _Checked(check_count, 0, "0: never")
    idle_tier_up = _Checked(check_count, 0, "0: never")
    quick_compiles = _Checked(check_flag)
    segments = _Checked(check_flag)
    strict_recompiles = _Checked(check_flag)
    host_segment_bytes = _Checked(check_size, 0)
    compile_profile = _Checked(check_flag)

    def __init__(self) -> None:
        # the execution mode a new session starts in (base/session.py)
        self.start_mode: str = env_choice("XLANB_MODE", MODES, "lazy")
        self.platform = check_platform("XLANB_PLATFORM", os.environ.get("XLANB_PLATFORM"))
        # checked (and resolved) at import by xlanb.set_target
        self.target: str | None = os.environ.get("XLANB_TARGET") or None
        self.store_dir = _default_store_dir()
        # The executable store's cap; least recently used entries go first.
        self.store_max_bytes = env_size(_variable("XLANB_STORE_MAX_BYTES"), 2 << 30)
        # Load from the store but write nothing to it (torch_xla's
        # xr.initialize_cache(path, readonly=True), for processes beside one that writes).
        self.store_readonly: bool = False
        # Signs the store's entries; outside the store's directory, readable only by the user.
        self.store_key_file = os.environ.get("XLANB_STORE_KEY") or default_store_key()
        self.inspect = env_choice("XLANB_INSPECT", INSPECT_CHOICES, "peek")
        # Warn once per op that falls back to CPU torch.
        self.warn_fallbacks = True
        # XLA clamps an out-of-range index where torch raises IndexError. Index values the
        # host has are always checked (free); with this on, so are small index tensors
        # already on the device (read back: a transfer, never a sync of pending work).
        self.check_device_indices = env_flag("XLANB_CHECK_DEVICE_INDICES", True)
        # Print every recompile with its explanation (XLANB_DEBUG=1).
        self.debug = env_flag("XLANB_DEBUG", False)
        # Eager mode: compile new ops' executables on background threads (modes/policy.py,
        # executables/background.py).
        self.background_compile = env_flag("XLANB_BACKGROUND_COMPILE", True)
        # Eager mode: new ops wait, recorded, until a value is needed, and that run of ops
        # compiles as one graph (one compile instead of one per op); at most this many
        # ops per run; 0: each new op compiles its own executable (modes/policy.py).
        self.eager_runs = env_count("XLANB_EAGER_RUNS", 2048, 0, "0: off")
        # Those runs, and lazy graphs, compile quickly first (XLA:CPU's LLVM at -O0,
        # fusion emitters off: execute/compile.quick_options); a graph that comes back
        # compiles fully in the background (execute/graphs.tier_up).
        self.quick_compiles = env_flag("XLANB_QUICK_COMPILES", True)
        # A graph (lazy, or an eager run) with the ops of an earlier one at other shapes
        # is cut where its shapes changed, and its segments compile and are cached apart
        # (graph/segments.py): only the changed ones compile again.
        self.segments = env_flag("XLANB_SEGMENTS", True)
        # A recompile after warm-up (a graph's ops again at other shapes, or a line's
        # third new graph) is an error that explains it (execute/graphs.RecompileError).
        self.strict_recompiles = env_flag("XLANB_STRICT_RECOMPILES", False)
        # Such a changed segment, if its values are small (inputs and outputs together),
        # runs on CPU torch instead of compiling at every new shape (execute/host.py):
        # generate's input ids and attention mask, one longer per token.
        self.host_segment_bytes = env_size("XLANB_HOST_SEGMENT_BYTES", 64 << 10, 0)
        # An op signature seen this many times in eager runs gets its own optimized
        # executable, compiled in the background, so that it then runs alone; 0: never.
        self.tier_up = env_count("XLANB_TIER_UP", 3, 0, "0: never")
        # A quick eager run that has run this many times starts its optimized compile
        # when a notebook cell ends (xlanb.optimize_hot_graphs, called by the IPython
        # extension); 0: never.
        self.idle_tier_up = env_count("XLANB_IDLE_TIER_UP", 4, 0, "0: never")
        # Peeks (a look in pdb) first compile missing single-op executables quickly, with
        # LLVM's optimizations off, and the optimized ones after, in the background.
        self.quick_peeks = env_flag("XLANB_QUICK_PEEKS", True)
        # Graph compiles collect the compiler's own phase times (an in-memory profiler
        # session around XLA:CPU's compile, libtpu's logged stages): where the compile
        # time went, by phase and by line (runtime/compile_profile.py)
        self.compile_profile = env_flag("XLANB_COMPILE_PROFILE", True)
        # Warn when one source line compiles this many graphs in at most twice as many syncs.
        self.frequent_compiles = 3
        # Check every sync (and every eager op) for NaN/Inf and name the first op that
        # made one. Turned on and off with xlanb.debug_nans(), which also records where
        # backward ops come from; XLANB_DEBUG_NANS=1 turns it on at import.
        self.debug_nans = env_flag("XLANB_DEBUG_NANS", False)
        # Bytes of peeked values kept until the next sync (values/peeks.py).
        self.peek_cache_bytes = env_size("XLANB_PEEK_CACHE_BYTES", 256 << 20, 0)
        # Single-op executables kept loaded (executables/resident.py); 0: derived from the
        # kernel's limit on memory mappings, which XLA's executables use up.
        self.max_executables = env_count("XLANB_MAX_EXECUTABLES", 0, 0,
                                         "0: from the kernel's limit on memory mappings")
        # Graph executables kept loaded (executables/resident.py); a dropped one comes back
        # from the executable store, or compiles again, when its graph runs again.
        self.max_graphs = env_count("XLANB_MAX_GRAPHS", 256, 1)
        # Eager results of at least this many bytes remember their line (OpSignature.lines)
        self.memory_line_bytes = env_size("XLANB_MEMORY_LINE_BYTES", 256 << 10, 0)
        # Device bytes a graph (or an eager op) may take, checked before it runs
        # (values/memory.py; xlanb.memory_limit); None: no check.
        self.memory_limit = env_size("XLANB_MEMORY_LIMIT", None)
        # xlanb.memory_limit("target"): every graph must fit the target's HBM per
        # chip, as the TPU compiler says (executables/target.py), before it runs here
        self.memory_limit_target = False
        # The precision of float32 dots and convolutions, XLA's "default" | "high" |
        # "highest" (torch_xla.backends.set_mat_mul_precision); None: torch's own knobs
        # decide (torch.set_float32_matmul_precision, torch.backends.cudnn.allow_tf32)
        self.mat_mul_precision = None
        # Repeated layers of a graph lowered as one lax.scan each, so XLA compiles one
        # layer's body (graph/repeats.py, executables/stages.py); read when a graph is lowered.
        # True | False | "auto" (the default): loops where they pay, in TPU compiles
        # (a TPU target's, a TPU's own) of 8 or more repeated layers; on XLA:CPU the
        # loop compiled no faster than the unrolled graph (docs/benchmarks.md,
        # "Repeated layers compiled once").
        self.scan_layers = check_scan("XLANB_SCAN_LAYERS", os.environ.get("XLANB_SCAN_LAYERS"))
        # Several processes (xlanb.distributed): before each run over more than one of
        # them, every process checks that the others run the same thing (one exchange
        # through jax.distributed's key-value store per run).
        self.dist_check = env_flag("XLANB_DIST_CHECK", True)
        # How long a process waits there for the others. A peer may be compiling the
        # same graph for the first time (minutes for a large model): a process found
        # compiling when the time is up is waited for again.
        self.dist_timeout = env_seconds("XLANB_DIST_TIMEOUT", 600.0)
        # Multi-process runs each process remembers (its flight recorder).
        self.dist_recent = env_count("XLANB_DIST_RECENT", 64, 1)
        _check_environment()

    def __repr__(self) -> str:
        return (f"xlanb.config(platform={self.platform!r}, store_dir={self.store_dir!r}, "
                f"inspect={self.inspect!r})")


config = Config()
