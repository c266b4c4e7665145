"""Physical layouts in optimized HLO text, and what they pad.

A TPU keeps arrays in tiles: ``bf16[1000,1000]{1,0:T(8,128)(2,1)}`` is stored in 8x128
tiles along its two minor dimensions (``minor_to_major`` 1,0), so the minor dimension of
1000 takes 1024 elements: 2,048,000 bytes for 2,000,000 logical. A layout's first tile
decides the padding (the tiles after it subdivide it); ``E(n)`` sets the element size in
bits; ``S(n)`` is a memory space and pads nothing. A layout with no tiles (XLA:CPU's
``{1,0}``) pads nothing.
"""
from __future__ import annotations

import math
import re
from typing import NamedTuple

from .hlo_text import BYTES

# dtype[dims] with an optional {layout}; a layout holds no braces
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+(?:fn|fnuz)?)?)\[([\d,]*)\](\{[^{}]*\})?")
_TILE = re.compile(r"T\(([\d,]*)\)")
_ELEMENT_BITS = re.compile(r"E\((\d+)\)")


class ArrayLayout(NamedTuple):
    """One array of an HLO type, with its layout and sizes."""
    type: str           # ``bf16[1000,1000]``
    layout: str         # ``{1,0:T(8,128)(2,1)}`` ("" if the text gives none)
    logical_bytes: int  # elements x element size
    padded_bytes: int   # what the layout stores

    @property
    def padding_bytes(self) -> int:
        return self.padded_bytes - self.logical_bytes


def _element_bits(dtype: str, layout: str) -> int:
    m = _ELEMENT_BITS.search(layout)
    if m:
        return int(m.group(1))
    if dtype in ("s4", "u4"):
        return 4
    return 8 * BYTES.get(dtype, 4)


def padded_elements(dims: tuple, layout: str) -> int:
    """How many elements an array of ``dims`` takes in ``layout`` (its first tile
    rounds its minor dimensions up; dimensions the tile has beyond the rank count 1)."""
    if ":" not in layout:
        return math.prod(dims)
    order_text, _, tiling = layout.strip("{}").partition(":")
    tiles = _TILE.findall(tiling)
    if not tiles or not tiles[0]:
        return math.prod(dims)
    order = [int(i) for i in order_text.split(",") if i]
    physical = [dims[i] for i in reversed(order)] if order else list(dims)  # major first
    tile = [int(t) for t in tiles[0].split(",")]
    if len(tile) > len(physical):
        physical = [1] * (len(tile) - len(physical)) + physical
    k = len(physical) - len(tile)
    out = math.prod(physical[:k])
    for d, t in zip(physical[k:], tile):
        out *= -(-d // t) * t
    return out


def array_layouts(type_text: str) -> list[ArrayLayout]:
    """Every array in an HLO type (a tuple has many), with its layout's padding."""
    out = []
    for dtype, dims_text, layout in _ARRAY.findall(type_text):
        if dtype == "token":
            continue
        dims = tuple(int(d) for d in dims_text.split(",") if d)
        bits = _element_bits(dtype, layout)
        logical = -(-math.prod(dims) * 8 * BYTES.get(dtype, 4) // 8)
        padded = -(-padded_elements(dims, layout) * bits // 8)
        out.append(ArrayLayout(f"{dtype}[{dims_text}]", layout, logical, padded))
    return out


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def entry_layouts(text: str) -> tuple[list[list[ArrayLayout]], list[ArrayLayout]]:
    """``(parameters, results)`` of an optimized module's entry computation, from its
    ``entry_computation_layout``: per parameter its arrays, and the result's arrays."""
    i = text.find("entry_computation_layout={")
    if i < 0:
        return [], []
    i += len("entry_computation_layout={")
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    sig = text[i:j - 1]
    params_text, _, result_text = sig.partition(")->")
    params = [array_layouts(p) for p in _split_top(params_text.removeprefix("("))]
    return params, array_layouts(result_text)
