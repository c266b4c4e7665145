"""Device random state: ``torch.manual_seed`` seeds it; each random op draws a fresh key.

Keys are derived on the host from (seed, counter) and passed to executables as inputs,
so a new draw never recompiles and the same seed gives the same values in every mode.
"""
from __future__ import annotations

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_DEFAULT_SEED = 67280421310721  # torch's default seed


class _RngState:
    __slots__ = ("seed", "counter")

    def __init__(self) -> None:
        self.seed = _DEFAULT_SEED
        self.counter = 0


state = _RngState()


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def next_key() -> np.ndarray:
    """Fresh raw key data (uint32[2]) for the next random op."""
    state.counter += 1
    h = _splitmix64(state.seed ^ _splitmix64(state.counter))
    return np.array([h >> 32, h & 0xFFFFFFFF], dtype=np.uint32)


def manual_seed(seed: int) -> None:
    state.seed = int(seed) & _MASK64
    state.counter = 0


def initial_seed() -> int:
    return state.seed


def get_rng_state() -> torch.Tensor:
    return torch.tensor([state.seed, state.counter], dtype=torch.uint64).view(torch.uint8)


def set_rng_state(new_state: torch.Tensor) -> None:
    seed, counter = new_state.view(torch.uint64).tolist()
    state.seed, state.counter = int(seed), int(counter)
