"""The NumPy dtypes of the arrays the kernels take, as constants (ml_dtypes for the narrow ones).

``E4M3`` (float8_e4m3fn) and ``I8`` (int8, packed FP4 where a kernel takes FP4) operands,
``BF16`` / ``F32`` outputs, ``U8`` (packed FP4 bytes, UE8M0 bytes), ``I16`` (DeepGEMM-Ascend's
UE8M0 pairs) and ``I32`` (DeepGEMM's packed UE8M0 words, layouts).  The arch profiles name them
in their kernel rules and the argument checks compare against them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["E4M3", "BF16", "F32", "I8", "U8", "I16", "I32", "dtype_name"]

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
I8 = np.dtype(np.int8)
U8 = np.dtype(np.uint8)
I16 = np.dtype(np.int16)
I32 = np.dtype(np.int32)

_DTYPE_NAMES = {E4M3: "float8_e4m3fn", I8: "int8 (packed FP4)", BF16: "bfloat16"}


def dtype_name(t: np.dtype) -> str:
    """How error messages name a dtype (int8 operands are packed FP4)."""
    return _DTYPE_NAMES.get(t, str(t))
