"""Pointwise math: unary functions, arithmetic, comparisons, logic, clamps."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from xlanb.lowering._util import aten, default_float, in_opmath, is_float, to_float, upcast
from xlanb.lowering.registry import register


def _is_one(v) -> bool:
    # Skip the multiply only for a literal 1; a lifted 0-d array is always applied.
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1


def _scaled(y, alpha):
    return y if _is_one(alpha) else y * alpha


# ---- unary ----------------------------------------------------------------

def _float_unary(op, fn):
    # Integer and bool inputs produce torch's default float dtype. Half types compute in
    # float32 and round once, as CPU torch's kernels do (in half, expm1, log2, acosh and
    # sinc were 2 ulps off CPU torch in PyTorch's float16 reference tests)
    register(op)(lambda x: in_opmath(fn, to_float(x)))


def _exp(x):
    if not jnp.iscomplexobj(x):
        return jnp.exp(x)
    # C99's cexp where the real part is infinite and the imaginary one is not finite (XLA
    # gives NaN + NaN j): -inf gives 0, +inf gives inf + NaN j, as CPU torch and NumPy do
    re, im = jnp.real(x), jnp.imag(x)
    odd = jnp.isinf(re) & ~jnp.isfinite(im)
    special = jnp.where(re > 0, lax.complex(jnp.asarray(jnp.inf, re.dtype),
                                            jnp.asarray(jnp.nan, re.dtype)),
                        jnp.zeros((), x.dtype))
    return jnp.where(odd, special, jnp.exp(x))


def _exp2(x):
    # 2**x as 2**n * 2**f (n = round(x), |f| <= 1/2), where 2**n is exact: XLA computes
    # exp(x * log 2), whose product rounds x's ulp into the exponent (2**55 came out 1.5e-6
    # off; CPU torch gives integer powers exactly)
    if jnp.iscomplexobj(x):
        return jnp.exp2(x)
    n = jnp.round(x)
    scaled = jnp.ldexp(jnp.exp2(x - n), jnp.clip(n, -2200, 2200).astype(jnp.int32))
    return jnp.where(jnp.isfinite(x), scaled, jnp.exp2(x))


# (These run inside _float_unary, which gives them half types in float32.)
# XLA's cosh and sinh compute exp(|x| + log(1/2)): the sum rounds away |x|'s last bits,
# 25 ulps off CPU torch at |x| = 55. Here they are 0.5 (e + 1/e) and 0.5 (e - 1/e) with
# e = exp(|x|), which overflow where CPU torch's do (|x| > 88.72 in float32, where cosh
# itself overflows only past 89.41); sinh keeps XLA's form below |x| = 1, which avoids
# e - 1/e's cancellation there (through expm1).
def _cosh(x):
    if jnp.iscomplexobj(x):
        return jnp.cosh(x)
    e = jnp.exp(jnp.abs(x))
    return 0.5 * (e + 1 / e)


def _sinh(x):
    if jnp.iscomplexobj(x):
        return jnp.sinh(x)
    e = jnp.exp(jnp.abs(x))
    big = jnp.copysign(0.5 * (e - 1 / e), x)
    return jnp.where(jnp.abs(x) < 1, jnp.sinh(x), big)


def _asinh(x):
    if not jnp.iscomplexobj(x):
        return jnp.arcsinh(x)
    # asinh is odd, so its real part has the sign of x's, signed zero included (C99's
    # casinh; XLA gave +1.32 + 1.57j for -0 + 2j, where CPU torch gives -1.32 + 1.57j)
    r = jnp.arcsinh(x)
    return lax.complex(jnp.copysign(jnp.real(r), jnp.real(x)), jnp.imag(r))


for _op, _fn in [
    (aten.exp, _exp), (aten.exp2, _exp2), (aten.expm1, jnp.expm1),
    (aten.log, jnp.log), (aten.log2, jnp.log2), (aten.log10, jnp.log10),
    (aten.log1p, jnp.log1p), (aten.sqrt, jnp.sqrt), (aten.rsqrt, lax.rsqrt),
    (aten.sin, jnp.sin), (aten.cos, jnp.cos), (aten.tan, jnp.tan),
    (aten.asin, jnp.arcsin), (aten.acos, jnp.arccos), (aten.atan, jnp.arctan),
    (aten.sinh, _sinh), (aten.cosh, _cosh), (aten.tanh, jnp.tanh),
    (aten.asinh, _asinh), (aten.acosh, jnp.arccosh), (aten.atanh, jnp.arctanh),
    (aten.sigmoid, jax.nn.sigmoid), (aten.erf, lax.erf), (aten.erfc, lax.erfc),
    (aten.erfinv, lax.erf_inv), (aten.lgamma, lax.lgamma),
    (aten.i0, jnp.i0), (aten.sinc, jnp.sinc), (aten.reciprocal, lambda x: 1 / x),
]:
    _float_unary(_op.default, _fn)


@register(aten.logit.default)
def logit(x, eps=None):
    x = to_float(x)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


def _int_identity(fn):
    # Rounding is the identity on integers (jnp would go through float). Complex numbers
    # have no rounding in torch: refusing sends the call to CPU torch, which raises its
    # own error (torch's meta kernels accept complex here).
    def rounded(x):
        if jnp.iscomplexobj(x):
            raise TypeError("rounding is not defined for complex inputs")
        return x if not is_float(x) else fn(x)
    return rounded


register(aten.ceil.default, may_refuse=True)(_int_identity(jnp.ceil))
register(aten.floor.default, may_refuse=True)(_int_identity(jnp.floor))
register(aten.trunc.default, aten.fix.default, may_refuse=True)(_int_identity(jnp.trunc))
register(aten.round.default, may_refuse=True)(_int_identity(jnp.round))  # half to even


@register(aten.round.decimals)
def round_decimals(x, *, decimals=0):
    # as CPU torch: in float32 for half types, and dividing by 10**-decimals for negative
    # decimals (jnp.round scaled bfloat16 in bfloat16: a third off at 3 decimals)
    if not is_float(x):
        return jnp.round(x, decimals)
    y = upcast(x)
    if decimals >= 0:
        scale = 10.0 ** decimals
        r = jnp.round(y * scale) / scale
    else:
        scale = 10.0 ** -decimals
        r = jnp.round(y / scale) * scale
    return r.astype(x.dtype)


register(aten.frac.default)(lambda x: x - jnp.trunc(x))
register(aten.abs.default)(jnp.abs)
register(aten.neg.default)(jnp.negative)
register(aten.sign.default, aten.sgn.default)(lambda x: x if x.dtype == jnp.bool_ else jnp.sign(x))


@register(aten.digamma.default)
def digamma(x):
    x = to_float(x)
    # torch: -inf at +0 and +inf at -0 (copysign(inf, -x)); JAX gives NaN at both
    return jnp.where(x == 0, jnp.copysign(jnp.asarray(jnp.inf, x.dtype), -x), lax.digamma(x))
register(aten.signbit.default)(jnp.signbit)
register(aten.bitwise_not.default)(jnp.invert)
register(aten.logical_not.default)(jnp.logical_not)
register(aten.isnan.default)(jnp.isnan)
register(aten.isinf.default)(jnp.isinf)
register(aten.isfinite.default)(jnp.isfinite)
register(aten.isposinf.default)(jnp.isposinf)
register(aten.isneginf.default)(jnp.isneginf)
register(aten.positive.default)(lambda x: x)


@register(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not is_float(x):
        return x
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# ---- arithmetic -----------------------------------------------------------

def _is_inexact_array(v) -> bool:
    return hasattr(v, "dtype") and jnp.issubdtype(v.dtype, jnp.inexact)


def _is_integral_array(v) -> bool:  # bool included: torch converts it the same way
    return hasattr(v, "dtype") and (jnp.issubdtype(v.dtype, jnp.integer) or v.dtype == jnp.bool_)


def _torch_float_type(vals):
    """The float (or complex) type torch computes a mixed integer/float operation in:
    the tensors' float type, else torch's default for a Python number (lifted, it is a
    weakly typed array: ``int_tensor > 2.5`` compares in float32, though the integer-only
    op takes its number as float64)."""
    strong = [v for v in vals if _is_inexact_array(v) and not getattr(v, "weak_type", False)]
    if strong:
        return jnp.result_type(*strong)
    if any(isinstance(v, complex) or (_is_inexact_array(v) and jnp.iscomplexobj(v))
           for v in vals):
        return jnp.complex128 if default_float() == jnp.float64 else jnp.complex64
    return default_float()


def _in_torch_float(fn, always: bool = False):
    """``fn`` with its integer and bool tensors first converted to the float type the
    operation computes in, as torch's kernels do: ``int64 * 1.1`` is float32(x) *
    float32(1.1) there, where JAX would compute int64 with a float in float64 and round
    once (1 ulp from torch above 2**24). ``always``: the operation is float-valued even
    without a float operand (true division of integers)."""
    def converted(*args, **kwargs):
        ints = [_is_integral_array(a) for a in args]
        mixed = any(ints) and (always or any(
            _is_inexact_array(a) or isinstance(a, (float, complex)) for a in args))
        if mixed:
            dt = _torch_float_type(args)
            args = [a.astype(dt) if i else a for a, i in zip(args, ints)]
        return fn(*args, **kwargs)
    return converted


def _check_alpha(x, y, alpha):
    # torch's CPU kernels refuse a floating alpha for integral or bool results (its meta
    # kernels accept it): refusing sends the call to CPU torch, which raises its error
    inexact = [jnp.issubdtype(jnp.result_type(v), jnp.inexact) for v in (alpha, x, y)]
    if inexact == [True, False, False]:
        raise TypeError("a floating point alpha for integral tensors")


def add(x, y, alpha=1):
    _check_alpha(x, y, alpha)
    return x + _scaled(y, alpha)


def sub(x, y, alpha=1):
    _check_alpha(x, y, alpha)
    return x - _scaled(y, alpha)


def rsub(x, y, alpha=1):
    return y - _scaled(x, alpha)


register(aten.add.Tensor, aten.add.Scalar, may_refuse="dtypes")(_in_torch_float(add))
register(aten.sub.Tensor, aten.sub.Scalar, may_refuse="dtypes")(_in_torch_float(sub))
register(aten.rsub.Tensor, aten.rsub.Scalar)(_in_torch_float(rsub))


register(aten.mul.Tensor, aten.mul.Scalar)(_in_torch_float(jnp.multiply))


def _trunc_div(x, y):
    dt = jnp.result_type(x, y)
    if jnp.issubdtype(dt, jnp.integer):
        # lax.div truncates toward zero on integers (C semantics), like torch.
        x, y = jnp.broadcast_arrays(jnp.asarray(x, dt), jnp.asarray(y, dt))
        return lax.div(x, y)
    return jnp.trunc(jnp.true_divide(x, y))


_true_divide = _in_torch_float(jnp.true_divide, always=True)


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode,
          aten.true_divide.Tensor, aten.true_divide.Scalar)
def div(x, y, *, rounding_mode=None):
    if rounding_mode is None:
        return _true_divide(x, y)  # ints divide to float, like torch
    if rounding_mode == "trunc":
        return _trunc_div(x, y)
    return jnp.floor_divide(x, y)  # Python floor semantics, like torch


register(aten.floor_divide.default, aten.floor_divide.Scalar)(jnp.floor_divide)
register(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)(
    _in_torch_float(jnp.remainder))  # sign of the divisor, like Python and torch
register(aten.fmod.Tensor, aten.fmod.Scalar)(_in_torch_float(jnp.fmod))


def pow_(x, y):
    # A Python int exponent stays exact (jnp uses integer_pow for it).
    x_arr, y_arr = jnp.asarray(x), jnp.asarray(y)
    if jnp.issubdtype(jnp.result_type(x, y), jnp.integer) and not isinstance(y, int):
        # integer powers with a negative exponent: 1/x^n truncates to 0 unless |x| == 1
        out = jnp.power(x, jnp.maximum(y_arr, 0))
        neg = y_arr < 0
        odd = (y_arr % 2) != 0
        special = jnp.where(x_arr == 1, 1, jnp.where(x_arr == -1, jnp.where(odd, -1, 1), 0))
        return jnp.where(neg, special.astype(out.dtype), out)
    return jnp.power(x, y)


register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)(_in_torch_float(pow_))
register(aten.float_power.Tensor_Tensor, aten.float_power.Tensor_Scalar, aten.float_power.Scalar)(
    lambda x, y: jnp.power(jnp.asarray(x, jnp.float64), jnp.asarray(y, jnp.float64)))
register(aten.atan2.default)(lambda x, y: jnp.arctan2(to_float(x), to_float(y)))
register(aten.hypot.default)(jnp.hypot)
register(aten.copysign.Tensor, aten.copysign.Scalar)(
    lambda x, y: jnp.copysign(to_float(x), y))
register(aten.logaddexp.default)(jnp.logaddexp)
register(aten.logaddexp2.default)(jnp.logaddexp2)
register(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)(
    lambda x, y: jax.scipy.special.xlogy(to_float(jnp.asarray(x)), y))
register(aten.heaviside.default)(jnp.heaviside)
register(aten.maximum.default)(_in_torch_float(jnp.maximum))
register(aten.minimum.default)(_in_torch_float(jnp.minimum))
register(aten.fmax.default)(_in_torch_float(jnp.fmax))
register(aten.fmin.default)(_in_torch_float(jnp.fmin))


@register(aten.addcmul.default)
def addcmul(x, t1, t2, *, value=1):
    return x + _scaled(t1 * t2, value)


@register(aten.addcdiv.default)
def addcdiv(x, t1, t2, *, value=1):
    return x + _scaled(t1 / t2, value)


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(x, end, weight):
    # torch's two-sided formula keeps lerp exact at both ends.
    diff = end - x
    # 0.5 in the weight's own type: a lifted float32 weight compared with a Python 0.5
    # was compared in float64 (both weakly typed), which a TPU emulates (AdamW's lerp_)
    half = jnp.asarray(0.5, weight.dtype) if hasattr(weight, "dtype") else 0.5
    return jnp.where(jnp.abs(weight) < half, x + weight * diff, end - diff * (1 - weight))


# ---- clamps and selection -------------------------------------------------

@register(aten.clamp.default, aten.clamp.Tensor, aten.clip.default, aten.clip.Tensor)
def clamp(x, min=None, max=None):
    if min is not None:
        x = jnp.maximum(x, min)
    if max is not None:
        x = jnp.minimum(x, max)  # min > max gives max, like torch
    return x


register(aten.clamp_min.default, aten.clamp_min.Tensor)(lambda x, m: jnp.maximum(x, m))
register(aten.clamp_max.default, aten.clamp_max.Tensor)(lambda x, m: jnp.minimum(x, m))
register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)(
    lambda c, x, y: jnp.where(c, x, y))


# ---- comparisons and logic ------------------------------------------------

for _name, _fn in [("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less),
                   ("le", jnp.less_equal), ("gt", jnp.greater), ("ge", jnp.greater_equal)]:
    register(getattr(aten, _name).Tensor, getattr(aten, _name).Scalar)(_in_torch_float(_fn))

register(aten.logical_and.default)(jnp.logical_and)
register(aten.logical_or.default)(jnp.logical_or)
register(aten.logical_xor.default)(jnp.logical_xor)

for _name, _fn in [("bitwise_and", jnp.bitwise_and), ("bitwise_or", jnp.bitwise_or),
                   ("bitwise_xor", jnp.bitwise_xor),
                   ("bitwise_left_shift", jnp.left_shift),
                   ("bitwise_right_shift", jnp.right_shift)]:
    _packet = getattr(aten, _name)
    register(*[getattr(_packet, o) for o in ("Tensor", "Tensor_Scalar", "Scalar", "Scalar_Tensor")
               if o in _packet.overloads()])(_fn)


@register(aten.isclose.default)
def isclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return jnp.isclose(x, other, rtol=rtol, atol=atol, equal_nan=equal_nan)


@register(aten.gcd.default)
def gcd(a, b):
    return jnp.gcd(a, b)


@register(aten.lcm.default)
def lcm(a, b):
    return jnp.abs(jnp.lcm(a, b))
