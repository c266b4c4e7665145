"""A torch_xla FSDPv2 script, unchanged: a tiny BERT from a ``transformers`` config
(2 layers, hidden 64; fsdp_bert_model.py) for sequence classification, AdamW, 3 steps
on a mesh of every device (run with 4). Its output is a ``ModelOutput``, not a tensor,
so FSDPv2 needs ``shard_output`` (as Hugging Face's Trainer passes it).
tests/test_fsdp.py runs it with ``python -m xlanb.run`` and holds its losses against
CPU torch's."""
import numpy as np
import torch

import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.experimental.spmd_fully_sharded_data_parallel import \
    SpmdFullyShardedDataParallel as FSDPv2

from fsdp_bert_model import make_model  # the model, seed and data (CPU torch's test too)

xr.use_spmd()
n = xr.global_runtime_device_count()
mesh = xs.Mesh(np.array(range(n)), (n, 1), ("fsdp", "model"))
xs.set_global_mesh(mesh)

model, ids, labels = make_model()
device = torch_xla.device()


def shard_output(output, mesh):
    xs.mark_sharding(output.logits, mesh, ("fsdp", None))


model = FSDPv2(model.to(device), shard_output=shard_output)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids, labels = ids.to(device), labels.to(device)
xs.mark_sharding(ids, mesh, ("fsdp", None))
for step in range(3):
    opt.zero_grad()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    torch_xla.sync()
    print(f"step {step} loss {loss.item():.6f}")
