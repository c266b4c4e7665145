"""A torch_xla FSDPv2 script, unchanged: a residual MLP whose 4 blocks run through
``scan_layers`` over a ``ModuleList``, a final block under ``checkpoint``, AdamW, 3 steps
on a mesh of every device (run with 4). tests/test_fsdp.py runs it with
``python -m xlanb.run``."""
import numpy as np
import torch
import torch.nn as nn

import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.experimental.scan_layers import scan_layers
from torch_xla.experimental.spmd_fully_sharded_data_parallel import \
    SpmdFullyShardedDataParallel as FSDPv2
from torch_xla.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Model(nn.Module):
    def __init__(self, d: int = 32, n_layers: int = 4):
        super().__init__()
        self.embed = nn.Linear(16, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(n_layers))
        self.final = Block(d)
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        h = scan_layers(self.layers, self.embed(x))  # the loop, as torch_xla compiles it
        h = checkpoint(self.final, h)                # recomputed in the backward
        return self.head(h)


xr.use_spmd()
n = xr.global_runtime_device_count()
mesh = xs.Mesh(np.array(range(n)), (n, 1), ("fsdp", "model"))
xs.set_global_mesh(mesh)

torch.manual_seed(0)
model = Model()
x, y = torch.randn(16, 16), torch.randint(0, 8, (16,))

device = torch_xla.device()
model = FSDPv2(model.to(device))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
x, y = x.to(device), y.to(device)
xs.mark_sharding(x, mesh, ("fsdp", None))
for step in range(3):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    torch_xla.sync()
    print(f"step {step} loss {loss.item():.6f}")
