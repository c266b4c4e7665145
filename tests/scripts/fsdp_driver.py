"""Run a torch_xla script unchanged (as ``__main__``, under ``python -m xlanb.run``), then
print what xlanb's tools say about it as one JSON line (``FSDP-RESULTS {...}``):
the parameters' and gradients' shardings and shards, the last graph's collectives
(kind, aten op, source line, bytes per device) and its loops, and that graph (the
training step) compiled for a TPU v5e:2x2 (per-chip memory against the whole graph's;
not with ``--no-target`` before the script). tests/test_fsdp.py asserts
on them."""
import json
import runpy
import sys

target = sys.argv[1] != "--no-target"  # a large step's TPU compile takes a minute
if not target:
    del sys.argv[1]
script = sys.argv[1]
sys.argv = sys.argv[1:]
ns = runpy.run_path(script, run_name="__main__")

import xlanb  # noqa: E402  (the script imported it through torch_xla already)

model = ns["model"]
out = {"params": {}, "graphs": len(xlanb.graphs())}
for name, p in model.named_parameters():
    s, g = xlanb.spmd.get_sharding(p), xlanb.spmd.get_sharding(p.grad)
    out["params"][name] = {
        "shape": list(p.shape),
        "spec": [str(e) for e in s.partition_spec] if s else None,
        "grad_spec": [str(e) for e in g.partition_spec] if g else None,
        "shards": [list(sh.value.shape) for sh in xlanb.peek(p, shards=True)],
        "grad_shards": [list(sh.value.shape) for sh in xlanb.peek(p.grad, shards=True)],
    }
last = xlanb.graphs()[-1]
out["repeats"] = list(last.repeats)
out["collectives"] = [c._asdict() for c in xlanb.collectives(last)]


def _chip_bytes(t) -> int:
    """The bytes of ``t`` on device 0: its shard there (all of it if replicated)."""
    v = xlanb.peek(t, shards=True)[0].value
    return v.numel() * v.element_size()


# the step for 4 TPU v5e chips: the parameters and AdamW's state as each chip holds them
if target:
    opt = ns["opt"]
    state = [p for p in model.parameters()] + [v for st in opt.state.values()
                                               for v in st.values() if v.dim() > 0]
    report = xlanb.compile_for("v5e:2x2", last)
    out["target"] = {"args": report.memory.argument_bytes, "whole": report.whole_argument_bytes,
                     "chips": report.mesh_chips, "state_chip": sum(map(_chip_bytes, state)),
                     "state_whole": sum(t.numel() * t.element_size() for t in state),
                     "logical_args": report.padding.total("argument")[0], "text": str(report)}
print("FSDP-RESULTS " + json.dumps(out))
