"""``_foreach_*`` ops (multi-tensor optimizers, clip_grad_norm_): the element
lowering mapped over the tensor lists."""
from __future__ import annotations

import jax.numpy as jnp

# The element lowerings must be registered before they are looked up below.
from xlanb.lowering import aten_elementwise, aten_factory  # noqa: F401
from xlanb.base.torch_compat import aten_op
from xlanb.lowering._util import aten
from xlanb.lowering.registry import LOWERINGS, register


def _pick(arg, i):
    return arg[i] if isinstance(arg, (list, tuple)) else arg


def _foreach(element, value_kw=None):
    """Per-list-element call of ``element``; lists are zipped, anything else
    (a Scalar, a 0-d Tensor) is shared. ``value_kw`` turns the last positional
    argument into that keyword (addcmul's ``value``)."""
    def lowering(*args, **kwargs):
        n = len(next(a for a in args if isinstance(a, (list, tuple))))
        if value_kw is not None and len(args) == 4:
            *args, value = args
            if hasattr(value, "ndim") and value.ndim == 1:  # Tensor scalars: one per element
                value = [value[i] for i in range(n)]
            kwargs[value_kw] = value
        return [element(*(_pick(a, i) for a in args),
                        **{k: _pick(v, i) for k, v in kwargs.items()}) for i in range(n)]
    return lowering


def _fn(op):
    return LOWERINGS[op].fn


_UNARY = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1",
          "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal",
          "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc"]
for _name in _UNARY:
    register(getattr(aten, f"_foreach_{_name}").default)(
        _foreach(_fn(getattr(aten, _name).default)))

_BINARY = {"add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor,
           "div": aten.div.Tensor, "maximum": aten.maximum.default,
           "minimum": aten.minimum.default, "clamp_min": aten.clamp_min.default,
           "clamp_max": aten.clamp_max.default, "pow": aten.pow.Tensor_Tensor,
           "lerp": aten.lerp.Tensor}
for _name, _op in _BINARY.items():
    _packet = getattr(aten, f"_foreach_{_name}")
    register(*[getattr(_packet, o) for o in _packet.overloads() if not o.endswith("out")])(
        _foreach(_fn(_op)))

for _name in ("addcmul", "addcdiv"):
    _packet = getattr(aten, f"_foreach_{_name}")
    register(_packet.Scalar, _packet.ScalarList, _packet.Tensor)(
        _foreach(_fn(getattr(aten, _name).default), value_kw="value"))

register(aten._foreach_copy.default)(_foreach(_fn(aten.copy.default)))
register(aten_op("_foreach_clone.default"))(  # torch >= 2.12 (base/torch_compat.py)
    _foreach(lambda x: x))
register(aten._foreach_zero.default)(_foreach(jnp.zeros_like))
register(aten._foreach_max.default)(_foreach(jnp.max))
