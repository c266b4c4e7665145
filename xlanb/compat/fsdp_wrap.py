"""``torch_xla.distributed.fsdp.wrap``: the auto-wrap policies and ``recursive_wrap``, which
FSDPv2's ``auto_wrap_policy`` and Hugging Face's Trainer use. torch_xla's are a copy of
fairscale's; these are torch's own (``torch.distributed.fsdp.wrap``), which take the same
arguments."""
from __future__ import annotations

from torch.distributed.fsdp import wrap as _wrap

from .missing import module_getattr

NAME = "torch_xla.distributed.fsdp.wrap"

__all__ = ["always_wrap_policy", "lambda_auto_wrap_policy", "transformer_auto_wrap_policy",
           "size_based_auto_wrap_policy", "recursive_wrap"]

always_wrap_policy = _wrap.always_wrap_policy
lambda_auto_wrap_policy = _wrap.lambda_auto_wrap_policy
transformer_auto_wrap_policy = _wrap.transformer_auto_wrap_policy
size_based_auto_wrap_policy = _wrap.size_based_auto_wrap_policy

__getattr__ = module_getattr(NAME)


def recursive_wrap(module, auto_wrap_policy, wrapper_cls, ignored_modules=(),
                   ignored_params=(), only_wrap_children: bool = False, **kwargs):
    """Wrap ``module``'s submodules (and itself, unless ``only_wrap_children``) that
    ``auto_wrap_policy`` picks in ``wrapper_cls(submodule, **kwargs)``; returns the module
    and the number of parameters left unwrapped."""
    return _wrap._recursive_wrap(module, auto_wrap_policy, wrapper_cls,
                                 set(ignored_modules), set(ignored_params),
                                 only_wrap_children, **kwargs)
