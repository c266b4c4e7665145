"""seeds/003 on the xla device: stop in pdb in the middle of the forward pass.

Four ``nn.Linear`` layers, one ``xlanb.sync()`` (torch_xla's ``mark_step``) at the end.
Wherever you stop and whatever you print, the sync compiles the same graph:

    python examples/pdb_seed003.py                         # no stops
    XLANB_STOPS=after2 python examples/pdb_seed003.py      # plain pdb via breakpoint()
    PYTHONBREAKPOINT=xlanb.set_trace XLANB_STOPS=after2 python examples/pdb_seed003.py

At the ``(Pdb)`` prompt, ``p output1`` peeks: it computes the value op by op through the
single-op cache and leaves the pending graph as it was. ``XLANB_STOPS`` is a comma list of
stop names: ``start``, ``after2``, ``after3``, ``after4``. The last line of output is JSON:
the compile counters, the compiled graphs' hashes and the final values.
"""
import json
import os

import torch

import xlanb

STOPS = set(filter(None, os.environ.get("XLANB_STOPS", "").split(",")))


def main() -> dict:
    torch.manual_seed(0)
    dev = xlanb.device()
    linear1 = torch.nn.Linear(10, 30).to(dev)
    linear2 = torch.nn.Linear(30, 20).to(dev)
    linear3 = torch.nn.Linear(20, 10).to(dev)
    linear4 = torch.nn.Linear(10, 1).to(dev)
    inp = torch.randn(2, 10).to(dev)
    if "start" in STOPS:
        breakpoint()
    output1 = linear1(inp)
    output2 = linear2(output1)
    if "after2" in STOPS:
        breakpoint()  # seeds/003: "PDB ---> output1.to('cpu')"
    output3 = linear3(output2)
    if "after3" in STOPS:
        breakpoint()
    output4 = linear4(output3)
    if "after4" in STOPS:
        breakpoint()  # seeds/003: "PDB ---> output4.to('cpu')"
    xlanb.sync()
    outputs = [output1, output2, output3, output4]
    return {
        "mode": xlanb.get_mode(),
        "counters": {name: xlanb.metrics.counter_value(name) or 0
                     for name in ("UncachedCompile", "CachedCompile", "OpCompile", "OpCacheHit",
                                  "EagerRunCompile")},
        "graphs": [{"hash": g.hash, "n_nodes": g.n_nodes} for g in xlanb.graphs()],
        "values": {f"output{i}": o.cpu().tolist() for i, o in enumerate(outputs, 1)},
    }


if __name__ == "__main__":
    print(json.dumps(main()))
