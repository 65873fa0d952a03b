"""How a case's input values are drawn: the ``values`` key of a case specification.

``"normal"`` (the default) draws inputs the way DeepGEMM's test generators do: standard-normal
bf16 data, then DeepGEMM's quantisers (``families``, ``moe``).  The two other modes keep every
structural draw of the builder (group sizes, layouts, context lengths, block tables, routing
ranks) and change the values only, so a case stays a valid call of its kernel:

``"adversarial"``
    The builder's standard-normal draws come from :class:`AdversarialGenerator`: each row (every
    axis but the last) follows one regime (:data:`ADVERSARIAL_REGIMES`, with its share of the
    rows): standard normal; small integers in [-8, 8] (exact in bf16 and E4M3: accumulators land
    on rounding ties of the bf16 output); cancelling pairs (``x[2j + 1] = -x[2j]``, exactly
    zero sums against duplicated pairs); duplicated pairs; a row scaled by ``2^e``, ``e`` in
    [-24, 24]; signed powers of two ``2^e``, ``e`` in [-24, 24] per element (absorption, float32
    ties); a zero row; a huge row scaled by 2^60 to 2^63 (two of them meet next to the float32 /
    bf16 saturation bound, or past it); and a tiny row scaled by 2^-75 to 2^-60 (two of them
    give subnormal results).  DeepGEMM's
    quantisers then turn them into codes and scales (each row's amax maps to E4M3's saturation
    bound 448, or next to it under UE8M0).  After the build, :func:`perturb_scales` moves every
    scale factor (``*_sf`` tensors: float32, packed UE8M0 int32, int16 UE8M0 pairs) by a power
    of two: half of them stay, 15 in 32 move by 2^d with d in [-8, 8], and 1 in 32 jumps to
    anywhere in [2^-126, 2^73] (UE8M0 bytes 1 to 200; byte 0, read as 2^-127 by DeepGEMM and as
    0 by CANN, is left to the probes; higher jumps would overflow every output that a scale
    touches, and DeepGEMM-Ascend refuses FP4 weight scales above 2^121).
``"special"``
    Normal values, then :func:`inject_specials` puts NaN, +inf, -inf or -0.0 at one or two non-zero
    positions of every data operand that can hold them (bf16, float32 and E4M3 tensors that are
    not scale factors; E4M3 holds NaN and -0 only; packed FP4 and integer tensors hold none).
    Zero elements are left alone: they are the padding rows and gaps the layouts leave, which
    the kernels' contracts need to be zero.

Everything is drawn from the case's own generator, so a specification (id, seed, keys,
``values``) regenerates the same bytes: ``golden --spec`` reproduces a property-test case.

What a value is keyed by (the ``value_draw`` key, :data:`VALUE_DRAWS`): ``"stream"`` (the
default, every preset) draws all of a case's values from one generator seeded by the seed and
the case id, in the builder's order, so a value depends on the shape (the id names it) and on
everything drawn before it.  ``"position"`` (what :mod:`deepgemm_ref.strategies` draws) keys
each value by the seed, the builder's n-th draw and the element's position: row ``r`` of a draw
(every axis but the last) is the start of its own stream, so element (i, k) is the same at any
shape that holds it (:class:`PositionalGenerator`), and ``row_offsets`` shifts a draw's rows
(row i is row ``row_offsets[n] + i``) so a shrinker can drop an operand's leading rows.  The
structural draws (group sizes, context lengths, block tables) come from a stream seeded by the
seed alone; the adversarial regimes use the same shares, the scale moves and (``"special"``)
the special values are keyed by their position in the stored tensor, each non-zero data
element becoming special with probability :data:`SPECIAL_SHARE` (:func:`apply_value_mode_at`).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["VALUE_MODES", "ADVERSARIAL_REGIMES", "AdversarialGenerator", "generator_for", "perturb_scales",
           "inject_specials", "apply_value_mode", "is_scale_name", "VALUE_DRAWS", "SPECIAL_SHARE",
           "PositionalGenerator", "positional_normal", "positional_words", "apply_value_mode_at",
           "MAX_ROW_OFFSETS", "ROW_OFFSET_BOUND"]

#: The value modes a specification's ``values`` key takes (the first is the default).
VALUE_MODES = ("normal", "adversarial", "special")

_BF16 = np.dtype(ml_dtypes.bfloat16)
_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_F32 = np.dtype(np.float32)
_SCALE_NAME = re.compile(r"_sf(\.\d+)?$")
#: The row regimes of :class:`AdversarialGenerator` and their shares of the rows.
ADVERSARIAL_REGIMES = {"normal": 0.20, "small integers": 0.15, "cancelling pairs": 0.10, "duplicated pairs": 0.10,
                       "scaled 2^-24..2^24": 0.15, "powers of two": 0.15, "zero": 0.05, "huge 2^60..2^63": 0.05,
                       "tiny 2^-75..2^-60": 0.05}
_REGIME_CUTS = np.cumsum(list(ADVERSARIAL_REGIMES.values()))[:-1]


def is_scale_name(name: str) -> bool:
    """Whether an input tensor holds scale factors (``a_sf``, ``x_sf.0``, ``shared_l1_sf``)."""
    return bool(_SCALE_NAME.search(name))


class AdversarialGenerator(np.random.Generator):
    """A NumPy generator whose ``standard_normal`` draws adversarial rows (module docstring);
    every other draw (integers, uniform, permutation, random) is the plain generator's."""

    def standard_normal(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Any:
        if out is not None:  # pragma: no cover - the builders never pass out
            raise TypeError("AdversarialGenerator.standard_normal: out= is not supported")
        shape = () if size is None else ((size,) if isinstance(size, (int, np.integer)) else tuple(size))
        base = super().standard_normal(shape, dtype=np.float32)
        x = np.asarray(base, np.float32).reshape(-1, shape[-1] if shape else 1).copy()
        rows, length = x.shape
        regime = np.searchsorted(_REGIME_CUTS, self.random(rows), side="right")
        small = self.integers(-8, 9, size=x.shape).astype(np.float32)
        pow2 = np.ldexp(np.float32(1), self.integers(-24, 25, size=x.shape)).astype(np.float32)
        sign = np.where(self.random(x.shape) < 0.5, np.float32(-1), np.float32(1))
        row_exp = np.select([regime == 7, regime == 8], [self.integers(60, 64, size=rows),
                                                          self.integers(-75, -59, size=rows)],
                            self.integers(-24, 25, size=rows))
        out_arr = _adversarial_rows(x, regime, small, pow2, sign, row_exp).reshape(shape)
        return out_arr.astype(dtype) if np.dtype(dtype) != _F32 else out_arr


def _adversarial_rows(x: np.ndarray, regime: np.ndarray, small: np.ndarray, pow2: np.ndarray, sign: np.ndarray,
                      row_exp: np.ndarray) -> np.ndarray:
    """Rows ``x`` (float32 (rows, length), changed in place) turned into their regimes' values:
    ``regime`` (rows,) indices of :data:`ADVERSARIAL_REGIMES`, ``small`` / ``pow2`` / ``sign``
    (rows, length) per-element draws, ``row_exp`` (rows,) the scaled regimes' exponents."""
    length = x.shape[1]
    pairs = slice(0, length - length % 2, 2)
    x[regime == 1] = small[regime == 1]
    x[regime == 2, 1::2] = -x[regime == 2, pairs]
    x[regime == 3, 1::2] = x[regime == 3, pairs]
    scaled = (regime == 4) | (regime >= 7)
    x[scaled] = np.ldexp(x[scaled], row_exp[scaled, None]).astype(np.float32)
    x[regime == 5] = (sign * pow2)[regime == 5]
    x[regime == 6] = 0
    return x


def generator_for(rng: np.random.Generator, mode: str) -> np.random.Generator:
    """The generator a builder draws from under ``mode`` (same bit generator, same state)."""
    if mode == "adversarial":
        return AdversarialGenerator(rng.bit_generator)
    return rng


#: The largest UE8M0 byte a scale jumps to (2^73; see the module docstring).
_MAX_JUMP = 200
#: The largest byte a scale is moved to at all: DeepGEMM-Ascend refuses FP4 weight scales above
#: 2^121 (exponent byte 248; ``transform_weights_for_mega_moe``).
_MAX_BYTE = 248


def _moved_bytes(rng: np.random.Generator, by: np.ndarray) -> np.ndarray:
    """UE8M0 exponent bytes (int64) after the move: unchanged (half), a step in [-8, 8] (15 in
    32), anywhere in [1, 200] (1 in 32); bytes outside [1, 248] (zero scales, NaN) stay."""
    pick = rng.random(by.shape)
    near = np.clip(by + rng.integers(-8, 9, size=by.shape), 1, _MAX_BYTE)
    far = rng.integers(1, _MAX_JUMP + 1, size=by.shape)
    moved = np.where(pick < 0.5, by, np.where(pick < 31 / 32, near, far))
    return np.where((by >= 1) & (by <= _MAX_BYTE), moved, by)


def perturb_scales(inputs: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every scale-factor tensor multiplied element-wise by powers of two, staying in the normal
    UE8M0 range (bytes 1 to 248); zero, NaN and out-of-range scales are left as they are (see
    the module docstring)."""
    out = dict(inputs)
    for name in sorted(inputs):
        x = inputs[name]
        if not is_scale_name(name) or x.size == 0:
            continue
        if x.dtype == _F32:  # the float32 exponent field is the UE8M0 byte of a power of two
            bits = np.ascontiguousarray(x).view(np.uint32)
            exp = ((bits >> 23) & 0xFF).astype(np.int64)
            new_exp = _moved_bytes(rng, exp).astype(np.uint32)
            out[name] = ((bits & np.uint32(0x807FFFFF)) | (new_exp << np.uint32(23))).view(np.float32)
        elif x.dtype in (np.dtype(np.int32), np.dtype(np.int16)):  # packed UE8M0 bytes
            by = np.ascontiguousarray(x).view(np.uint8)
            out[name] = _moved_bytes(rng, by.astype(np.int64)).astype(np.uint8).view(x.dtype).reshape(x.shape)
    return out


# Special values each data dtype can hold: (NaN, +inf, -inf, -0.0) or a subset.
_SPECIALS: dict[np.dtype, tuple[float, ...]] = {
    _BF16: (np.nan, np.inf, -np.inf, -0.0),
    _F32: (np.nan, np.inf, -np.inf, -0.0),
    _E4M3: (np.nan, -0.0),
}


def inject_specials(inputs: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """NaN / infinities / -0.0 at one or two non-zero positions of every data operand whose dtype
    holds them (bf16, float32, E4M3; not scale factors, not packed or integer tensors)."""
    out = dict(inputs)
    for name in sorted(inputs):
        x = inputs[name]
        specials = _SPECIALS.get(x.dtype)
        if specials is None or is_scale_name(name) or x.size == 0:
            continue
        flat = np.array(x, copy=True).reshape(-1)
        nonzero = np.flatnonzero(flat.astype(np.float32) != 0)
        if nonzero.size == 0:
            continue
        count = int(rng.integers(1, 3))
        where = rng.choice(nonzero, size=min(count, nonzero.size), replace=False)
        kinds = rng.integers(0, len(specials), size=where.size)
        flat[np.sort(where)] = np.array([specials[int(k)] for k in kinds], np.float32).astype(x.dtype)
        out[name] = flat.reshape(x.shape)
    return out


def apply_value_mode(inputs: Mapping[str, np.ndarray], rng: np.random.Generator, mode: str) -> dict[str, np.ndarray]:
    """The finishing step of ``mode`` on a built case's inputs (drawn from the case's generator)."""
    if mode == "adversarial":
        return perturb_scales(inputs, rng)
    if mode == "special":
        return inject_specials(inputs, rng)
    return dict(inputs)


# ----------------------------------------------------------------------------------------------
# value_draw = "position": every value keyed by the seed and its position
# ----------------------------------------------------------------------------------------------

#: The ``value_draw`` key's choices (the first is the default): ``"stream"`` draws every value of a
#: case from one generator seeded by the seed and the case id, in the builder's order (a value
#: depends on everything drawn before it); ``"position"`` draws each value from a stream keyed
#: by the seed, the builder's draw and the value's position, so the element at (i, k) of an
#: operand is the same whatever the shape (property tests shrink to the rows that fail).
VALUE_DRAWS = ("stream", "position")
#: The most entries of a ``row_offsets`` list and the bound of each (see :class:`PositionalGenerator`).
MAX_ROW_OFFSETS = 16
ROW_OFFSET_BOUND = 2**31

# SeedSequence spawn keys of the positional streams: (_TAG, kind, draw, ndim, *row index).
_TAG = 0x5053_4844  # "DHSP"
_STRUCTURE, _NORMAL, _ADVERSARIAL, _SCALES, _SPECIALS_KIND = range(5)
#: Under value_draw = "position", the share of the non-zero elements of a data operand that
#: ``"special"`` values replace (each element on its own draw).
SPECIAL_SHARE = 1 / 256


def _row_stream(seed: int, kind: int, draw: int, index: tuple[int, ...]) -> np.random.PCG64:
    seq = np.random.SeedSequence(seed, spawn_key=(_TAG, kind, draw, len(index), *index))
    return np.random.PCG64(seq)


def _shape(size: Any) -> tuple[int, ...]:
    return () if size is None else ((int(size),) if isinstance(size, (int, np.integer)) else tuple(map(int, size)))


def _shifted(index: tuple[int, ...], first: int) -> tuple[int, ...]:
    return (index[0] + first, *index[1:]) if index else index


def positional_normal(seed: int, draw: int, shape: tuple[int, ...], first: int = 0) -> np.ndarray:
    """float32 standard-normal values of ``shape``: row ``r`` (every axis but the last) is the
    start of its own stream ``SeedSequence(seed, spawn_key=(tag, 1, draw, ndim - 1, *r))``, so
    element ``(*r, j)`` does not depend on the shape (only on ``r`` and ``j``); ``first`` is
    added to the leading index of ``r``."""
    lead, length = (shape[:-1], shape[-1]) if shape else ((), 1)
    out = np.empty((int(np.prod(lead, dtype=np.int64)), length), np.float32)
    if length:
        for row, index in enumerate(np.ndindex(*lead)):
            out[row] = np.random.Generator(_row_stream(seed, _NORMAL, draw, _shifted(index, first))).standard_normal(
                length, dtype=np.float32)
    return out.reshape(shape)


def positional_words(seed: int, kind: int, draw: int, shape: tuple[int, ...], per_row: int,
                     per_element: int, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Raw uint64 words of the row streams of ``shape`` (as :func:`positional_normal`, on stream
    ``kind``): (rows, per_row) words for each row, then (rows, length, per_element) words for
    its elements in order (element ``j``'s words do not depend on the row's length)."""
    lead, length = (shape[:-1], shape[-1]) if shape else ((), 1)
    rows = int(np.prod(lead, dtype=np.int64))
    row_words = np.empty((rows, per_row), np.uint64)
    elem_words = np.empty((rows, length, per_element), np.uint64)
    for row, index in enumerate(np.ndindex(*lead)):
        raw = _row_stream(seed, kind, draw, _shifted(index, first)).random_raw(per_row + length * per_element)
        row_words[row] = raw[:per_row]
        elem_words[row] = raw[per_row:].reshape(length, per_element)
    return row_words, elem_words


def _uniform(w: np.ndarray) -> np.ndarray:
    """Words -> float64 in [0, 1) (their top 53 bits)."""
    return (w >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _below(w: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Words -> int64 in [lo, hi) (the top 32 bits times the range, integer arithmetic)."""
    return ((w >> np.uint64(32)) * np.uint64(hi - lo) >> np.uint64(32)).astype(np.int64) + lo


class PositionalGenerator(np.random.Generator):
    """The generator a builder draws from under ``value_draw = "position"``.

    ``standard_normal`` (every data tensor of the builders) gives :func:`positional_normal`
    values of the builder's n-th draw, and under ``mode == "adversarial"`` turns each row into
    its regime (:class:`AdversarialGenerator`'s regimes and shares) with the row's and the
    elements' draws taken from their positional words; every other draw (group sizes, context
    lengths, block tables, routing) comes from one stream seeded by the seed alone
    (``SeedSequence(seed, spawn_key=(tag, 0))``, not the case id: the id names the shape, which
    a property test shrinks).  ``row_offsets`` (the spec key of that name): row ``i`` of the
    leading axis of the n-th draw (of 2 or more axes) is row ``row_offsets[n] + i`` of its
    positional streams (0 past the list's end), which lets a shrinker drop the leading rows of
    an operand without changing the others.
    """

    def __init__(self, seed: int, mode: str, row_offsets: tuple[int, ...] = ()) -> None:
        super().__init__(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(_TAG, _STRUCTURE))))
        self.seed = int(seed)
        self.mode = mode
        self.row_offsets = tuple(int(o) for o in row_offsets)
        self.draws = 0

    def standard_normal(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Any:
        if out is not None:  # pragma: no cover - the builders never pass out
            raise TypeError("PositionalGenerator.standard_normal: out= is not supported")
        shape = _shape(size)
        draw, self.draws = self.draws, self.draws + 1
        first = self.row_offsets[draw] if draw < len(self.row_offsets) and len(shape) >= 2 else 0
        x = positional_normal(self.seed, draw, shape, first).reshape(-1, shape[-1] if shape else 1).copy()
        if self.mode == "adversarial" and x.size:
            row_w, elem_w = positional_words(self.seed, _ADVERSARIAL, draw, shape, 2, 3, first)
            regime = np.searchsorted(_REGIME_CUTS, _uniform(row_w[:, 0]), side="right")
            row_exp = np.select([regime == 7, regime == 8], [_below(row_w[:, 1], 60, 64),
                                                              _below(row_w[:, 1], -75, -59)],
                                _below(row_w[:, 1], -24, 25))
            small = _below(elem_w[..., 0], -8, 9).astype(np.float32)
            pow2 = np.ldexp(np.float32(1), _below(elem_w[..., 1], -24, 25)).astype(np.float32)
            sign = np.where(_uniform(elem_w[..., 2]) < 0.5, np.float32(-1), np.float32(1))
            x = _adversarial_rows(x, regime, small, pow2, sign, row_exp)
        out_arr = x.reshape(shape)
        return out_arr.astype(dtype) if np.dtype(dtype) != _F32 else out_arr


def _name_key(name: str) -> int:
    return zlib.crc32(name.encode())


def _moved_bytes_at(seed: int, name: str, by: np.ndarray) -> np.ndarray:
    """:func:`_moved_bytes` with each byte's draws keyed by its position in tensor ``name``."""
    _, w = positional_words(seed, _SCALES, _name_key(name), by.shape, 0, 3)
    w = w.reshape(*by.shape, 3)
    pick = _uniform(w[..., 0])
    near = np.clip(by + _below(w[..., 1], -8, 9), 1, _MAX_BYTE)
    far = _below(w[..., 2], 1, _MAX_JUMP + 1)
    moved = np.where(pick < 0.5, by, np.where(pick < 31 / 32, near, far))
    return np.where((by >= 1) & (by <= _MAX_BYTE), moved, by)


def apply_value_mode_at(inputs: Mapping[str, np.ndarray], seed: int, mode: str) -> dict[str, np.ndarray]:
    """:func:`apply_value_mode` under ``value_draw = "position"``: every draw keyed by the seed,
    the tensor's name and the element's position in the stored tensor.  ``"adversarial"`` moves
    the scale factors as :func:`perturb_scales` does; ``"special"`` replaces each non-zero
    element of a data operand that can hold them, on its own draw with probability
    :data:`SPECIAL_SHARE`, by one of its dtype's special values."""
    out = dict(inputs)
    for name in sorted(inputs):
        x = inputs[name]
        if x.size == 0:
            continue
        if mode == "adversarial" and is_scale_name(name):
            if x.dtype == _F32:
                bits = np.ascontiguousarray(x).view(np.uint32)
                exp = ((bits >> 23) & 0xFF).astype(np.int64)
                new_exp = _moved_bytes_at(seed, name, exp).astype(np.uint32)
                out[name] = ((bits & np.uint32(0x807FFFFF)) | (new_exp << np.uint32(23))).view(np.float32)
            elif x.dtype in (np.dtype(np.int32), np.dtype(np.int16)):
                by = np.ascontiguousarray(x).view(np.uint8)
                out[name] = _moved_bytes_at(seed, name, by.astype(np.int64)).astype(np.uint8).view(
                    x.dtype).reshape(x.shape)
        elif mode == "special" and not is_scale_name(name) and x.dtype in _SPECIALS:
            specials = np.array(_SPECIALS[x.dtype], np.float32).astype(x.dtype)
            _, w = positional_words(seed, _SPECIALS_KIND, _name_key(name), x.shape, 0, 2)
            w = w.reshape(*x.shape, 2)
            hit = (_uniform(w[..., 0]) < SPECIAL_SHARE) & (np.asarray(x).astype(np.float32) != 0)
            if hit.any():
                y = np.array(x, copy=True)
                y[hit] = specials[_below(w[..., 1], 0, len(specials))[hit]]
                out[name] = y
    return out
