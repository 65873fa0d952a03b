"""Golden cases: specifications, the family registry and input generation.

A *case specification* is a flat JSON/TOML table: ``id``, ``kernel`` (a public function name),
``profile``, ``seed`` and the kernel family's keys (shapes, formats, recipe, output dtype, ``c``,
``alpha``, ...), checked against the family's schema (:mod:`.schema`) by :func:`validate_spec`.
Each family registers (:func:`register_family`) a builder that turns a validated specification
into

* the inputs, stored contiguous in the dtypes the kernel API takes (user-form scales),
* the exact call (function, argument list, keyword values, which tensors are outputs),
* the layout transform each input needs before a device call, and
* the checker parameters (epilogue, rounding-path length ``n``),

together with its schema, a resource estimate, the helper functions its manifests may call, and
where the call is more than one function call (Mega MoE) a driver and a finish hook.

Inputs are generated as DeepGEMM's test generators generate them (``tests/generators.py``:
seeded standard-normal bf16 matrices, then DeepGEMM's quantisers), with a NumPy generator seeded
by ``SeedSequence(seed, spawn_key=(crc32(case id),))``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .._memory import limit_allocations
from ..errors import DGArgumentError, arg_error
from ..profiles import PROFILES
from .emulator import emulator
from .resources import Estimate, ResourceError, default_memory_limit, format_size
from .schema import (
    COMMON_KEYS,
    MAX_ID_LENGTH,
    MAX_SEED,
    Params,
    Schema,
    SpecError,
    as_int,
    collect_params,
    did_you_mean,
    spec_error,
)
from .values import (
    MAX_ROW_OFFSETS,
    ROW_OFFSET_BOUND,
    VALUE_DRAWS,
    VALUE_MODES,
    PositionalGenerator,
    apply_value_mode,
    apply_value_mode_at,
    generator_for,
)

__all__ = ["CaseSpec", "BuiltCase", "ArgRef", "Family", "build_case", "FAMILIES", "register_family", "family_of",
           "family_for", "case_rng", "validate_spec", "case_file_name", "estimate_case", "SpecError"]

BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class CaseSpec:
    """One golden case.  ``params`` holds the family keys as given (in canonical form);
    ``resolved`` every key the case reads, defaults filled in (see :func:`validate_spec`)."""

    id: str
    kernel: str
    profile: str
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    values: Params | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def from_dict(d: Mapping[str, Any], source: str = "", index: int | None = None) -> CaseSpec:
        """Validate a specification table (raises :class:`SpecError`, see :func:`validate_spec`)."""
        return validate_spec(d, source, index)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kernel": self.kernel, "profile": self.profile, "seed": self.seed, **dict(self.params)}

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)

    @property
    def resolved(self) -> Params:
        """Every key the case reads (given or default)."""
        if self.values is not None:
            return self.values
        v = validate_spec(self.to_dict()).values
        assert v is not None
        return v

    @property
    def family(self) -> str:
        return family_for(self).name

    @property
    def value_mode(self) -> str:
        """How the inputs are drawn: the ``values`` key (``"normal"`` unless given; see :mod:`.values`)."""
        return str(self.params.get("values", VALUE_MODES[0]))

    @property
    def value_draw(self) -> str:
        """What a value is keyed by: the ``value_draw`` key (``"stream"`` unless given; see :mod:`.values`)."""
        return str(self.params.get("value_draw", VALUE_DRAWS[0]))

    @property
    def row_offsets(self) -> tuple[int, ...]:
        """The ``row_offsets`` key (empty unless given; see :class:`.values.PositionalGenerator`)."""
        return tuple(int(o) for o in self.params.get("row_offsets", ()))

    def shape(self) -> dict[str, Any]:
        """The case's real shape (the resolved shape keys of its family)."""
        fam = family_for(self)
        return fam.schema.shape_keys(self.resolved) if fam.schema is not None else {}


@dataclass
class ArgRef:
    """One argument of the recorded call: a stored tensor, a (data, sf) pair, an output, or a value."""

    kind: str  # "tensor", "pair", "output", "value"
    names: tuple[str | None, ...] = ()
    value: Any = None

    def to_json(self) -> dict[str, Any]:
        if self.kind == "value":
            return {"value": self.value}
        if self.kind == "pair":
            return {"pair": list(self.names)}
        return {self.kind: self.names[0]}

    @staticmethod
    def from_json(j: Mapping[str, Any]) -> ArgRef:
        if not isinstance(j, Mapping) or len(j) != 1:
            raise DGArgumentError(f"manifest: an argument reference is a table with one key; got {j!r}")
        if "value" in j:
            return ArgRef("value", (), j["value"])
        if "pair" in j:
            pair = j["pair"]
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                    and (pair[1] is None or isinstance(pair[1], str))):
                raise DGArgumentError(f"manifest: pair: expected [tensor name, tensor name or null]; got {pair!r}")
            return ArgRef("pair", tuple(pair))
        for kind in ("tensor", "output"):
            if kind in j:
                if not isinstance(j[kind], str):
                    raise DGArgumentError(f"manifest: {kind}: expected a name; got {j[kind]!r}")
                return ArgRef(kind, (j[kind],))
        raise DGArgumentError(f"manifest: unknown argument reference {dict(j)!r}")


@dataclass
class BuiltCase:
    """A generated case, before the golden computation."""

    spec: CaseSpec
    inputs: dict[str, np.ndarray]  # stored tensors (contiguous), by name
    function: str
    args: list[ArgRef]
    kwargs: dict[str, ArgRef]
    outputs: dict[str, dict[str, Any]]  # output name -> {"init": input name or "zeros", "shape", "dtype"}
    transforms: dict[str, dict[str, Any]] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)
    # Calls made before the kernel: ``setup`` (runtime settings, e.g. the contiguous-layout
    # alignment) and ``derived`` inputs computed by the library itself, in order (e.g. the
    # paged-MQA schedule): [{"name", "function", "args": [ArgRef json], "kwargs": {...}}].
    setup: list[dict[str, Any]] = field(default_factory=list)
    derived: list[dict[str, Any]] = field(default_factory=list)
    # The output that is the kernel's return value (MQA logits), if any.
    returns: str | None = None
    # A driver that makes the call instead of ``function(*args, **kwargs)`` (Mega MoE: buffers and
    # weight transforms on every rank): {"name": the family's driver name, ...its parameters}.
    driver: dict[str, Any] | None = None


Builder = Callable[[CaseSpec, np.random.Generator], BuiltCase]
#: driver(module, manifest entry, tensors, outputs): makes the case's call with ``module``.
Driver = Callable[[Any, dict[str, Any], dict[str, Any], dict[str, Any]], None]
#: finish(golden tensors, trace records, inputs) -> golden stats: turns a driver's trace records
#: into the case's golden tensors (``acc``, ``S``, ``defined``, ...).
Finish = Callable[[dict[str, np.ndarray], list[Any], dict[str, np.ndarray]], dict[str, Any]]
#: compute(manifest entry, inputs, outputs) -> (golden tensors, stats): the goldens of a family whose
#: goldens come from a pure model of the call rather than from its trace records (DeepEP's dispatch
#: and combine: the ranks of its driver run in threads, which a trace capture does not follow).
Compute = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Mapping[str, Any]]],
                   tuple[dict[str, np.ndarray], dict[str, Any]]]
#: view(manifest entry, golden tensors, device outputs or None) -> check.CheckView: how the checker
#: sees a family's outputs (a device's own row order put into the canonical one, per-output
#: defined masks, bitwise or bounded comparison).
View = Callable[[Mapping[str, Any], Mapping[str, np.ndarray], Mapping[str, Any] | None], Any]
#: compute_rank(manifest entry, inputs, outputs, rank) -> (rank ``rank``'s golden rows by name, JSON info):
#: one rank's part of a :data:`Compute` family's goldens (every golden tensor of such a family is
#: stacked over the ranks, leading axis R), for generation with one process per rank.
ComputeRank = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Mapping[str, Any]], int],
                       tuple[dict[str, np.ndarray], dict[str, Any]]]
#: merge_ranks(manifest entry, every rank's rows (rank order), their infos, inputs, outputs) ->
#: (golden tensors, stats): what :data:`Compute` returns, from the ranks' :data:`ComputeRank` parts.
#: The range hook of a family: (manifest entry, golden tensors, inputs, output name) -> the
#: checker's :data:`deepgemm_ref.golden.check.RangeHook` for that output, or None (the output's
#: own ``S`` and ``acc`` say all: single-stage sums).
RangeFor = Callable[[Mapping[str, Any], Mapping[str, np.ndarray], Mapping[str, Any], str], Any]
MergeRanks = Callable[[Mapping[str, Any], list[dict[str, np.ndarray]], list[dict[str, Any]], Mapping[str, Any],
                       Mapping[str, Mapping[str, Any]]], tuple[dict[str, np.ndarray], dict[str, Any]]]


@dataclass(frozen=True)
class Family:
    """A kernel family's golden case support.

    build: the builder.  schema: its keys (None: parameters pass unchecked).  estimate: file,
    memory and work of a case from its resolved keys.  functions: the helper functions (setup,
    derived inputs, layout transforms) its manifests may call besides its kernels.  driver /
    finish: a call that is more than one function call, and its golden bookkeeping.
    check_entry: family-specific consistency checks of a manifest entry (returns a problem or
    None).  explicit: chosen only by a specification's ``family`` key.  compute: the goldens
    from a pure model (no trace capture; :data:`Compute`).  view: how the checker compares the
    family's outputs (:data:`View`; default: each output against its golden, element by element).
    range: where a correct accumulator can overflow beyond what an output's ``S`` and ``acc``
    show (multi-stage data flows, :data:`RangeFor`).
    ranked: the family's cases hold ``ranks`` expert-parallel ranks (the resolved key ``ranks``,
    the driver record's ``ranks``): they can run with one process per rank (generation's
    ``processes`` executor, replay under ``torchrun``).  A ranked family with ``compute`` gives
    ``compute_rank`` and ``merge_ranks`` (:data:`ComputeRank`, :data:`MergeRanks`); one with a
    driver and ``finish`` runs its driver for one rank (:mod:`.ranks`).
    row_split: the inputs of a built case that hold rows of its outputs, ``name -> axis`` (every
    golden tensor's leading axis is the main output's rows, and rows [r0, r1) of each are the
    goldens of those inputs' slices [r0, r1) along their axes, the other inputs whole), or None
    for a case that cannot be cut so: a case too large to hold whole is then computed and
    written in blocks of rows (:mod:`.rowblocks`, its estimate's ``row_block``).
    """

    name: str
    build: Builder
    schema: Schema | None = None
    estimate: Callable[[Params], Estimate] | None = None
    functions: frozenset[str] = frozenset()
    driver: Driver | None = None
    finish: Finish | None = None
    check_entry: Callable[[Mapping[str, Any]], str | None] | None = None
    explicit: bool = False
    compute: Compute | None = None
    view: View | None = None
    ranked: bool = False
    compute_rank: ComputeRank | None = None
    merge_ranks: MergeRanks | None = None
    range: RangeFor | None = None
    row_split: Callable[[BuiltCase], Mapping[str, int] | None] | None = None

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(self.schema.kernels) if self.schema is not None else ()

    def allows(self, function: str) -> bool:
        """Whether a manifest of this family may call ``function``."""
        return function in self.functions or function in self.kernels


FAMILIES: dict[str, Family] = {}


def register_family(name: str, builder: Builder, *, schema: Schema | None = None,
                    estimate: Callable[[Params], Estimate] | None = None, functions: tuple[str, ...] = (),
                    driver: Driver | None = None, finish: Finish | None = None,
                    check_entry: Callable[[Mapping[str, Any]], str | None] | None = None,
                    explicit: bool = False, compute: Compute | None = None, view: View | None = None,
                    ranked: bool = False, compute_rank: ComputeRank | None = None,
                    merge_ranks: MergeRanks | None = None, range: RangeFor | None = None,
                    row_split: Callable[[BuiltCase], Mapping[str, int] | None] | None = None) -> Family:
    """Make a kernel family available to specifications (see :class:`Family`)."""
    if ranked and compute is not None and (compute_rank is None or merge_ranks is None):
        raise arg_error("register_family", "ranked", "compute_rank and merge_ranks with compute (a ranked family)",
                        f"family {name!r} without them")
    if ranked and compute is None and (driver is None or finish is None):
        raise arg_error("register_family", "ranked", "a driver and finish without compute (a ranked family)",
                        f"family {name!r} without them")
    fam = Family(name, builder, schema, estimate, frozenset(functions), driver, finish, check_entry, explicit,
                 compute, view, ranked, compute_rank, merge_ranks, range, row_split)
    FAMILIES[name] = fam
    return fam


def _known_kernels() -> list[str]:
    return sorted({k for f in FAMILIES.values() for k in f.kernels})


def family_of(kernel: str) -> str:
    """The family of a public kernel name (the first registered family that builds it and is not
    chosen only explicitly)."""
    for fam in FAMILIES.values():
        if not fam.explicit and kernel in fam.kernels:
            return fam.name
    raise SpecError(_unknown_kernel(kernel))


def _unknown_kernel(kernel: str) -> str:
    known = _known_kernels()
    near = did_you_mean(kernel, known)
    hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else f" (kernels: {', '.join(known)})"
    if callable(getattr(emulator(), kernel, None)) and not kernel.startswith("_"):
        near_text = f"; near ones with a builder: {', '.join(near)}" if near else ""
        return (f"kernel: {kernel!r} has no golden case builder{near_text} (deepgemm-ref list -v and "
                "docs/case-specs.md list the kernels each family builds)")
    return f"kernel: unknown kernel {kernel!r}{hint}"


def family_for(spec: CaseSpec) -> Family:
    name = spec.params.get("family") or family_of(spec.kernel)
    if name not in FAMILIES:
        raise SpecError(f"case {spec.id!r}: family: unknown family {name!r} (families: {', '.join(FAMILIES)})")
    return FAMILIES[name]


def case_file_name(case_id: str) -> str:
    """The case's file name under ``cases/`` (without the suffix): letters, digits, ``-``, ``_``
    and ``.`` are kept, anything else becomes ``_``."""
    name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in case_id)
    if not name or name.startswith("."):
        raise SpecError(f"case {case_id!r}: key 'id': cannot name a file (empty, or starting with '.')")
    return name


def _check_id(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise SpecError(f"{where}: key 'id': expected a string; got {type(v).__name__} {v!r}"[:300])
    if not v:
        raise SpecError(f"{where}: key 'id': expected a non-empty string")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF for ch in v):
        raise SpecError(f"{where}: key 'id': control characters and lone surrogates are not allowed; got {v!r}"[:300])
    if len(v.encode("utf-8")) > MAX_ID_LENGTH:
        raise SpecError(f"{where}: key 'id': expected at most {MAX_ID_LENGTH} bytes; got {len(v.encode())}")
    case_file_name(v)
    return v


def validate_spec(d: Any, source: str = "", index: int | None = None) -> CaseSpec:
    """Check one specification table against the common keys and its family's schema.

    Raises :class:`SpecError` naming the file (``source``), the case (its id, or its position
    ``index`` in the file when it has none), the key, what is allowed and near misses: every
    problem of the case at once, one a line (``.problems`` holds the list; the family's keys are
    checked once the kernel and profile are known).
    Returns the :class:`CaseSpec` with canonical values (``16.0`` -> ``16``)
    and every key the case reads resolved (``spec.resolved``).
    """
    prefix = f"{source}: " if source else ""
    where = prefix + (f"case #{index}" if index is not None else "case specification")
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: expected a table of keys; got {type(d).__name__}")
    for key in d:
        if not isinstance(key, str):
            raise SpecError(f"{where}: keys are strings; got {key!r}")
    problems: list[str] = []
    case_id = ""
    if "id" not in d:
        problems.append(f"{where}: missing key 'id'")
    else:
        try:
            case_id = _check_id(d["id"], where)
            where = f"{prefix}case {case_id!r}"
        except SpecError as e:
            problems.append(str(e))
    known = True  # kernel and profile known: the family's keys can be checked
    for key in ("kernel", "profile"):
        if key not in d:
            problems.append(f"{where}: missing key {key!r}")
            known = False
        elif not isinstance(d[key], str):
            problems.append(f"{where}: key {key!r}: expected a string; got {type(d[key]).__name__} {d[key]!r}"[:300])
            known = False
    kernel, profile = (d["kernel"], d["profile"]) if known else ("", "")
    if known and profile not in PROFILES:
        near = did_you_mean(profile, list(PROFILES))
        problems.append(f"{where}: key 'profile': expected one of {', '.join(map(repr, PROFILES))}; got "
                        f"{profile!r}" + (f"; did you mean {' or '.join(map(repr, near))}?" if near else ""))
        known = False
    fam_name = d.get("family")
    fam: Family | None = None
    if fam_name is not None:
        if not isinstance(fam_name, str) or fam_name not in FAMILIES:
            problems.append(f"{where}: key 'family': expected one of {', '.join(map(repr, FAMILIES))}; got "
                            f"{fam_name!r}"[:300])
        else:
            fam = FAMILIES[fam_name]
            if fam.schema is not None and isinstance(kernel, str) and kernel and kernel not in fam.kernels:
                problems.append(f"{where}: key 'kernel': the {fam_name} family builds {', '.join(fam.kernels)}; "
                                f"got {kernel!r}"[:300])
                fam = None
    elif isinstance(d.get("kernel"), str):
        try:
            fam = FAMILIES[family_of(d["kernel"])]
        except SpecError as e:
            problems.append(f"{where}: {e}")
    seed = d.get("seed", 0)
    seed_i = as_int(seed)
    if seed_i is None or not 0 <= seed_i <= MAX_SEED:
        problems.append(f"{where}: key 'seed': expected an integer in [0, 2^63 - 1]; got {seed!r}"[:300])
    values = d.get("values", VALUE_MODES[0])
    if not isinstance(values, str) or values not in VALUE_MODES:
        near = did_you_mean(values, list(VALUE_MODES)) if isinstance(values, str) else []
        problems.append(f"{where}: key 'values': expected one of {', '.join(map(repr, VALUE_MODES))}; got "
                        f"{values!r}"[:300] + (f"; did you mean {' or '.join(map(repr, near))}?" if near else ""))
    value_draw = d.get("value_draw", VALUE_DRAWS[0])
    if not isinstance(value_draw, str) or value_draw not in VALUE_DRAWS:
        near = did_you_mean(value_draw, list(VALUE_DRAWS)) if isinstance(value_draw, str) else []
        problems.append(f"{where}: key 'value_draw': expected one of {', '.join(map(repr, VALUE_DRAWS))}; got "
                        f"{value_draw!r}"[:300] + (f"; did you mean {' or '.join(map(repr, near))}?" if near else ""))
        value_draw = VALUE_DRAWS[0]
    row_offsets: list[int] = []
    try:
        row_offsets = _row_offsets(d.get("row_offsets", []), value_draw, where)
    except SpecError as e:
        problems.append(str(e))
    given = {k: v for k, v in d.items() if k not in COMMON_KEYS}
    params = Params(kernel, profile, given)
    canonical = dict(given)
    if fam is not None and fam.schema is not None and known:
        allowed = fam.schema.kernels[kernel]
        if profile not in allowed:
            why = fam.schema.why_not.get(kernel, "")
            problems.append(f"{where}: kernel {kernel} is not generated under profile {profile!r} (profiles: "
                            f"{', '.join(allowed)}){': ' + why if why else ''}")
        else:
            canonical, params, found = collect_params(fam.schema, kernel, profile, given, where)
            problems += found
    if problems:
        raise spec_error(problems)
    assert fam is not None and seed_i is not None
    if fam_name is not None:
        canonical["family"] = fam_name
    if values != VALUE_MODES[0]:
        canonical["values"] = values
    if value_draw != VALUE_DRAWS[0]:
        canonical["value_draw"] = value_draw
    if row_offsets:
        canonical["row_offsets"] = row_offsets
    return CaseSpec(case_id, kernel, profile, seed_i, canonical, params)


def _row_offsets(value: Any, value_draw: str, where: str) -> list[int]:
    """The ``row_offsets`` key checked, its trailing zeros dropped (its canonical form)."""
    expected = f"a list of at most {MAX_ROW_OFFSETS} integers in [0, 2^31)"
    if not isinstance(value, (list, tuple)) or len(value) > MAX_ROW_OFFSETS:
        raise SpecError(f"{where}: key 'row_offsets': expected {expected}; got {value!r}"[:300])
    out = []
    for v in value:
        i = as_int(v)
        if i is None or not 0 <= i < ROW_OFFSET_BOUND:
            raise SpecError(f"{where}: key 'row_offsets': expected {expected}; got element {v!r}"[:300])
        out.append(i)
    while out and out[-1] == 0:
        out.pop()
    if out and value_draw != "position":
        raise SpecError(f"{where}: key 'row_offsets': offsets rows of the positional draws; it needs value_draw "
                        f"'position' (got {value_draw!r})")
    return out


def estimate_case(spec: CaseSpec, max_memory: int | None = None) -> Estimate | None:
    """The family's estimate of a case (None for a family without an estimator) under the memory
    limit ``max_memory`` (default: the limit in force, :func:`deepgemm_ref._memory.allocation_limit`):
    the work that streams is sized from it."""
    fam = family_for(spec)
    if fam.estimate is None:
        return None
    if max_memory is None:
        return fam.estimate(spec.resolved)
    with limit_allocations(int(max_memory)):
        return fam.estimate(spec.resolved)


def case_rng(spec: CaseSpec) -> np.random.Generator:
    """The case's generator: PCG64 seeded by SeedSequence(seed, spawn_key=(crc32(id),)) (under
    ``value_draw = "stream"``, the default; see :class:`.values.PositionalGenerator` for
    ``"position"``)."""
    seq = np.random.SeedSequence(spec.seed, spawn_key=(zlib.crc32(spec.id.encode()),))
    return np.random.Generator(np.random.PCG64(seq))


def build_case(spec: CaseSpec | Mapping[str, Any], *, max_memory: int | None = None) -> BuiltCase:
    """Generate a case's inputs and call description (values drawn as its ``values`` and
    ``value_draw`` keys say, see :mod:`.values`).

    The case's estimated peak memory is checked first against ``max_memory`` (default: the
    machine's limit, :func:`.resources.default_memory_limit`); nothing is allocated for a case
    over it (:class:`.resources.ResourceError`).
    """
    if not isinstance(spec, CaseSpec):
        spec = validate_spec(spec)
    fam = family_for(spec)
    limit = default_memory_limit() if max_memory is None else max_memory
    est = estimate_case(spec, limit)
    if est is not None and est.peak_bytes > limit:
        raise ResourceError(f"case {spec.id!r}: needs about {format_size(est.peak_bytes)} of memory "
                            f"({_shape_text(spec)}); the limit is {format_size(limit)} (--max-memory)")
    if spec.value_draw == "position":
        built = fam.build(spec, PositionalGenerator(spec.seed, spec.value_mode, spec.row_offsets))
        if spec.value_mode != VALUE_MODES[0]:
            built.inputs = apply_value_mode_at(built.inputs, spec.seed, spec.value_mode)
        return built
    rng = case_rng(spec)
    built = fam.build(spec, generator_for(rng, spec.value_mode))
    if spec.value_mode != VALUE_MODES[0]:
        built.inputs = apply_value_mode(built.inputs, rng, spec.value_mode)
    return built


def _shape_text(spec: CaseSpec) -> str:
    return " ".join(f"{k}={v}" for k, v in spec.shape().items()) or spec.kernel


#: Elements per block of :func:`randn_bf16`'s draws.
_DRAW_BLOCK = 16 << 20


def randn_bf16(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Standard-normal values rounded to bf16 (DeepGEMM's ``torch.randn(..., dtype=bf16)``).

    Drawn in blocks of leading-axis slices (at most about 16 Mi elements each): the generator
    fills element after element, so the values are those of one draw of the whole shape, without
    its float32 temporaries (a (129280, 7168) operand would need 7 GiB of them)."""
    out = np.empty(shape, BF16)
    if out.size == 0 or out.ndim == 0:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)
    inner = max(1, out.size // max(shape[0], 1))
    step = max(1, _DRAW_BLOCK // inner)
    for i in range(0, shape[0], step):
        block = rng.standard_normal((min(step, shape[0] - i), *shape[1:]), dtype=np.float32)
        block *= np.float32(scale)
        out[i:i + step] = block.astype(BF16)
    return out
