"""Process-global numerics options, and the context manager that scopes them.

DeepGEMM keeps its runtime settings in process-global singletons; so do we.  The numerics
options here are this package's own (they have no DeepGEMM counterpart) and never change a
public signature: they choose how the emulator rounds where the real library's behaviour
depends on the device, the torch version or the accumulator hardware.

:func:`deepgemm_ref.settings.numerics` scopes these options together with the arch profile and
the runtime settings (``deepgemm_ref.numerics`` is that function).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from ._state import Setting
from .errors import DGArgumentError

__all__ = [
    "Limited",
    "NumericsOptions",
    "get_numerics",
    "set_numerics",
    "reset_numerics",
    "restore_numerics",
    "AccumulationModel",
]


@dataclass(frozen=True)
class Limited:
    """A tensor-core-like accumulator: ``limited(mantissa_bits, promotion_interval)``.

    Within each group of 32 products (in K order) every term, the running partial sum
    included, is aligned to the group's largest exponent and truncated toward zero to
    ``mantissa_bits`` bits below it; every ``promotion_interval`` elements of K the partial
    sum is promoted into a float32 accumulator.  Hopper FP8 keeps about 13-14 bits.
    """

    mantissa_bits: int
    promotion_interval: int

    def __post_init__(self) -> None:
        if not 1 <= self.mantissa_bits <= 52:
            raise DGArgumentError(f"limited: mantissa_bits: expected 1..52; got {self.mantissa_bits}")
        if self.promotion_interval <= 0 or self.promotion_interval % 32:
            raise DGArgumentError(
                f"limited: promotion_interval: expected a positive multiple of 32; got {self.promotion_interval}"
            )

    def __str__(self) -> str:
        return f"limited({self.mantissa_bits}, {self.promotion_interval})"


AccumulationModel = Literal["exact", "fp32"] | Limited


def parse_accumulation(value: Any) -> AccumulationModel:
    """Accept ``"exact"``, ``"fp32"``, a :class:`Limited`, or the string ``"limited(13, 128)"``."""
    if isinstance(value, Limited) or value in ("exact", "fp32"):
        return value  # type: ignore[no-any-return,unused-ignore]
    if isinstance(value, str) and value.startswith("limited(") and value.endswith(")"):
        parts = value[len("limited("):-1].split(",")
        if len(parts) == 2:
            try:
                return Limited(int(parts[0]), int(parts[1]))
            except ValueError:
                pass
    raise DGArgumentError(
        f"numerics: accumulation: expected 'exact', 'fp32' or limited(mantissa_bits, promotion_interval); got {value!r}"
    )


@dataclass(frozen=True)
class NumericsOptions:
    """The emulator's numerics options.

    accumulation:   ``"exact"`` (default: golden values), ``"fp32"`` or ``Limited(bits, interval)``.
    scale_division: how DeepGEMM's utilities evaluate ``amax / 448.0`` (and ``/ 6.0``):
                    ``"cuda"`` (default) multiplies by float32(1/448), as PyTorch does on CUDA
                    tensors, which is what DeepGEMM's own tests see; ``"cpu"`` divides (IEEE),
                    as PyTorch does on CPU tensors.  Only non-UE8M0 scales can differ.
    e4m3_overflow:  float32 -> E4M3 overflow in the utilities: ``"saturate"`` (torch >= 2.12,
                    the default) or ``"nan"`` (torch <= 2.11 and ml_dtypes).
    """

    accumulation: AccumulationModel = "exact"
    scale_division: Literal["cuda", "cpu"] = "cuda"
    e4m3_overflow: Literal["saturate", "nan"] = "saturate"

    def validated(self) -> NumericsOptions:
        acc = parse_accumulation(self.accumulation)
        if self.scale_division not in ("cuda", "cpu"):
            raise DGArgumentError(f"numerics: scale_division: expected 'cuda' or 'cpu'; got {self.scale_division!r}")
        if self.e4m3_overflow not in ("saturate", "nan"):
            raise DGArgumentError(f"numerics: e4m3_overflow: expected 'saturate' or 'nan'; got {self.e4m3_overflow!r}")
        return replace(self, accumulation=acc)


_options: Setting[NumericsOptions] = Setting("numerics", NumericsOptions())


def get_numerics() -> NumericsOptions:
    """The current numerics options."""
    return _options.get()


def set_numerics(**changes: Any) -> NumericsOptions:
    """Change numerics options process-wide (validated first); returns the new options."""
    unknown = set(changes) - set(NumericsOptions.__dataclass_fields__)
    if unknown:
        raise DGArgumentError(
            f"set_numerics: unknown option(s) {sorted(unknown)}; expected some of "
            f"{sorted(NumericsOptions.__dataclass_fields__)}"
        )
    return _options.update(lambda current: replace(current, **changes).validated())


def reset_numerics() -> None:
    """Back to the defaults."""
    _options.reset()


def restore_numerics(options: NumericsOptions) -> None:
    """Put back options saved with :func:`get_numerics`."""
    _options.set(options)
