"""Random ops, drawn from the per-call JAX key ``rng``.

These are the functional forms that torch's in-place samplers (``uniform_``,
``normal_``, ``bernoulli_``, ``random_``, ...) map to. Streams differ from
torch's generator; an explicit ``generator=`` is ignored.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from xlanb.lowering._util import aten, default_float, jdtype, upcast
from xlanb.lowering.registry import register


def _float(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.floating) else default_float()


def _complex(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def _uniform(rng, shape, dtype, low=0.0, high=1.0):
    if _complex(dtype):  # torch draws the real and the imaginary part each
        part = jnp.finfo(dtype).dtype
        re, im = jax.random.split(rng)
        return jax.lax.complex(_uniform(re, shape, part, low, high),
                               _uniform(im, shape, part, low, high)).astype(dtype)
    u = jax.random.uniform(rng, shape, upcast(jnp.zeros((), _float(dtype))).dtype)
    return (low + u * (high - low)).astype(dtype)


def _normal(rng, shape, dtype, mean=0.0, std=1.0):
    # complex: real and imaginary parts each N(0, 1/2), as torch's randn (and JAX's) draw
    n = jax.random.normal(rng, shape, dtype if _complex(dtype)
                          else upcast(jnp.zeros((), _float(dtype))).dtype)
    return (mean + n * std).astype(dtype)


@register(aten.uniform.default, random=True)
def uniform(x, from_=0.0, to=1.0, *, generator=None, rng):
    return _uniform(rng, x.shape, x.dtype, from_, to)


@register(aten.normal_functional.default, random=True)
def normal_functional(x, mean=0.0, std=1.0, *, generator=None, rng):
    return _normal(rng, x.shape, x.dtype, mean, std)


@register(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor,
          random=True)
def normal(mean, std=1.0, *, generator=None, rng):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dtype = jnp.result_type(mean, std)
    return _normal(rng, shape, _float(dtype), mean, std)


@register(aten.normal.float_float, random=True)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, rng, **_):
    return _normal(rng, tuple(size), jdtype(dtype, default_float()), mean, std)


@register(aten.rand.default, random=True)
def rand(size, *, dtype=None, rng, **_):
    return _uniform(rng, tuple(size), jdtype(dtype, default_float()))


@register(aten.randn.default, random=True)
def randn(size, *, dtype=None, rng, **_):
    return _normal(rng, tuple(size), jdtype(dtype, default_float()))


@register(aten.rand_like.default, random=True)
def rand_like(x, *, dtype=None, rng, **_):
    return _uniform(rng, x.shape, jdtype(dtype, x.dtype))


@register(aten.randn_like.default, random=True)
def randn_like(x, *, dtype=None, rng, **_):
    return _normal(rng, x.shape, jdtype(dtype, x.dtype))


def _randint(rng, shape, low, high, dtype):
    return jax.random.randint(rng, shape, low, high, dtype=jnp.int64).astype(dtype)


@register(aten.randint.default, random=True)
def randint(high, size, *, dtype=None, rng, **_):
    return _randint(rng, tuple(size), 0, high, jdtype(dtype, jnp.int64))


@register(aten.randint.low, random=True)
def randint_low(low, high, size, *, dtype=None, rng, **_):
    return _randint(rng, tuple(size), low, high, jdtype(dtype, jnp.int64))


@register(aten.randint_like.default, random=True)
def randint_like(x, high, *, dtype=None, rng, **_):
    return _randint(rng, x.shape, 0, high, jdtype(dtype, x.dtype))


@register(aten.randint_like.low_dtype, random=True)
def randint_like_low(x, low, high, *, dtype=None, rng, **_):
    return _randint(rng, x.shape, low, high, jdtype(dtype, x.dtype))


def _random_bound(dtype):
    """Exclusive upper bound of ``random_()`` without ``to``: every integer the
    dtype represents exactly (floats: up to 2**mantissa digits)."""
    if dtype == jnp.bool_:
        return 2
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1) + 1
    return int(jnp.iinfo(dtype).max)


@register(aten.random.default, random=True)
def random_(x, *, generator=None, rng):
    return _randint(rng, x.shape, 0, _random_bound(x.dtype), x.dtype)


@register(aten.random.to, random=True)
def random_to(x, to, *, generator=None, rng):
    return _randint(rng, x.shape, 0, to, x.dtype)


@register(getattr(aten.random, "from"), random=True)  # "from" is a keyword
def random_from(x, from_, to, *, generator=None, rng):
    return _randint(rng, x.shape, from_, _random_bound(x.dtype) if to is None else to, x.dtype)


@register(aten.randperm.default, random=True)
def randperm(n, *, dtype=None, rng, **_):
    return jax.random.permutation(rng, n).astype(jdtype(dtype, jnp.int64))


@register(aten.bernoulli.default, random=True)
def bernoulli(x, p=None, *, generator=None, rng):
    # Without p, x holds the probabilities. A p is accepted too, for callers that
    # map bernoulli_.float(self, p) onto this overload.
    return jax.random.bernoulli(rng, x if p is None else p, x.shape).astype(x.dtype)


@register(aten.bernoulli.p, aten.bernoulli.Tensor, random=True)
def bernoulli_p(x, p, *, generator=None, rng):
    return jax.random.bernoulli(rng, p, x.shape).astype(x.dtype)


@register(aten.native_dropout.default, random=True)
def native_dropout(x, p, train, *, rng):
    if train is not None and not train:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(rng, 1 - p, x.shape)
    if isinstance(p, (int, float)):
        scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    else:  # p is a traced scalar: p == 1 zeroes everything, like torch. In p's own
        # type: with Python numbers (weakly typed, as the lifted p is) JAX computed the
        # scale in float64, which a TPU emulates
        one = jnp.ones((), p.dtype)
        scale = jnp.where(p < one, one / jnp.where(p < one, one - p, one), 0)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype)), keep


@register(aten.exponential.default, random=True)
def exponential(x, lambd=1.0, *, generator=None, rng):
    return (jax.random.exponential(rng, x.shape, upcast(jnp.zeros((), x.dtype)).dtype)
            / lambd).astype(x.dtype)


@register(aten.geometric.default, random=True)
def geometric(x, p, *, generator=None, rng):
    # Number of trials to the first success: ceil(log(U) / log(1 - p)).
    u = jax.random.uniform(rng, x.shape, jnp.float64, minval=jnp.finfo(jnp.float64).tiny)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p)).astype(x.dtype)


@register(aten.log_normal.default, random=True)
def log_normal(x, mean=1.0, std=2.0, *, generator=None, rng):
    return jnp.exp(_normal(rng, x.shape, upcast(x).dtype, mean, std)).astype(x.dtype)


@register(aten.cauchy.default, random=True)
def cauchy(x, median=0.0, sigma=1.0, *, generator=None, rng):
    c = jax.random.cauchy(rng, x.shape, upcast(jnp.zeros((), x.dtype)).dtype)
    return (median + sigma * c).astype(x.dtype)


@register(aten.multinomial.default, random=True)
def multinomial(probs, num_samples, replacement=False, *, generator=None, rng):
    logits = jnp.log(upcast(probs.astype(_float(probs.dtype))))
    if replacement:
        batch = logits.shape[:-1]
        out = jax.random.categorical(rng, logits, shape=(num_samples,) + batch)
        return jnp.moveaxis(out, 0, -1).astype(jnp.int64)
    # Without replacement: the top-k of Gumbel-perturbed logits (Gumbel-top-k).
    g = jax.random.gumbel(rng, logits.shape, logits.dtype)
    return jax.lax.top_k(logits + g, num_samples)[1].astype(jnp.int64)
