"""A torch_xla FSDPv2 training script, unchanged: a 3-layer MLP, SGD, 3 steps on a mesh of
every device (run with 4). tests/test_fsdp.py runs it with ``python -m xlanb.run``; the
same script runs on torch_xla 2.9 (PJRT_DEVICE=CPU CPU_NUM_DEVICES=4)."""
import numpy as np
import torch
import torch.nn as nn

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.experimental.spmd_fully_sharded_data_parallel import \
    SpmdFullyShardedDataParallel as FSDPv2

xr.use_spmd()
n = xr.global_runtime_device_count()
mesh = xs.Mesh(np.array(range(n)), (n, 1), ("fsdp", "model"))
xs.set_global_mesh(mesh)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                      nn.Linear(32, 8))
x, y = torch.randn(16, 16), torch.randint(0, 8, (16,))

device = torch_xla.device()
model = FSDPv2(model.to(device))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = x.to(device), y.to(device)
xs.mark_sharding(x, mesh, ("fsdp", None))
for step in range(3):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)  # the forward: its all-gathers
    loss.backward()
    opt.step()
    torch_xla.sync()
    print(f"step {step} loss {loss.item():.6f}")
