"""What activation checkpointing saves: the peak of one training step compiled for one
v5e chip (libtpu's compiler, nothing run), with and without torch_xla's ``checkpoint``
around 3 of 4 MLP blocks (GELU, 4x wide; activations 4096 x 1024 float32, 16 MiB each).

    python benchmarks/bench_checkpoint_memory.py [--blocks N] [--rows R]

Needs ``pip install libtpu``. Each compile takes about a minute on 2 cores, which is why
this is a benchmark and not a test: tests/test_loops.py checks the structure (one
optimization barrier per checkpointed block) and the values against CPU torch. Without
the barrier XLA merges the recomputation back into the forward and the two peaks are
the same (measured: 180.2 MiB both, 7 blocks).
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("XLANB_STORE_DIR", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import xlanb  # noqa: E402
import xlanb.compat as compat  # noqa: E402
from bench_modes import _cpu_model  # noqa: E402


class MlpBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))


def peak(blocks: int, rows: int, checkpoint) -> object:
    torch.manual_seed(0)
    layers = nn.ModuleList(MlpBlock(256) for _ in range(blocks)).to("xla")
    h = layers[0](torch.randn(rows, 256).to("xla"))
    for layer in layers[1:]:
        h = checkpoint(layer, h) if checkpoint else layer(h)
    h.square().mean().backward()
    mem = xlanb.compile_for("v5e:1x1").memory
    for p in layers.parameters():
        p.grad = None  # nothing of this step is kept, so nothing of it runs
    return mem


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4096)
    args = ap.parse_args()
    compat.install(shadow=True)
    from torch_xla.utils.checkpoint import checkpoint
    xlanb.set_mode("lazy")
    plain = peak(args.blocks, args.rows, None)
    ck = peak(args.blocks, args.rows, checkpoint)
    mib = 1 << 20
    print(f"{_cpu_model()}; {args.blocks} blocks, {args.rows} x 256, v5e:1x1")
    print("| step | peak (MiB) | arguments (MiB) | temporaries (MiB) |")
    print("|---|---|---|---|")
    for name, m in (("plain", plain), ("checkpointed", ck)):
        print(f"| {name} | {m.peak_bytes / mib:.1f} | {m.argument_bytes / mib:.1f} | "
              f"{m.temp_bytes / mib:.1f} |")


if __name__ == "__main__":
    main()
