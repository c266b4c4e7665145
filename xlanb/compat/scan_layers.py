"""``torch_xla.experimental.scan_layers``: ``scan_layers(layers, input_data)`` on
``xlanb.scan_layers``: ``nn.Sequential(*layers)(input_data)`` compiled as one loop over
the layers (on every platform: the program asked for it). Layers that are not alike
(parameter or buffer names or shapes) are a ``ValueError`` with torch_xla's message.
``partition_fn`` and ``is_layer_pure`` change nothing here (see ``compat.scan``).
"""
from __future__ import annotations

import xlanb

from .missing import module_getattr

NAME = "torch_xla.experimental.scan_layers"

__all__ = ["scan_layers"]

__getattr__ = module_getattr(NAME)


def scan_layers(layers, input_data, partition_fn=None, is_layer_pure: bool = False):
    """The output of the last of ``layers``, each fed the one before's output."""
    return xlanb.scan_layers(layers, input_data)
