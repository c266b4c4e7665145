"""The one home of xlanb's session state: every cache, registry and record of this process.

Modules keep references to the containers here (``_infos = session.infos``) so that the
per-op hot path reads a module global, as fast as before; for that reason ``clear`` empties
the containers in place and never replaces them. Scalars that change while running (the
mode, the recorder of an ``xlanb.compile`` trace, the decomposition depth) are attributes.

What is *not* here, on purpose: process resources that outlive a session (the compile
thread pool, JAX's device list, the executable store's once-per-process warnings) and
metrics, an observer with its own ``clear``.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

from .config import MODES, config, env_choice


class PeekCache:
    """Values peeks computed, by node id, kept until the next sync so that repeated peeks
    recompute nothing, up to ``config.peek_cache_bytes``: past that, the least recently
    used go first (a later peek recomputes them from what is left; a peek never cuts the
    graph either way). Each entry holds its node, so its id stays a valid key."""

    def __init__(self) -> None:
        self._entries: OrderedDict = OrderedDict()  # node id -> (node, array)
        self.nbytes = 0

    def __contains__(self, nid: int) -> bool:
        return nid in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, nid: int):
        return self._entries[nid][1]

    def get(self, nid: int):
        entry = self._entries.get(nid)
        if entry is None:
            return None
        self._entries.move_to_end(nid)
        return entry[1]

    def put(self, node, value) -> None:
        size = _nbytes(value)
        limit = config.peek_cache_bytes
        if size > limit or id(node) in self._entries:
            return
        self._entries[id(node)] = (node, value)
        self.nbytes += size
        while self.nbytes > limit:
            _, (_, old) = self._entries.popitem(last=False)
            self.nbytes -= _nbytes(old)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0


def _nbytes(value) -> int:
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0))


# mode name -> its ModePolicy (mode_policy.py installs them at import: set_policies)
_policies: dict = {}


class ModeState:
    """An execution mode as the dispatcher reads it on every op: ``policy`` is the mode's
    object (mode_policy.py), bound when the mode is set."""
    __slots__ = ("mode", "policy", "recording", "deferred")

    def __init__(self, mode: str):
        self.set(mode)
        # eager: some ops were recorded while their executables compile (mode_policy.py)
        self.deferred = False

    def set(self, mode: str) -> None:
        self.mode = mode
        self.policy = policy = _policies.get(mode)  # None only before they are installed
        self.recording = policy.recording if policy is not None else True


def set_policies(policies: dict) -> None:
    """The hook mode_policy.py installs the modes through (it lives layers above)."""
    _policies.update(policies)
    session.default.set(session.default.mode)


class Session:
    """Everything a reset forgets. One instance per process: ``session``."""

    def __init__(self, mode: str):
        # -- the execution mode. ``default`` is the process's (``set_mode``); a thread
        # inside ``with xlanb.mode(...)`` runs that block's own state (``mode_state``),
        # as torch's grad mode is per thread. ``scoped`` counts such blocks in all
        # threads: while it is 0, the per-op path reads ``default`` without a
        # thread-local lookup.
        self.default = ModeState(mode)
        self.scoped = 0
        # >0 while a decomposition traces on JAX values: ops run at once (record.py)
        self.direct = 0
        # the recorder of the xlanb.compile call being traced, if any (capture/)
        self.recorder = None
        # True once any tensor was sharded over a mesh (xlanb.spmd): from then on eager
        # ops look at their inputs' shardings (single-device runs never pay for it)
        self.spmd = False
        # the TPU topology every new graph also compiles for (xlanb.target), or None
        self.target = None
        # several processes (xlanb.distributed): called before every run over more than
        # one process, to check that all of them run the same; None in one process
        self.agree = None

        # -- what ops are and how each signature evaluates (dispatch, ops/)
        self.plans: dict = {}          # id(OpOverload) -> OpPlan
        self.infos: dict = {}          # op signature -> OpInfo
        self.sig_keys: dict = {}       # (shape, stride, dtype, device, offset) -> SigKey
        self.aval_ids: dict = {}       # (shape, dtype) -> negative uid of a leaf type
        self.digests: dict = {}        # OpInfo uid -> its process-independent digest
        self.getitem_infos: dict = {}  # (OpInfo uid, output index) -> OpInfo
        self.data_infos: dict = {}     # leaf infos of device data, by (shape, dtype, device)
        self.placed_infos: dict = {}   # leaf infos of data mark_sharding laid out
        self.empty_infos: dict = {}    # leaf infos of uninitialized memory
        self.scatter_infos: dict = {}  # writes through a view chain
        self.scalar_arrays: dict = {}  # device -> {float or its bits: the float as a device array}

        # -- pending work and peeks (live.py, realize.py)
        self.live: list = []           # weakrefs of storages, in write order
        self.waiting_views: list = []  # eager: weakrefs of views waiting on a compile
        self.peek_values = PeekCache()  # node id -> array computed by a peek
        # small integer tensors moved from the host (index lists): their host values, so
        # indexing can check bounds with no transfer back (dispatch.py)
        self.host_values = weakref.WeakKeyDictionary()  # Node -> CPU tensor

        # -- compiles (execute/)
        self.in_flight: list = []      # Futures of background single-op compiles
        self.lower_soon: list = []     # OpInfos a look left to lower at the next graph compile
        # OpInfo uid -> OpInfo holding a single-op executable, least recently used first
        # (execute/resident.py keeps it bounded)
        self.resident: OrderedDict = OrderedDict()
        self.graph_cache: dict = {}    # (device, structural key) -> CompiledGraph
        # id -> CompiledGraph whose executable is loaded, least recently used first
        self.resident_graphs: OrderedDict = OrderedDict()
        self.graph_log: list = []      # every CompiledGraph, in compile order
        self.syncs_at: dict = {}       # source location -> lazy syncs from there
        self.compiles_at: dict = {}    # source location -> new graphs from there
        self.recompile_warned: set = set()  # source locations warned about (once each)

        # -- device memory (execute/memory.py)
        self.op_memory: dict = {}      # OpInfo uid -> its single-op executable's analysis
        self.memory_timeline: list = []  # MemorySample per sync
        self.memory_peaks: dict = {}   # xla index -> the most device bytes sampled
        self.memory_step_peaks: dict = {}  # the same, since the last sync's sample

        # -- where ops come from (base/frames.py, base/scopes.py)
        self.scope_stack: list = []    # nn.Module paths being run
        self.module_names = weakref.WeakKeyDictionary()  # nn.Module -> its path
        self.skip_file: dict = {}      # file name -> never the user's line?
        self.locations: dict = {}      # (file, line) -> SourceLoc, interned

        # -- warnings given once
        self.fallback_warned: set = set()

    def clear(self, mode: str) -> None:
        """Forget every cache and record, keeping each container object (see above)."""
        for value in vars(self).values():
            if isinstance(value, (dict, list, set, weakref.WeakKeyDictionary, PeekCache)):
                value.clear()
        self.default.set(mode)
        self.default.deferred = False
        self.direct = 0
        self.recorder = None
        # spmd stays: tensors sharded before a reset still are


def starting_mode() -> str:
    return env_choice("XLANB_MODE", MODES, "lazy")  # a bad value is named (base/config.py)


session = Session(starting_mode())
_thread = threading.local()


def mode_state() -> ModeState:
    """This thread's mode: its innermost ``xlanb.mode()`` block's, else the default."""
    if session.scoped:
        state = getattr(_thread, "state", None)
        if state is not None:
            return state
    return session.default


def enter_block(state: ModeState):
    """Make ``state`` this thread's mode until ``leave_block``; returns what to restore."""
    outer = getattr(_thread, "state", None)
    _thread.state = state
    session.scoped += 1
    return outer


def leave_block(outer) -> None:
    _thread.state = outer
    session.scoped -= 1
