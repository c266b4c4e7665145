"""Where a compile's time went: by compiler phase, and by the user's line and module scope
(issue 48). Built from what ``runtime/compile_profile.py`` measured while the compile ran
and from the optimized module's text.

Phases are the compiler's own measurements: XLA:CPU's spans (the HLO pass pipelines,
``CpuCompiler::RunBackend`` and inside it the fusion emitters and LLVM's ``Codegen``,
``backend_compile_and_load`` around it all), libtpu's logged stage durations. A part
that is the difference of two measured spans says so; what no span covers is reported
as unattributed, never spread over the named parts.

By line: the backend's fusion emitters and LLVM codegen go to each fusion in proportion
to its own ``FusionCompiler::Compile`` time (XLA:CPU measures every fusion), then evenly
to the ops it holds; everything else (lowering, HLO passes, the rest of the backend,
loading) goes evenly to every instruction of the optimized module, which is all that is
known of it. Each instruction's metadata names its aten op, scope and the user's line
(``executables/stages.py``). libtpu times no fusion: a TPU compile's time goes evenly to its
instructions, and the profile says so.
"""
from __future__ import annotations

import html
import linecache
import re
import time
from collections import defaultdict
from typing import NamedTuple

from ..base.frames import source_text
from ..base.formats import (format_bytes, format_duration, format_location, format_table,
                            format_table_html)
from ..runtime.compile_profile import in_compile, log_time
from .hlo_text import (
    _INSTR,
    array_sizes,
    aten_of,
    attr,
    computations,
    origin,
    param_of,
    scope_of,
    stack_tables,
)


class CompilePart(NamedTuple):
    """One phase of a compile: ``phase`` is lowering / hlo passes / backend / loading /
    other; ``how`` says what measured it."""
    phase: str
    name: str
    seconds: float
    how: str


class CompileRow(NamedTuple):
    """One line or scope: the compile seconds its ops got, their share, how many ops."""
    key: str
    seconds: float
    share: float
    ops: int


class Advice(NamedTuple):
    """What a finding of the profile suggests (``CompileProfile.advice``): ``kind`` is
    ``unrolled stack``, ``loop at one line`` or ``large constant``; ``where`` the scope,
    line or constant; ``share`` the compile share of what it names (0 for a constant,
    which is no instruction)."""
    kind: str
    where: str
    share: float
    text: str


_TRIVIAL = frozenset(("parameter", "constant", "get-tuple-element", "tuple", "bitcast",
                      "after-all", "partition-id", "replica-id"))
_CONTAINERS = frozenset(("fusion", "call", "while", "conditional", "async-start",
                         "async-done", "async-update"))
NO_LINE = "(no line: XLA's own instructions)"
# instructions JAX made for xlanb's own code, outside any aten op: a layer stack lowered
# as a loop stacks each layer's weights and slices its results (graph/repeats.py)
LOOPS = "(no line: the layer loops' stacking and slicing)"
OWN = "(no line: xlanb's own ops, outside any aten op)"
_LOOP_PARTS = ("while/", "/stack", "/unstack/", "dynamic_index_in_dim",
               "dynamic_update_index_in_dim")


class CompileProfile:
    """``graphs()[i].compile_profile`` / ``TargetReport.compile_profile``: the compile's
    seconds by phase (``parts``, ``unattributed_s``), by line (``by_line()``) and by
    scope (``by_scope()``, a repeated layer stack as one row, ``24 × encoder.layer``)."""

    def __init__(self, what: str, platform: str, total_s: float, parts, unattributed_s: float,
                 lines, scopes, method: str, notes=(), advice=()):
        self.what = what
        self.platform = platform
        self.total_s = total_s
        self.parts: tuple[CompilePart, ...] = tuple(parts)
        self.unattributed_s = unattributed_s
        self._lines: list[CompileRow] = lines
        self._scopes: list[CompileRow] = scopes
        self.method = method
        self.notes: tuple[str, ...] = tuple(notes)
        self.advice: tuple[Advice, ...] = tuple(advice)

    def phases(self) -> dict[str, float]:
        """Seconds per phase (lowering, hlo passes, backend, loading, other,
        unattributed)."""
        out: dict = defaultdict(float)
        for p in self.parts:
            out[p.phase] += p.seconds
        out["unattributed"] += self.unattributed_s
        return dict(out)

    @property
    def attributed_s(self) -> float:
        return sum(p.seconds for p in self.parts)

    def by_line(self, n: int | None = 10) -> list[CompileRow]:
        return self._lines[:n]

    def by_scope(self, n: int | None = 10) -> list[CompileRow]:
        return self._scopes[:n]

    @property
    def top_line(self) -> CompileRow | None:
        """The line whose ops took the most compile time (not XLA's own instructions)."""
        return next((r for r in self._lines if not r.key.startswith("(")), None)

    def short(self) -> str:
        """``model.py:42 61%``: the slowest line to compile, for a table's cell."""
        r = self.top_line
        return f"{r.key} {100 * r.share:.0f}%" if r is not None else ""

    def _part_rows(self) -> list[tuple]:
        t = self.total_s or 1.0
        rows = [(p.phase, p.name, format_duration(p.seconds), f"{100 * p.seconds / t:.1f}%", p.how)
                for p in self.parts]
        rows.append(("unattributed", "no span covers it", format_duration(self.unattributed_s),
                     f"{100 * self.unattributed_s / t:.1f}%", "total − the parts above"))
        return rows

    @staticmethod
    def _rows(rows: list[CompileRow]) -> list[tuple]:
        return [(r.key, format_duration(r.seconds), f"{100 * r.share:.1f}%", str(r.ops))
                for r in rows]

    def __str__(self) -> str:
        out = [f"compile of {self.what} on {self.platform}: {format_duration(self.total_s)}"]
        out.append(format_table(("phase", "part", "seconds", "share", "measured by"),
                                self._part_rows(), right=(2, 3), indent="  "))
        if self._lines:
            out.append(f"  by line ({self.method}):")
            out.append(format_table(("line", "seconds", "share", "ops"),
                                    self._rows(self.by_line()), right=(1, 2, 3), indent="    "))
            out.append("  by scope:")
            out.append(format_table(("scope", "seconds", "share", "ops"),
                                    self._rows(self.by_scope()), right=(1, 2, 3), indent="    "))
        out += [f"  advice: {a.text}" for a in self.advice]
        out += [f"  note: {n}" for n in self.notes]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = html.escape
        t = self.total_s or 1.0
        colours = {"lowering": "#69c", "hlo passes": "#9c6", "backend": "#e94",
                   "loading": "#c9c", "other": "#bbb"}
        bars = "".join(
            f"<div title='{e(p.name)} {e(format_duration(p.seconds))}' style='display:inline-block;"
            f"height:14px;width:{100 * max(p.seconds, 0) / t:.2f}%;"
            f"background:{colours.get(p.phase, '#bbb')}'></div>" for p in self.parts)

        def table(head, rows):
            return format_table_html(head, rows, cls="xlanb-compile-time")

        parts = [(f"<div><b>compile of {e(self.what)}</b> on {e(self.platform)}: "
                  f"{e(format_duration(self.total_s))}</div>"),
                 f"<div style='width:480px;border:1px solid #888'>{bars}</div>",
                 table(("phase", "part", "seconds", "share", "measured by"), self._part_rows())]
        if self._lines:
            parts.append(f"<div>by line ({e(self.method)})</div>")
            parts.append(table(("line", "seconds", "share", "ops"), self._rows(self.by_line())))
            parts.append(table(("scope", "seconds", "share", "ops"), self._rows(self.by_scope())))
        if self.advice:
            parts.append("<ul class='xlanb-compile-advice'>" + "".join(
                f"<li><b>{e(a.kind)}</b>: {e(a.text)}</li>" for a in self.advice) + "</ul>")
        parts += [f"<div><i>note: {e(n)}</i></div>" for n in self.notes]
        return "<div class='xlanb-compile-profile'>" + "\n".join(parts) + "</div>"


# ---------------------------------------------------------------------------------------
# Phases

def _within(s, outer) -> bool:
    return s.start >= outer.start and s.end <= outer.end


def cpu_parts(raw) -> tuple[list[CompilePart], float, dict, str]:
    """XLA:CPU's phases from its spans: ``(parts, unattributed seconds, fusion name ->
    its FusionCompiler seconds, note)``. ``parts`` is empty where the spans do not hold
    this compile."""
    spans = raw.spans
    backends = [s for s in spans if s.name == "CpuCompiler::RunBackend"]
    ours = [s for s in backends if raw.module and s.args.get("name") == raw.module]
    if not ours and len(backends) == 1:
        ours = backends
    if not ours:
        return [], 0.0, {}, "the trace holds no backend span of this module"
    rb = ours[0]
    compile_ = next((s for s in spans if s.line == rb.line and s.name == "PjRtCpuClient::Compile"
                     and _within(rb, s)), None)
    if compile_ is None:
        return [], 0.0, {}, "the trace holds no PjRtCpuClient::Compile span"
    suffix = f"({raw.module})" if raw.module else ")"
    pipes = sorted((s for s in spans if s.line == rb.line and s.name.endswith(suffix)
                    and " (" in s.name and _within(s, compile_) and not _within(s, rb)),
                   key=lambda s: (s.start, -s.dur))
    hlo_ns, last_end = 0, -1
    for s in pipes:  # the outermost pipelines only
        if s.start >= last_end:
            hlo_ns += s.dur
            last_end = s.end
    inside = [s for s in spans if s.line == rb.line and _within(s, rb)]
    emit_ns = sum(s.dur for s in inside if s.name in ("ThunkEmitter::EmitEntryComputation",
                                                      "ThunkEmitter::ConsumeKernels"))
    llvm_ns = sum(s.dur for s in inside if s.name == "Codegen")
    bcl = next((s for s in spans if s.name == "backend_compile_and_load"
                and _within(compile_, s)), None)
    ns = 1e-9
    parts = [CompilePart("hlo passes", "XLA's HLO pass pipelines", hlo_ns * ns,
                         "XLA's pipeline spans (… (module))"),
             CompilePart("backend", "fusion emitters and thunks (MLIR)", emit_ns * ns,
                         "ThunkEmitter spans"),
             CompilePart("backend", "LLVM codegen", llvm_ns * ns, "Codegen span"),
             CompilePart("backend", "rest of the backend (scheduling, buffers)",
                         (rb.dur - emit_ns - llvm_ns) * ns, "RunBackend − the two above")]
    if bcl is not None:
        parts.append(CompilePart("loading", "loading the executable (PJRT)",
                                 (bcl.dur - compile_.dur) * ns,
                                 "backend_compile_and_load − PjRtCpuClient::Compile"))
        parts.append(CompilePart("other", "JAX (compile options, Python)",
                                 raw.compile_s - bcl.dur * ns,
                                 "lowered.compile() − backend_compile_and_load"))
    else:
        parts.append(CompilePart("other", "JAX and loading", raw.compile_s - compile_.dur * ns,
                                 "lowered.compile() − PjRtCpuClient::Compile"))
    unattributed = (compile_.dur - hlo_ns - rb.dur) * ns
    fusions: dict = defaultdict(float)
    for s in spans:
        if s.name == "FusionCompiler::Compile" and s.start >= rb.start and s.end <= rb.end:
            name = str(s.args.get("module", ""))
            name = name.removeprefix("__compute_module_").removesuffix("_kernel_module")
            fusions[name] += s.dur * ns
    return parts, unattributed, dict(fusions), ""


_STAGE = re.compile(r"\b(HLO_PASSES|BACKEND_PASSES|CODE_GENERATION|END_TO_END) stage duration: "
                    r"([\d.hmsuµn]+)")
_MODULE = re.compile(r"module:? (jit_[\w.\-]+)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(text: str) -> float:
    """absl's duration text (``1m2.5s``, ``13.1ms``, ``350us``) in seconds."""
    return sum(float(n) * _UNITS[u] for n, u in re.findall(r"([\d.]+)(ms|us|µs|ns|h|m|s)", text))


def tpu_stages(log: str, module: str, raw=None) -> tuple[dict, float | None]:
    """libtpu's stages in what it logged around a compile (target compiles run one at a
    time): stage -> ``(seconds, time it ended)`` (None where the line has no time),
    each stage's first line, and when its HLO passes began. Given ``raw`` (the
    compile's ``RawCompile``), a line stamped outside the compile's start and end is
    another compile's (``in_compile``: libtpu's file lags, so the text may begin with
    the previous compile's stages, or run into the next's) and is skipped. libtpu does
    not always name the module at the start (its "running hlo passes" line is missing
    from some compiles), so the stages are the first in the window; ``module`` is
    checked where a line names one: a line naming another module before the first stage
    means the log is not this compile's, and nothing is returned."""
    near = raw.started if raw is not None else time.time()
    out: dict = {}
    for line in log.splitlines():
        at = log_time(line, near)
        if raw is not None and not in_compile(at, raw):
            continue
        m = _STAGE.search(line)
        if m is not None:
            if m.group(1) not in out:
                out[m.group(1)] = (parse_duration(m.group(2)), at)
            if len(out) == 4:
                break
            continue
        named = _MODULE.search(line)
        if named is not None and module and named.group(1) != module and not out:
            return {}, None
    hlo = out.get("HLO_PASSES")
    began = hlo[1] - hlo[0] if hlo is not None and hlo[1] is not None else None
    return out, began


def tpu_parts(raw, log: str) -> tuple[list[CompilePart], float, str]:
    """libtpu's stages, and the gaps between them from its log lines' times."""
    stages, began = tpu_stages(log, raw.module, raw)
    if not stages:
        return [], 0.0, "libtpu logged no stage durations for this module"
    how = "libtpu's logged stage duration"
    gap = "libtpu's log line times"
    parts = []
    if began is not None:
        parts.append(CompilePart("other", "JAX and PJRT before libtpu's passes",
                                 began - raw.started, gap))
    prev_end = None
    for key, phase, name in (("HLO_PASSES", "hlo passes", "TPU HLO passes"),
                             ("BACKEND_PASSES", "backend", "TPU backend passes"),
                             ("CODE_GENERATION", "backend", "TPU code generation")):
        if key not in stages:
            continue
        secs, end = stages[key]
        if prev_end is not None and end is not None and end - secs > prev_end:
            parts.append(CompilePart("other", f"libtpu before its {name[4:]} (untimed by it)",
                                     end - secs - prev_end, gap))
        parts.append(CompilePart(phase, name, secs, how))
        prev_end = end
    note = ""
    e2e = stages.get("END_TO_END")
    if e2e is not None and e2e[1] is not None and prev_end is not None:
        parts.append(CompilePart("other", "libtpu after its code generation", e2e[1] - prev_end, gap))
        parts.append(CompilePart("other", "JAX and PJRT after libtpu", raw.ended - e2e[1], gap))
    else:
        note = ("libtpu's last stage lines (CODE_GENERATION, END_TO_END) were not in its log "
                "yet: the time after its backend passes is unattributed")
    return parts, raw.compile_s - sum(p.seconds for p in parts), note


# ---------------------------------------------------------------------------------------
# By line and scope

class _Op(NamedTuple):
    source: str
    scope: str
    param: str = ""  # an optimizer's op: the module whose parameter it updates


def module_ops(text: str, recorded: dict | None = None) -> tuple[list[_Op], dict[str, list[int]]]:
    """The optimized module's instructions that compute something (``_Op``: the user's
    line and scope from their metadata), and each fusion's (by instruction name: the
    indices of the ops of the computation it calls). An instruction whose metadata
    keeps no line (JAX kept the lowering's own frames) takes the line ``recorded`` holds
    for its aten op and scope (``(op, "a/b")`` -> ``"file:line"``), where it has one."""
    tables = stack_tables(text)
    ops: list[_Op] = []
    in_comp: dict[str, list[int]] = defaultdict(list)
    calls: dict[str, str] = {}
    for comp, (_, body) in computations(text).items():
        for line in body.splitlines():
            m = _INSTR.match(line)
            if m is None:
                continue
            opcode = m.group("opcode")
            if opcode == "fusion":
                called = attr(line, "calls").lstrip("%")
                if called:
                    calls[m.group("name")] = called
            if opcode in _TRIVIAL or opcode in _CONTAINERS:
                continue
            op_type, op_name, source = origin(line, tables)
            op = op_type or aten_of(op_name)
            scope = _user_scope(scope_of(op_name, op))
            if not source and recorded:
                source = recorded.get((op, scope), "")
            if not source and op_name and not op:  # JAX's ops for xlanb's own code
                source = LOOPS if any(k in op_name for k in _LOOP_PARTS) else OWN
            in_comp[comp].append(len(ops))
            ops.append(_Op(source, scope, _user_scope(param_of(op_name))))
    return ops, {f: in_comp.get(c, []) for f, c in calls.items()}


# name-stack segments JAX adds around a traced body: a repeated layer stack lowered as
# one lax.scan (graph/repeats.py) puts its ops under ``while/body/closed_call/...``
# (and xlanb's own ``unstack``, around a loop's per-layer results: no module's)
_JAX_SEGMENTS = frozenset(("while", "body", "cond", "closed_call", "scan", "remat",
                           "checkpoint", "pjit", "while.body", "while.cond", "unstack"))


def _user_scope(scope: str) -> str:
    """The module scope without JAX's segments (``while/body/closed_call/bert/...`` ->
    ``bert/...``)."""
    parts = [p for p in scope.split("/") if p and p not in _JAX_SEGMENTS
             and not p.startswith("jit(")]
    return "/".join(parts)


def _scope_key(scope: str) -> tuple[str, str]:
    """``BertModel/encoder/layer/3/attention`` -> (``BertModel.encoder.layer``, ``3``):
    a numbered layer collapses into its stack; else the scope itself."""
    parts = scope.split("/") if scope else []
    for i, p in enumerate(parts):
        if p.isdigit() and i:
            return ".".join(parts[:i]), p
    return ".".join(parts) or "(no scope)", ""


BACKWARD = " (backward)"
OPTIMIZER = "optimizer.step"
NO_SCOPE = "(no scope)"
_STEP_CALL = re.compile(r"\.step\(")


def _forward_scopes(ops, recorded: dict | None) -> dict[str, tuple[str, set]]:
    """Each line at which ops with a module scope were recorded -> (the scope key most
    of them have, its layers seen there): autograd records a backward op at the line of
    the forward op it differentiates, with no scope (``graph/repeats.py`` reasons the
    same). Where one line calls several modules (``x = torch.tanh(layer(x))``), which of
    them a backward op differentiates is not known: the line's main scope is a guess."""
    at: dict = defaultdict(list)
    for op in ops:
        if op.scope and op.source and op.source[0] != "(":
            at[op.source].append(op.scope)
    for (_aten, scope), src in (recorded or {}).items():
        if scope:
            at[src].append(scope)
    out: dict = {}
    for src, scopes in at.items():
        keys = [_scope_key(sc) for sc in scopes]
        counts: dict = defaultdict(int)
        for k, _layer in keys:
            counts[k] += 1
        name = max(counts, key=lambda k: (counts[k], k))
        out[src] = (name, {layer for k, layer in keys if k == name and layer})
    return out


def _is_step_line(source: str) -> bool:
    """The user's line calls an optimizer's ``step()`` (its ops carry the user's line:
    torch's own frames are skipped), read from the source as linecache has it."""
    file, _, line = source.rpartition(":")
    return bool(line.isdigit() and _STEP_CALL.search(linecache.getline(file, int(line))))


def _op_scope(op: _Op, forward: dict, steps: dict) -> tuple[str, str]:
    """(scope key, layer) of one instruction: its own scope; else, by its line, the
    forward scope it differentiates (``name (backward)``) or the optimizer's step,
    split by the module whose parameter it updates (``optimizer.step (name)``, a
    layer stack's as one key, with the layer)."""
    if op.scope:
        return _scope_key(op.scope)
    src = op.source
    if src in forward:
        name, layers = forward[src]
        return name + BACKWARD, (min(layers) if len(layers) == 1 else "")
    if src and src[0] != "(":
        if src not in steps:
            steps[src] = _is_step_line(src)
        if steps[src]:
            if op.param:
                name, layer = _scope_key(op.param)
                return f"{OPTIMIZER} ({name})", layer
            return OPTIMIZER, ""
    return NO_SCOPE, ""


def _module_of(key: str) -> str:
    """The module a scope key counts for: ``x (backward)`` and ``optimizer.step (x)``
    are ``x``'s (its stack's loops and advice cover them)."""
    if key.startswith(OPTIMIZER + " (") and key.endswith(")"):
        return key[len(OPTIMIZER) + 2:-1]
    return key.removesuffix(BACKWARD)


class _Stats(NamedTuple):
    """What the advice reads: per stack key (backward rows folded in) its share, layers,
    whether it compiled as a loop and its instructions; per line its instruction count."""
    stacks: dict
    line_ops: dict
    step_lines: frozenset
    stack_lines: frozenset  # lines whose forward ops are a numbered stack's layers


def attribute(text: str, total_s: float, fusion_pool_s: float, fusion_weights: dict,
              recorded: dict | None = None, loops: dict | None = None, stats: list | None = None
              ) -> tuple[list[CompileRow], list[CompileRow], str]:
    """Spread ``total_s`` over the module's ops: ``fusion_pool_s`` by ``fusion_weights``
    (fusion name -> measured seconds, split evenly among its ops), the rest evenly.
    An op with no scope is put by its line under the forward scope it differentiates,
    or the optimizer's step (``_op_scope``). ``stats``: a list the ``_Stats`` go into."""
    ops, fusions = module_ops(text, recorded)
    if not ops:
        return [], [], "no instructions"
    share = [0.0] * len(ops)
    weights = {f: w for f, w in fusion_weights.items() if fusions.get(f)}
    wsum = sum(weights.values())
    pooled = fusion_pool_s if wsum > 0 else 0.0
    for f, w in weights.items():
        members = fusions[f]
        for i in members:
            share[i] += pooled * w / wsum / len(members)
    even = (total_s - pooled) / len(ops)
    for i in range(len(ops)):
        share[i] += even
    method = (f"fusion emitters and LLVM ({format_duration(pooled)}) by each fusion's measured "
              f"emitter time, the rest evenly over {len(ops)} instructions"
              if pooled else f"evenly over {len(ops)} instructions")
    by_line: dict = defaultdict(lambda: [0.0, 0])
    by_scope: dict = defaultdict(lambda: [0.0, 0, set()])
    forward = _forward_scopes(ops, recorded)
    steps: dict = {}
    for op, s in zip(ops, share):
        row = by_line[source_text(op.source) if op.source and op.source[0] != "(" else
                      op.source or NO_LINE]
        row[0] += s
        row[1] += 1
        key, layer = _op_scope(op, forward, steps)
        srow = by_scope[key]
        srow[0] += s
        srow[1] += 1
        if layer:
            srow[2].add(layer)
    t = total_s or 1.0
    lines = sorted((CompileRow(k, v[0], v[0] / t, v[1]) for k, v in by_line.items()),
                   key=lambda r: -r.seconds)

    def looped(key: str) -> int:
        base = _module_of(key)
        return next((n for name, n in (loops or {}).items()
                     if base == name or base.endswith("." + name)), 0)

    def layers_of(key: str) -> int:
        # a stack's backward and updates count the stack's layers (its backward ops
        # carry no layer of their own)
        n = looped(key)
        if n:
            return n
        seen = by_scope.get(_module_of(key))
        return max(len(seen[2]) if seen is not None else 0, len(by_scope[key][2]))

    def label(key: str, layers: set) -> str:
        # a stack lowered as one loop compiles one layer's body (its ops carry layer 0's
        # scope): named by the loop's layer count
        backward = key.endswith(BACKWARD)
        n = layers_of(key)
        if looped(key):
            base = key.removesuffix(BACKWARD)
            return f"{n} × {base} ({'backward, ' if backward else ''}one loop)"
        return f"{n} × {key}" if n > 1 else key

    scopes = sorted((CompileRow(label(k, v[2]), v[0], v[0] / t, v[1])
                     for k, v in by_scope.items()), key=lambda r: -r.seconds)
    if stats is not None:
        stacks: dict = defaultdict(lambda: [0.0, 0, False, 0])
        for k, v in by_scope.items():
            n = layers_of(k)
            if n > 1:
                st = stacks[_module_of(k)]
                st[0] += v[0] / t
                st[1] = max(st[1], n)
                st[2] = st[2] or bool(looped(k))
                st[3] += v[1]
        stats.append(_Stats(dict(stacks), {k: v[1] for k, v in by_line.items()},
                            frozenset(source_text(s) for s, yes in steps.items() if yes),
                            frozenset(source_text(s) for s, (_k, layers) in forward.items()
                                      if len(layers) > 1)))
    return lines, scopes, method


# ---------------------------------------------------------------------------------------
# Advice: only what was checked on an example that shows it (tests/test_compile_profile.py,
# docs/compile-time.md). A torch.cat in a loop was checked too and left out: on XLA:CPU
# 150 concatenations compiled no slower than one cat of the same pieces.

# An unrolled stack worth a loop: a fifth of the compile or more, and big enough that the
# loop's own instructions (stacking and slicing each layer's weights and results, a few
# seconds to compile on XLA:CPU) are the smaller cost. Measured on XLA:CPU with a training
# step of residual MLP blocks (docs/compile-time.md): 6 blocks (2,600 instructions)
# compiled 2.4x slower as a loop, 12 (8,600) 1.8x faster, 24 (31,000) 4.3x faster.
STACK_SHARE = 0.2
STACK_OPS = 5000
LOOP_SHARE = 0.25       # a line worth a loop op: a quarter of the compile or more
LOOP_OPS = 60           # ... with this many recorded ops
LOOP_REPEATS = 10       # ... each distinct op this many times on average
CONSTANT_BYTES = 1 << 20  # a constant worth passing as an argument


def _constants(text: str, tables: dict) -> list[tuple[int, str, str]]:
    """(bytes, type, user's line) of each constant of the optimized module of at least
    ``CONSTANT_BYTES``."""
    out = []
    for line in text.splitlines():
        m = _INSTR.match(line)
        if m is None or m.group("opcode") != "constant":
            continue
        size = sum(b for b, _ in array_sizes(m.group("shape")))
        if size >= CONSTANT_BYTES:
            _t, _n, source = origin(line, tables)
            out.append((size, array_sizes(m.group("shape"))[0][1],
                        source_text(source) if source else ""))
    return sorted(out, reverse=True)


def advise(profile: CompileProfile, stats: _Stats | None, text: str,
           summary=None) -> list[Advice]:
    """What the profile's findings suggest: an unrolled layer stack (a loop compiles one
    layer), a Python loop unrolled at one line (``xlanb.scan``), a large constant
    folded into the graph (pass it as an argument)."""
    out: list[Advice] = []
    if stats is not None:
        for key, (share, n, as_loop, ops) in sorted(stats.stacks.items(),
                                                    key=lambda kv: -kv[1][0]):
            if not as_loop and n > 1 and share >= STACK_SHARE and ops >= STACK_OPS:
                out.append(Advice("unrolled stack", key, share, (
                    f"{n} × {key} compiled unrolled ({100 * share:.0f}% of the compile, "
                    f"{ops} instructions with its backward): XLANB_SCAN_LAYERS=1 (or "
                    f"xlanb.scan_layers(layers, x)) compiles one layer as a loop; on the "
                    f"CPU a looped step may run slower, so weigh the compile saved against "
                    f"the steps to run")))
        names: dict = defaultdict(list)
        for o in getattr(summary, "ops", ()) or ():
            if o.src is not None:
                names[source_text(format_location(o.src.file, o.src.line))].append(o.name)
        rows = {r.key: r for r in profile.by_line(None)}
        for key, ops in names.items():
            row = rows.get(key)
            # an optimizer's step loops over the parameters; a layer stack's loop line
            # has the stack's advice
            if (row is None or row.share < LOOP_SHARE or key in stats.step_lines
                    or key in stats.stack_lines or len(ops) < LOOP_OPS or len(ops) < LOOP_REPEATS * len(set(ops))):
                continue
            out.append(Advice("loop at one line", key, row.share, (
                f"{key}: {len(ops)} ops recorded at one line, of {len(set(ops))} kinds "
                f"({100 * row.share:.0f}% of the compile): a Python loop unrolled into the "
                f"graph; xlanb.scan(fn, init, xs) compiles one iteration as a loop")))
    for size, typ, where in _constants(text, stack_tables(text)):
        at = f"{where}: " if where else ""
        out.append(Advice("large constant", where or typ, 0.0, (
            f"{at}a {typ} constant ({format_bytes(size)}) is folded into the graph, and "
            f"XLA compiles its data into the executable: make it once (on the CPU, or in "
            f"a step of its own) and pass it in as a tensor argument")))
    return out


def loop_layers(repeats) -> dict:
    """``{"bert.encoder.layer": 24}``: the stacks a ``graph.repeats`` plan lowers as loops."""
    out: dict = {}
    for run in getattr(repeats, "runs", ()) or ():
        out[run.name] = max(out.get(run.name, 0), len(run.layers))
    return out


def recorded_lines(summary) -> dict:
    """``(aten op, "scope/path") -> "file:line"``: the line each op of a graph's summary
    was recorded at (the first, where several were)."""
    out: dict = {}
    for o in getattr(summary, "ops", ()):
        if o.src is not None:
            out.setdefault((o.name, o.scope.replace(".", "/")), o.src.where)
    return out


def build(raw, text: str, what: str, total_s: float | None = None, tpu_log: str = "",
          recorded: dict | None = None, loops: dict | None = None,
          platform: str = "?", summary=None) -> CompileProfile:
    """The profile of one compile: ``raw`` (a ``RawCompile``, None if the executable
    was loaded from the store) and the optimized module's ``text``. ``total_s``: the
    time the caller measured around it all (its extra part is xlanb's own
    bookkeeping). ``recorded``: see ``module_ops``; ``loops``: the layer stacks lowered
    as loops, ``{"bert.encoder.layer": 24}``; ``summary``: the graph's
    ``GraphSummary`` (the ops recorded at each line, for the advice)."""
    notes: list[str] = []
    if raw is None:
        secs = total_s or 0.0
        parts = [CompilePart("loading", "loaded from the executable store", secs,
                             "xlanb's timer")]
        return CompileProfile(what, platform, secs, parts, 0.0, [], [],
                              "nothing compiled", ["loaded, not compiled: nothing to attribute"])
    measured = raw.lower_s + raw.compile_s + raw.trace_s
    parts = [CompilePart("lowering", "xlanb's trace and lowering", raw.lower_s, "xlanb's timer")]
    fusion_pool, weights = 0.0, {}
    if raw.spans:
        more, unattributed, weights, note = cpu_parts(raw)
        fusion_pool = sum(p.seconds for p in more if p.name in (
            "fusion emitters and thunks (MLIR)", "LLVM codegen"))
    elif raw.platform == "tpu" and tpu_log:
        more, unattributed, note = tpu_parts(raw, tpu_log)
        if more:
            notes.append("libtpu times its stages, not its fusions: by line, evenly over "
                         "the instructions of the TPU module")
    else:
        more, unattributed, note = [], 0.0, raw.note or "not traced"
    if not more:
        more = [CompilePart("other", "the compile, not split", raw.compile_s, "xlanb's timer")]
        unattributed = 0.0
    parts += more
    if raw.trace_s:
        parts.append(CompilePart("other", "this profile (starting, reading the trace)",
                                 raw.trace_s, "xlanb's timer"))
    if note:
        notes.append(note)
    total = measured
    if total_s is not None and total_s > measured:
        parts.append(CompilePart("other", "xlanb (store, summary)", total_s - measured,
                                 "xlanb's timer − the compile"))
        total = total_s
    stats: list = []
    lines, scopes, method = (attribute(text, total, fusion_pool, weights, recorded, loops, stats)
                             if text else ([], [], ""))
    profile = CompileProfile(what, raw.platform, total, parts, unattributed, lines, scopes,
                             method, notes)
    if text:
        profile.advice = tuple(advise(profile, stats[0] if stats else None, text, summary))
    return profile


# ---------------------------------------------------------------------------------------
# Several compiles at once: a cell's, an eager run's, a script's

class CompileSummary:
    """``xlanb.compile_summary(graphs)``: several compiles' profiles summed, by phase,
    line and scope: "4 graphs (812 ops) compiled in 4.8 s; 60% at model.py:42"."""

    def __init__(self, profiles, n_ops: int = 0):
        self.profiles = list(profiles)
        self.n_ops = n_ops
        self.total_s = sum(p.total_s for p in self.profiles)
        self.phases: dict = defaultdict(float)
        lines: dict = defaultdict(lambda: [0.0, 0])
        scopes: dict = defaultdict(lambda: [0.0, 0])
        for p in self.profiles:
            for k, v in p.phases().items():
                self.phases[k] += v
            for rows, into in ((p.by_line(None), lines), (p.by_scope(None), scopes)):
                for r in rows:
                    into[r.key][0] += r.seconds
                    into[r.key][1] += r.ops
        t = self.total_s or 1.0
        self._lines = sorted((CompileRow(k, v[0], v[0] / t, v[1]) for k, v in lines.items()),
                             key=lambda r: -r.seconds)
        self._scopes = sorted((CompileRow(k, v[0], v[0] / t, v[1]) for k, v in scopes.items()),
                              key=lambda r: -r.seconds)
        seen: dict = {}
        for p in self.profiles:  # a finding once, however many graphs show it
            for a in p.advice:
                seen.setdefault((a.kind, a.where), a)
        self.advice: tuple[Advice, ...] = tuple(seen.values())

    def by_line(self, n: int | None = 10) -> list[CompileRow]:
        return self._lines[:n]

    def by_scope(self, n: int | None = 10) -> list[CompileRow]:
        return self._scopes[:n]

    def headline(self) -> str:
        n = len(self.profiles)
        head = (f"{n} graph{'s' if n != 1 else ''}"
                + (f" ({self.n_ops} ops)" if self.n_ops else "")
                + f" compiled in {format_duration(self.total_s)}")
        top = next((r for r in self._lines if not r.key.startswith("(")), None)
        return head + (f"; {100 * top.share:.0f}% at {top.key}" if top is not None else "")

    def __str__(self) -> str:
        if not self.profiles:
            return "no compiles"
        t = self.total_s or 1.0
        out = [self.headline()]
        out.append(format_table(("phase", "seconds", "share"),
                                [(k, format_duration(v), f"{100 * v / t:.1f}%")
                                 for k, v in self.phases.items()], right=(1, 2), indent="  "))
        out.append("  by line:")
        out.append(format_table(("line", "seconds", "share", "ops"),
                                CompileProfile._rows(self.by_line()), right=(1, 2, 3), indent="    "))
        out.append("  by scope:")
        out.append(format_table(("scope", "seconds", "share", "ops"),
                                CompileProfile._rows(self.by_scope()), right=(1, 2, 3), indent="    "))
        out += [f"  advice: {a.text}" for a in self.advice]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return f"<pre class='xlanb-compile-summary'>{html.escape(str(self))}</pre>"
