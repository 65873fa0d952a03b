"""DeepGEMM-Ascend's epilogue classes (``deep_gemm.epilogue``), as objects the kernels accept.

* ``Identity()``: plain store (the behaviour when neither ``epilogue`` nor ``alpha`` is given).
* ``Alpha(alpha)``: the float32 accumulator is multiplied by ``alpha`` before the output cast or
  accumulation; the ``alpha=`` keyword of the dense GEMMs is a shortcut for it.
* ``FP8Quantization(sfd)``: E4M3 output plus per-32-column UE8M0 scales packed two per int16
  into ``sfd`` (M, B * N / 64), MN-major; only the batched FP8 path accepts it.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import DGArgumentError

__all__ = ["Epilogue", "Identity", "Alpha", "FP8Quantization"]


class Epilogue:
    """Abstract base of the epilogue objects (not constructible, as in DeepGEMM-Ascend)."""

    def __init__(self) -> None:
        if type(self) is Epilogue:
            raise DGArgumentError("Epilogue: abstract base class; use Identity(), Alpha(alpha) or FP8Quantization(sfd)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Identity(Epilogue):
    """Plain store of the accumulator (cast to the output dtype, or added to ``c``)."""


class Alpha(Epilogue):
    """Multiply the float32 accumulator by ``alpha`` (a float32 value) before the output step."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(float(alpha)):
            raise DGArgumentError(f"Alpha: alpha: expected a finite float; got {alpha!r}")
        if abs(float(alpha)) >= float.fromhex("0x1.ffffffp127"):  # rounds to inf in float32
            raise DGArgumentError(f"Alpha: alpha: expected a finite float32 value; got {alpha!r}")
        self.alpha = float(alpha)

    def __repr__(self) -> str:
        return f"Alpha({self.alpha!r})"


class FP8Quantization(Epilogue):
    """E4M3 output with per-32-column UE8M0 scales written into ``sfd`` (int16 packed pairs)."""

    def __init__(self, sfd: Any) -> None:
        super().__init__()
        if sfd is None:
            raise DGArgumentError("FP8Quantization: sfd: expected an int16 scale tensor; got None")
        self.sfd = sfd

    def __repr__(self) -> str:
        return f"FP8Quantization(sfd={getattr(self.sfd, 'shape', '?')})"
