"""Autocast on the xla device: ``with torch.autocast(device_type="xla", dtype=torch.bfloat16)``.

torch keeps its autocast policies (which ops run in low precision, which in float32) in
C++, for CPU and CUDA; a PrivateUse1 backend registers its own. These are CUDA's lists,
registered as Python kernels at the AutocastPrivateUse1 dispatch key: each casts its
floating-point tensor arguments, then calls the op again below autocast (so autograd
records the casts, as it does on CUDA). Every other op falls through unchanged.

Importing this module installs the policy once (the lowering package imports every
``aten_*`` module). It does nothing JAX-specific: it is kept next to the lowerings
because it decides which dtype each op is lowered in.
"""
from __future__ import annotations

import torch

#: Ops that run in the autocast dtype (CUDA's "lower_precision_fp" list).
LOWER_PRECISION = (
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "_convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm",
    "chain_matmul", "linalg_multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "scaled_dot_product_attention",
)

#: Ops that run in float32 whatever their inputs (CUDA's "fp32" list).
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "softmax", "log_softmax", "cross_entropy_loss",
    "cumsum", "cumprod", "prod", "sum", "linalg_vector_norm", "norm",
)

_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)
_libs: list = []


def _kernel(op, key_set, to_low: bool):
    backend = torch._C._get_privateuse1_backend_name()

    def cast(a):
        if isinstance(a, torch.Tensor) and a.dtype in _ELIGIBLE:
            want = torch.get_autocast_dtype(backend) if to_low else torch.float32
            return a if a.dtype == want else a.to(want)
        if isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
            return type(a)(cast(t) for t in a)
        return a

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(key_set):
            return op(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
    return kernel


def install() -> None:
    """Register the policy (once) and tell torch which dtypes autocast accepts here."""
    if _libs:
        return
    backend = torch._C._get_privateuse1_backend_name()
    module = getattr(torch, backend, None)
    if module is None:
        return
    if not hasattr(module, "get_amp_supported_dtype"):
        module.get_amp_supported_dtype = lambda: [torch.bfloat16, torch.float16]
    key = torch._C.DispatchKey.AutocastPrivateUse1
    key_set = torch._C.DispatchKeySet(key)
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    _libs.extend([fallthrough, lib])
    for names, to_low in ((LOWER_PRECISION, True), (FLOAT32, False)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if any(a.alias_info is not None and a.alias_info.is_write
                       for a in op._schema.arguments):
                    continue  # out= and in-place variants keep their tensors' dtypes
                qualified = name if overload == "default" else f"{name}.{overload}"
                try:
                    lib.impl(qualified, _kernel(op, key_set, to_low), "AutocastPrivateUse1")
                except RuntimeError:
                    pass  # already has an autocast kernel for this key


install()
