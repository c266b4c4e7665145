"""One SPMD program for tests/test_spmd.py: run as 2 processes x 2 devices
(``python -m xlanb.launch --nproc 2 --devices-per-proc 2``) or 1 process x 4 devices;
process 0 prints the results as JSON (losses, weights, a global tensor built from
process-local pieces, what each process holds)."""
from __future__ import annotations

import json
import os
import sys

import torch

import xlanb
import xlanb.spmd as xs
from xlanb.compat import runtime as xr, xla_model as xm

if os.environ.get("XLANB_NUM_PROCESSES"):
    xlanb.distributed.initialize()
xlanb.set_mode(sys.argv[1] if len(sys.argv) > 1 else "lazy")
rank = xlanb.distributed.process_index()
nproc = xlanb.distributed.process_count()
mesh = xs.Mesh(range(xlanb.distributed.global_device_count()), (2, 2), ("data", "model"))

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("xla")
xs.mark_sharding(m[0].weight, mesh, ("model", None))
xs.mark_sharding(m[2].weight, mesh, (None, "model"))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
    # each process holds its rows of the batch; the global batch is built from them
    rows = slice(rank * 8 // nproc, (rank + 1) * 8 // nproc)
    xx = xlanb.distributed.from_process_local(x[rows], mesh, ("data", None))
    yy = xlanb.distributed.from_process_local(y[rows], mesh, ("data", None))
    loss = ((m(xx) - yy) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    xlanb.sync()
    losses.append(loss.item())
weights = [p.detach().cpu().tolist() for p in m.parameters()]
peek = xlanb.peek(m[0].weight)
shards = xlanb.peek(m[0].weight, shards=True)
out = {"losses": losses, "weights": weights, "peek_ok": torch.equal(peek, torch.tensor(weights[0])),
       "local_shards": [s.device for s in shards], "nproc": nproc,
       "graphs": len(xlanb.graphs()), "xx_shape": list(xx.shape), "repr": repr(m[0].weight),
       # torch_xla's names for the same (xlanb.compat): processes are its replicas
       "xr": [xr.world_size(), xr.global_ordinal(), xm.xrt_world_size(), xm.is_master_ordinal()]}
if rank != 0:
    print(f"rank {rank} shards {out['local_shards']}", flush=True)
# every process: torch_xla's counts (global devices, processes on this host, its place)
out["xr_counts"] = [xr.global_device_count(), xr.global_runtime_device_count(),
                    xr.local_device_count(), xr.local_process_count(), xr.local_ordinal(),
                    xm.get_local_ordinal(), xm.get_ordinal(), xm.is_master_ordinal(),
                    xm.is_master_ordinal(local=False)]
print(f"XR-COUNTS {rank} " + json.dumps(out["xr_counts"]), flush=True)
if nproc > 1:  # the others have printed: process 0's long line is not cut into by theirs
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("printed")
if rank == 0:
    print("DIST-RESULTS " + json.dumps(out), flush=True)
