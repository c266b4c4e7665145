"""A short tour on the CPU: the same training step in lazy, eager and opbyop modes.

    python examples/demo.py
"""
import torch

import xlanb
from xlanb import metrics


def train(mode: str, steps: int = 3) -> list[float]:
    xlanb.set_mode(mode)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32).to("xla")
    y = torch.randint(0, 10, (16,)).to("xla")
    xlanb.sync()
    metrics.clear()
    losses = []
    for step in range(steps):
        for g in opt.param_groups:  # a new learning rate every step: never a recompile
            g["lr"] = 1e-3 * (step + 1)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        xlanb.sync()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    for mode in xlanb.MODES:
        losses = train(mode)
        counts = {k: metrics.counter_value(k) or 0
                  for k in ("UncachedCompile", "CachedCompile", "OpCompile", "OpCacheHit")}
        print(f"{mode:7s} losses={[round(l, 5) for l in losses]} {counts}")
    xlanb.set_mode("lazy")
    x = torch.arange(6.0, device="xla").reshape(2, 3)
    y = (x * 2).sum(dim=0)
    print("peek (no graph cut):", xlanb.peek(y))
    xlanb.sync()
    print(metrics.short_report())
