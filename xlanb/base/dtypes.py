"""torch <-> JAX/numpy dtype tables and host transfers that keep torch's dtypes."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.float64: np.dtype(np.float64),
    torch.float32: np.dtype(np.float32),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.int64: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
    torch.int16: np.dtype(np.int16),
    torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
NUMPY_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_NUMPY.items()}
# complex32 (torch.chalf) has no XLA type: the device holds it as complex64 whose two
# parts are float16 values (ops/infos.py rounds every complex32 result), and it crosses
# to the host as complex64, converted there (reads convert to the tensor's dtype)
HELD_AS: dict[torch.dtype, np.dtype] = {torch.complex32: np.dtype(np.complex64)}


class UnsupportedDtypeError(TypeError):
    """A torch dtype the xla device cannot hold (float8 types, for one)."""


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy/JAX dtype for a torch dtype (JAX accepts numpy dtypes)."""
    try:
        return TORCH_TO_NUMPY[dtype]
    except KeyError:
        if dtype in HELD_AS:
            return HELD_AS[dtype]
        raise UnsupportedDtypeError(
            f"xlanb: dtype {dtype} is not supported on the xla device") from None


def to_torch_dtype(dtype) -> torch.dtype:
    return NUMPY_TO_TORCH[np.dtype(dtype)]


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array of the same dtype (bfloat16 via ml_dtypes)."""
    t = t.detach()
    if t.dtype in HELD_AS:
        t = t.to(to_torch_dtype(HELD_AS[t.dtype]))
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


def numpy_to_tensor(a: np.ndarray) -> torch.Tensor:
    """A numpy array as a CPU tensor of the same dtype; copies so torch owns it."""
    a = np.asarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.array(a.view(np.int16))).view(torch.bfloat16)
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a)
    return torch.from_numpy(a)
