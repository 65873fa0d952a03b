"""Hypothesis strategies for valid DeepGEMM calls: property tests of a device kernel.

::

    from hypothesis import given, settings
    from deepgemm_ref.strategies import cases
    from deepgemm_ref.testing import assert_matches_golden

    @settings(max_examples=25, deadline=None)
    @given(case=cases("fp8_gemm_nt", profile="sm100"))
    def test_fp8_gemm(case, deep_gemm, dg_device):      # deep_gemm, dg_device: the pytest plugin's fixtures
        assert_matches_golden(case, case.call(deep_gemm, device=dg_device))

:func:`cases` draws :class:`Case` objects for any kernel the golden case specifications accept
(:func:`kernels` lists them, from the family registry of ``deepgemm_ref.golden``), under any
profile that provides it, with every key of the kernel's schema (``docs/case-specs.md``) drawn
unless fixed.  What is valid is the schema's business: every drawn case is a specification that
:func:`deepgemm_ref.golden.validate_spec` accepts, so :meth:`Case.to_spec` saves it as a golden
case (``deepgemm-ref golden --spec``) and the bundle holds the same bytes.

How keys are drawn.  Categorical keys (formats, recipes' granularities, output dtype, ``c``,
layouts, flags, per-profile head counts and block sizes) are drawn as one valid combination:
every combination is enumerated and validated when the strategy is built, ordered with the
schema's defaults first, so a failing example shrinks toward the default recipe.  Sizes are
integers from the key's lower bound up to twice its default (``m`` of a dense GEMM: 1 to 256,
``k``: 1 to 512), moved up to the next value the schema accepts (``k`` even for FP4, a multiple
of 64 for ACLNN, ...) and kept within four times the default case's estimated work; they shrink
toward the smallest valid size; a size fixed to a strategy is moved the same way (mapped, not
filtered, so the shrinker reaches every valid small size).  Floats (``alpha``, Mega MoE's
``masked`` and ``clamp``) shrink to their defaults; the seed shrinks toward 0.  The shapes of
groups, context lengths, block tables and routing inside a case come from its seed and its keys
(that is what lets :meth:`Case.to_spec` regenerate it); the piece strategies below draw such
structures directly for tests that build their own calls.

Shrinking to the minimal case.  Drawn cases have ``value_draw = "position"`` (a spec key, see
:mod:`deepgemm_ref.golden.values`): every input value comes from a stream keyed by the seed, the
builder's draw (A, B, C, ...) and the element's position, not from one stream in the builder's
order and not from the case id (which names the shape).  Element (i, k) of A is the same at
m = 213 and at m = 7, and a whole 128-wide K block keeps its codes and scales when K shrinks, so
when hypothesis lowers ``m`` or ``k`` the rows and K blocks that remain keep their data and a
data-dependent failure survives.  Right after the sizes, each case draws ``row_offsets`` (up to
4, shrinking toward 0; also a spec key): row i of the builder's n-th draw is row
``row_offsets[n] + i`` of its streams.  Hypothesis' shrinker moves an amount from one choice to
one of the next few, so it can lower ``n`` and raise B's offset together: the failing row of B
becomes row 0 and the example shrinks to m = n = 1 where the bug needs no more rows, and to the
smallest K that shows it (tests/test_shrinking.py proves it on broken stand-ins).  The reproduce
spec holds both keys, so ``golden --spec`` regenerates the same bytes.  Limits: under
``values="adversarial"`` the scale perturbations and under ``"special"`` the special values are
keyed by their position in the stored tensor, not moved by the offsets; ``value_draw="stream"``
draws as the goldens' presets do.

Names of the issue and of DeepGEMM map to the schema's keys: every alias of a family's schema
(``num_groups`` -> ``groups``, ``num_heads`` -> ``heads``, ``a_dtype`` -> ``a``, ``out_dtype`` ->
``out``, ``use_psum_layout`` -> ``psum``, ``num_experts`` -> ``experts``, ``num_topk`` ->
``topk``, ...), plus for the dense GEMMs ``with_c=True`` (``c`` is ``"separate"`` or ``"is_d"``),
``with_c=False`` (``c="none"``), ``recipe=(1, gran_n, gran_k)``, ``recipe_a=(1, gran_k_a)``,
``recipe_b=(gran_n, gran_k_b)``; dtype values may be written ``"float32"``, ``"bfloat16"``,
``"float8_e4m3fn"``, a NumPy dtype or a torch dtype.  The major-ness of a dense GEMM is its
kernel's name (``_nt``: K-major A and B, ``_tn``: MN-major A, ``_nn``: MN-major B); ``seed`` and
``id`` fix the common keys.  A fixed value may also be a hypothesis strategy of values.

Value modes (``values=``, the spec key of the same name, :mod:`deepgemm_ref.golden.values`):
``"normal"`` as DeepGEMM's test generators draw inputs; ``"adversarial"`` (rounding ties,
cancelling pairs, rows across the exponent range, scale factors across the UE8M0 range,
subnormal and near-overflow results); ``"special"`` (NaN, infinities and -0 where the inputs
can hold them).

Bad arguments (an unknown kernel, a profile that does not provide it, an unknown key, a value
of the wrong type, fixed values no valid case satisfies) raise
:class:`deepgemm_ref.DGArgumentError` when the strategy is built, naming them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:
    from hypothesis import assume
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
    from hypothesis.strategies import SearchStrategy
except ImportError as e:  # pragma: no cover - hypothesis is in the test extra
    raise ImportError("deepgemm_ref.strategies needs hypothesis: pip install 'deepgemm-ref[test]' "
                      "(or pip install hypothesis)") from e

from .errors import DGArgumentError
from .golden.case import Case, Golden, case_id_for
from .golden.cases import FAMILIES, Family, family_of
from .golden.schema import (
    COMMON_KEYS,
    MAX_SEED,
    Key,
    Params,
    Schema,
    SpecError,
    did_you_mean,
    normalise_value,
    validate_params,
)
from .golden.values import VALUE_DRAWS, VALUE_MODES
from .profiles import PROFILES

__all__ = ["cases", "specs", "kernels", "Case", "Golden", "shapes", "scales", "m_indices", "psum_layouts",
           "masked_m", "k_grouped_sizes", "context_lens", "block_tables", "topk", "PARAMETER_NAMES"]

#: Names accepted by :func:`cases` besides the schemas' own keys and aliases: name -> what it sets.
PARAMETER_NAMES = {
    "seed": "the case's seed (a common key)",
    "id": "the case's id (a common key; it seeds the inputs with the seed)",
    "with_c": "dense GEMMs: True -> c 'separate' or 'is_d'; False -> c 'none'",
    "recipe": "dense GEMMs: (1, gran_n, gran_k) -> gran_n, gran_k_a = gran_k_b = gran_k",
    "recipe_a": "dense GEMMs: (1, gran_k_a)",
    "recipe_b": "dense GEMMs: (gran_n, gran_k_b)",
}
_MAJOR_NAMES = ("major", "major_a", "major_b", "a_major", "b_major", "major_ness", "majorness")
_DTYPE_WORDS = {"float32": "f32", "fp32": "f32", "float": "f32", "bfloat16": "bf16", "float8_e4m3fn": "fp8",
                "e4m3": "fp8", "float8": "fp8", "float4_e2m1fn_x2": "fp4", "float4_e2m1": "fp4", "e2m1": "fp4",
                "int8": "fp4"}
#: Candidates scanned when moving a drawn size to the next valid one.
_MAX_SCAN = 1024
#: A drawn case's estimated work stays within this many times the default case's.
_WORK_FACTOR = 4.0


def kernels() -> list[str]:
    """Every kernel name :func:`cases` accepts (the kernels the golden case families build)."""
    return sorted({k for f in FAMILIES.values() if not f.explicit and f.schema is not None for k in f.kernels})


def _family(kernel: Any) -> Family:
    if not isinstance(kernel, str):
        raise DGArgumentError(f"cases: kernel: expected a kernel name (a string); got {type(kernel).__name__} "
                              f"{kernel!r}"[:300])
    try:
        fam = FAMILIES[family_of(kernel)]
    except SpecError as e:
        raise DGArgumentError(f"cases: {e}") from None
    if fam.schema is None:  # pragma: no cover - every registered family has a schema
        raise DGArgumentError(f"cases: kernel: {kernel!r} has no case schema")
    return fam


@dataclass(frozen=True)
class _OneOf:
    """A fixed key restricted to several values (``with_c=True``)."""

    values: tuple[Any, ...]


def _dtype_word(key: Key, value: Any) -> Any:
    """Dtype spellings (``"float32"``, ``np.float32``, ``torch.bfloat16``) as the schema's words."""
    if key.kind != "str" or key.choices is None:
        return value
    text = value if isinstance(value, str) else (getattr(value, "name", None) or str(value))
    if not isinstance(text, str):
        return value
    text = text.replace("torch.", "").replace("ml_dtypes.", "")
    if text in key.choices:
        return text
    word = _DTYPE_WORDS.get(text)
    return word if word in key.choices else value


def _normalise_fixed(kernel: str, schema: Schema, fixed: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(family keys fixed to a value, a _OneOf or a strategy; the common keys seed / id)."""
    out: dict[str, Any] = {}
    common: dict[str, Any] = {}
    names = [k.name for k in schema.keys]

    def put(name: str, value: Any, given_as: str) -> None:
        if name in out and out[name] != value:
            raise DGArgumentError(f"cases: {kernel}: {given_as} and another argument both set key {name!r} "
                                  f"({out[name]!r} and {value!r})")
        out[name] = value

    for given_as, value in fixed.items():
        if given_as in ("seed", "id"):
            common[given_as] = value
            continue
        if given_as in _MAJOR_NAMES:
            raise DGArgumentError(f"cases: {kernel}: {given_as}: a kernel's name fixes its operands' major-ness "
                                  "(..._nt: K-major A and B; ..._tn: MN-major A; ..._nn: MN-major B; ..._tt: both "
                                  "MN-major); draw another kernel instead")
        if given_as == "with_c" and schema.key("c") is not None:
            if not isinstance(value, bool):
                raise DGArgumentError(f"cases: {kernel}: with_c: expected True or False; got {value!r}")
            put("c", _OneOf(("separate", "is_d")) if value else "none", given_as)
            continue
        if given_as in ("recipe", "recipe_a", "recipe_b") and schema.key("gran_n") is not None:
            want = {"recipe": 3, "recipe_a": 2, "recipe_b": 2}[given_as]
            if not (isinstance(value, (tuple, list)) and len(value) == want):
                raise DGArgumentError(f"cases: {kernel}: {given_as}: expected a tuple of {want} integers; got "
                                      f"{value!r}")
            if given_as == "recipe":
                put("gran_n", value[1], given_as)
                put("gran_k_a", value[2], given_as)
                put("gran_k_b", value[2], given_as)
            elif given_as == "recipe_a":
                put("gran_k_a", value[1], given_as)
            else:
                put("gran_n", value[0], given_as)
                put("gran_k_b", value[1], given_as)
            continue
        name = given_as if given_as in names else schema.aliases.get(given_as)
        if name is None or schema.key(name) is None:
            near = did_you_mean(given_as, names + list(PARAMETER_NAMES), schema.aliases)
            hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
            extra = ", with_c, recipe" if "c" in names else ""
            raise DGArgumentError(f"cases: {kernel}: unknown parameter {given_as!r} (the {schema.family} family's "
                                  f"keys: {', '.join(names)}; also seed, id{extra}){hint}")
        key = schema.key(name)
        assert key is not None
        if isinstance(value, SearchStrategy):
            put(name, value, given_as)
            continue
        canonical, problem = normalise_value(key, _dtype_word(key, value))
        if problem is not None:
            raise DGArgumentError(f"cases: {kernel}: {given_as}{'' if given_as == name else f' (key {name!r})'}: "
                                  f"{problem}")
        put(name, canonical, given_as)
    return out, common


def _reads(key: Key, kernel: str, profile: str) -> bool:
    try:
        return key.read_by(Params(kernel, profile))
    except (KeyError, TypeError):  # a reader rule that needs other keys: assume it reads
        return True


def _applicable_only(key: Key, kernel: str, profile: str) -> list[tuple[Any, ...]]:
    return [o.values for o in key.only if o.applies(kernel, profile)]


def _categorical(key: Key, kernel: str, profile: str) -> bool:
    return key.choices is not None or key.kind == "bool" or (key.kind == "int" and bool(
        _applicable_only(key, kernel, profile)))


def _domain(key: Key, kernel: str, profile: str) -> list[Any]:
    if key.choices is not None:
        dom = list(key.choices)
    elif key.kind == "bool":
        dom = [False, True]
    else:
        onlies = _applicable_only(key, kernel, profile)
        dom = list(onlies[0])
    for values in _applicable_only(key, kernel, profile):
        dom = [v for v in dom if v in values]
    return dom


def _validate(schema: Schema, kernel: str, profile: str, given: Mapping[str, Any]) -> Params | None:
    try:
        return validate_params(schema, kernel, profile, given, "case")[1]
    except SpecError:
        return None


def _problem(schema: Schema, kernel: str, profile: str, given: Mapping[str, Any]) -> str:
    try:
        validate_params(schema, kernel, profile, given, f"{kernel} under {profile}")
    except SpecError as e:
        return str(e)
    return ""


@dataclass
class _ProfilePlan:
    """What is drawn for one profile: the valid categorical combinations (defaults first), the
    numeric keys in schema order, and the work budget of a drawn case."""

    profile: str
    combos: list[dict[str, Any]]
    numeric: list[Key]
    budget: float


@dataclass
class _Plan:
    kernel: str
    family: Family
    values: str
    fixed: dict[str, Any]
    common: dict[str, Any]
    profiles: list[_ProfilePlan] = field(default_factory=list)
    value_draw: str = "position"

    @property
    def schema(self) -> Schema:
        assert self.family.schema is not None
        return self.family.schema

    def work(self, params: Params) -> float:
        return self.family.estimate(params).work if self.family.estimate is not None else 0.0


def _plain_fixed(plan_fixed: Mapping[str, Any]) -> dict[str, Any]:
    """The fixed keys that hold one value (not a strategy, not several values)."""
    return {k: v for k, v in plan_fixed.items() if not isinstance(v, (_OneOf, SearchStrategy))}


def _profile_plan(plan: _Plan, profile: str) -> tuple[_ProfilePlan | None, str]:
    """The plan under ``profile``, or (None, why no case is valid there)."""
    schema, kernel = plan.schema, plan.kernel
    fixed = _plain_fixed(plan.fixed)
    for name in plan.fixed:
        key = schema.key(name)
        assert key is not None
        if not _reads(key, kernel, profile):
            return None, f"key {name!r} is not read by {kernel} under {profile}"
    base = _validate(schema, kernel, profile, fixed)
    cat_keys, domains = [], []
    for key in schema.keys:
        if key.name in fixed or not _reads(key, kernel, profile) or not _categorical(key, kernel, profile):
            continue
        dom = _domain(key, kernel, profile)
        restrict = plan.fixed.get(key.name)
        if isinstance(restrict, _OneOf):
            dom = [v for v in dom if v in restrict.values]
            if not dom:
                return None, f"key {key.name!r} takes none of {list(restrict.values)} for {kernel} under {profile}"
        elif not dom:
            continue  # restrictions that exclude each other (sm90's E4M3-only rule for a BF16 kernel): the default
        if base is not None and key.name in base and base[key.name] in dom:
            dom.remove(base[key.name])
            dom.insert(0, base[key.name])
        cat_keys.append(key)
        domains.append(dom)
    combos: list[dict[str, Any]] = []
    first_problem = ""
    for values in itertools.product(*domains):
        combo = {k.name: v for k, v in zip(cat_keys, values, strict=True)}
        given = {**fixed, **combo}
        if _validate(schema, kernel, profile, given) is not None:
            combos.append(combo)
        elif not first_problem:
            first_problem = _problem(schema, kernel, profile, given)
    if not combos:
        return None, first_problem or _problem(schema, kernel, profile, fixed)
    numeric = [k for k in schema.keys if k.name not in fixed and _reads(k, kernel, profile)
               and not _categorical(k, kernel, profile)]
    params = _validate(schema, kernel, profile, {**fixed, **combos[0]})
    assert params is not None
    return _ProfilePlan(profile, combos, numeric, _WORK_FACTOR * plan.work(params)), ""


def _plan(kernel: Any, profile: Any, values: Any, fixed: Mapping[str, Any], value_draw: Any = "position") -> _Plan:
    fam = _family(kernel)
    assert fam.schema is not None
    if value_draw not in VALUE_DRAWS:
        raise DGArgumentError(f"cases: value_draw: expected one of {', '.join(map(repr, VALUE_DRAWS))}; got "
                              f"{value_draw!r}"[:300])
    if values not in VALUE_MODES:
        near = did_you_mean(values, list(VALUE_MODES)) if isinstance(values, str) else []
        raise DGArgumentError(f"cases: values: expected one of {', '.join(map(repr, VALUE_MODES))}; got {values!r}"
                              + (f"; did you mean {' or '.join(map(repr, near))}?" if near else ""))
    allowed = fam.schema.kernels[kernel]
    if profile is not None:
        if profile not in PROFILES:
            near = did_you_mean(str(profile), list(PROFILES))
            raise DGArgumentError(f"cases: profile: expected one of {', '.join(map(repr, PROFILES))}; got {profile!r}"
                                  + (f"; did you mean {' or '.join(map(repr, near))}?" if near else ""))
        if profile not in allowed:
            why = fam.schema.why_not.get(kernel, "")
            raise DGArgumentError(f"cases: profile: {kernel} is not provided under {profile!r} (profiles: "
                                  f"{', '.join(allowed)}){': ' + why if why else ''}")
    fixed_keys, common = _normalise_fixed(kernel, fam.schema, fixed)
    seed = common.get("seed")
    if seed is not None and not isinstance(seed, SearchStrategy) and not (
            isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED):
        raise DGArgumentError(f"cases: seed: expected an integer in [0, 2^63 - 1]; got {seed!r}")
    case_id = common.get("id")
    if case_id is not None and not isinstance(case_id, str):
        raise DGArgumentError(f"cases: id: expected a string; got {case_id!r}")
    plan = _Plan(kernel, fam, values, fixed_keys, common, value_draw=value_draw)
    problems = []
    for prof in ([profile] if profile is not None else list(allowed)):
        pp, why = _profile_plan(plan, prof)
        if pp is None:
            problems.append(why)
        else:
            plan.profiles.append(pp)
    if not plan.profiles:
        given = ", ".join(f"{k}={v!r}" for k, v in fixed.items())
        where = f"under {profile}" if profile is not None else f"under any of {', '.join(allowed)}"
        raise DGArgumentError(f"cases: {kernel}: no valid case {where} has {given or 'these keys'}: "
                              + "; ".join(dict.fromkeys(problems)))
    return plan


# ----------------------------------------------------------------------------------------------
# drawing
# ----------------------------------------------------------------------------------------------

def _size_cap(key: Key, default: Any) -> int:
    lo = int(key.lo if key.lo is not None else 0)
    hi = int(key.hi if key.hi is not None else max(lo, 2 * int(default or 1)))
    return max(lo, min(hi, 2 * int(default) if isinstance(default, int) and default > 0 else lo + 8))


def _draw_int(draw: Callable[..., Any], plan: _Plan, pp: _ProfilePlan, key: Key, given: dict[str, Any],
              params: Params) -> int | None:
    lo = int(key.lo if key.lo is not None else 0)
    cap = _size_cap(key, params.get(key.name))
    v0 = draw(st.integers(lo, cap), label=key.name)

    def ok(v: int) -> bool:
        p = _validate(plan.schema, plan.kernel, pp.profile, {**given, key.name: v})
        return p is not None and plan.work(p) <= pp.budget

    ups = range(v0, min(cap, v0 + _MAX_SCAN) + 1)
    downs = range(v0 - 1, max(lo, v0 - _MAX_SCAN) - 1, -1)
    return next((v for v in itertools.chain(ups, downs) if ok(v)), None)


def _float_strategy(key: Key, default: Any) -> SearchStrategy[Any]:
    lo = key.lo if key.lo is not None else -4.0
    hi = key.hi if key.hi is not None else lo + 20.0 if key.lo is not None else 4.0
    values: SearchStrategy[Any] = st.floats(float(lo), float(hi), allow_nan=False, allow_infinity=False, width=32)
    first = st.just(default)
    nice = st.sampled_from([v for v in (1.0, 0.5, 2.0, -1.0, 0.0, 0.75, -0.25) if lo <= v <= hi] or [float(lo)])
    return st.one_of(first, st.none() if key.nullable else nice, nice, values)


def _draw_other(draw: Callable[..., Any], plan: _Plan, pp: _ProfilePlan, key: Key, given: dict[str, Any],
                params: Params) -> Any:
    """A float or a list key: drawn, the default where the draw is not valid."""
    default = params.get(key.name)
    if key.kind == "float":
        v = draw(_float_strategy(key, default), label=key.name)
    else:  # "ints": element-wise around the default
        base = list(default or [0] * (key.length or 1))
        lo = int(key.lo if key.lo is not None else 0)
        v = [draw(st.integers(lo, max(lo, 2 * int(x) if x > 0 else lo + 8)), label=f"{key.name}[{i}]")
             for i, x in enumerate(base)]
    p = _validate(plan.schema, plan.kernel, pp.profile, {**given, key.name: v})
    return v if p is not None and plan.work(p) <= pp.budget else None


def _prune(plan: _Plan, profile: str, given: dict[str, Any], keep: set[str]) -> dict[str, Any]:
    """Drop drawn keys that equal what the schema would default them to."""
    full = _validate(plan.schema, plan.kernel, profile, given)
    assert full is not None
    out = dict(given)
    for name in list(given):
        if name in keep:
            continue
        trial = {k: v for k, v in out.items() if k != name}
        p = _validate(plan.schema, plan.kernel, profile, trial)
        if p is not None and p.as_dict() == full.as_dict():
            out = trial
    return out


#: How many row offsets a positional case draws (one per builder draw; later draws get 0).
_ROW_OFFSETS = 4
#: Row offsets are drawn in [0, _MAX_OFFSET].
_MAX_OFFSET = 1023


@st.composite
def _spec_from_plan(draw: Callable[..., Any], plan: _Plan) -> dict[str, Any]:
    pp = draw(st.sampled_from(plan.profiles), label="profile") if len(plan.profiles) > 1 else plan.profiles[0]
    combo = draw(st.sampled_from(pp.combos), label="combination") if len(pp.combos) > 1 else pp.combos[0]
    fixed = _plain_fixed(plan.fixed)
    given: dict[str, Any] = {**fixed, **combo}
    sizes_of = {k.name for k in pp.numeric if k.kind == "int"}
    for name, strategy in plan.fixed.items():
        if isinstance(strategy, SearchStrategy):
            v = draw(strategy, label=name)
            if name in sizes_of and isinstance(v, int) and not isinstance(v, bool):
                # mapped, not filtered: a size the schema refuses moves up to the next it accepts
                v = next((u for u in range(v, v + _MAX_SCAN + 1)
                          if _validate(plan.schema, plan.kernel, pp.profile, {**given, name: u}) is not None), v)
            given[name] = v
    if _validate(plan.schema, plan.kernel, pp.profile, given) is None:
        assume(False)  # only where a fixed strategy drew a value no size near it makes valid
    drawn = [k for k in pp.numeric if not isinstance(plan.fixed.get(k.name), SearchStrategy)]
    sizes = [k for k in drawn if k.kind == "int"]
    for key in sizes:
        params = _validate(plan.schema, plan.kernel, pp.profile, given)
        assert params is not None
        v = _draw_int(draw, plan, pp, key, given, params)
        if v is None:
            assume(False)
        given[key.name] = v
    # The row offsets right after the sizes: hypothesis' shrinker moves an amount from one choice
    # to one of the next few (redistribute_numeric_pairs), so it can trade a size for an offset,
    # dropping an operand's leading rows while the failing row stays.
    offsets: list[int] = []
    if plan.value_draw == "position":
        offsets = [draw(st.integers(0, _MAX_OFFSET), label=f"row_offsets[{i}]") for i in range(_ROW_OFFSETS)]
        while offsets and offsets[-1] == 0:
            offsets.pop()
    for key in drawn:
        if key.kind == "int":
            continue
        params = _validate(plan.schema, plan.kernel, pp.profile, given)
        assert params is not None
        v = _draw_other(draw, plan, pp, key, given, params)
        if v is not None:
            given[key.name] = v
    seed = plan.common.get("seed")
    if isinstance(seed, SearchStrategy):
        seed = draw(seed, label="seed")
    elif seed is None:
        seed = draw(st.integers(0, 2**32 - 1), label="seed")
    keep = set(plan.fixed)
    order = [k.name for k in plan.schema.keys]
    given = _prune(plan, pp.profile, dict(sorted(given.items(), key=lambda kv: order.index(kv[0]))), keep)
    params = _validate(plan.schema, plan.kernel, pp.profile, given)
    assert params is not None
    shape = plan.schema.shape_keys(params)
    case_id = plan.common.get("id") or case_id_for(plan.kernel, pp.profile, given, shape, int(seed), plan.values,
                                                   plan.value_draw, offsets)
    spec: dict[str, Any] = {"id": case_id, "kernel": plan.kernel, "profile": pp.profile, "seed": int(seed), **given}
    if plan.values != VALUE_MODES[0]:
        spec["values"] = plan.values
    if plan.value_draw != VALUE_DRAWS[0]:
        spec["value_draw"] = plan.value_draw
    if offsets:
        spec["row_offsets"] = offsets
    return spec


def specs(kernel: str, *, profile: str | None = None, values: str = "normal", value_draw: str = "position",
          **fixed: Any) -> SearchStrategy[dict]:
    """A strategy of case specifications (tables ``deepgemm-ref golden --spec`` accepts) for
    ``kernel``; the arguments are those of :func:`cases`."""
    return _spec_from_plan(_plan(kernel, profile, values, fixed, value_draw))


def cases(kernel: str, *, profile: str | None = None, values: str = "normal", value_draw: str = "position",
          **fixed: Any) -> SearchStrategy[Case]:
    """A strategy of valid :class:`Case` objects for ``kernel`` (any name of :func:`kernels`).

    profile: ``"sm90"``, ``"sm100"`` or ``"ascend950"``; ``None`` draws among the profiles that
    provide the kernel.  values: ``"normal"``, ``"adversarial"`` or ``"special"`` (see the module
    docstring).  value_draw: the spec key of that name, ``"position"`` (each input value keyed by
    its position, so a failing example shrinks to the rows and K that fail; see the module
    docstring) or ``"stream"`` (the goldens' default).  fixed: schema keys (or their aliases, or
    the names of :data:`PARAMETER_NAMES`) held at a value or drawn from a given strategy; every
    other key of the kernel's schema is drawn.  Raises :class:`deepgemm_ref.DGArgumentError` now
    (not in a draw) for an unknown kernel, profile, key or value, and for fixed values that no
    valid case satisfies.
    """
    return specs(kernel, profile=profile, values=values, value_draw=value_draw, **fixed).map(Case.from_spec)


def shapes(kernel: str, *, profile: str | None = None, **fixed: Any) -> SearchStrategy[dict[str, int]]:
    """A strategy of real shapes of valid ``kernel`` cases: the family's shape keys (``m``, ``n``,
    ``k`` of a dense GEMM; ``groups``, ``m``, ``n``, ``k`` (and ``max_m``) of a grouped GEMM;
    ``seq``, ``seq_kv``, ``heads``, ``head_dim`` of MQA; ...), drawn as :func:`cases` draws them."""
    plan = _plan(kernel, profile, "normal", fixed)

    def shape_of(spec: dict[str, Any]) -> dict[str, int]:
        given = {k: v for k, v in spec.items() if k not in COMMON_KEYS}
        params = _validate(plan.schema, plan.kernel, spec["profile"], given)
        assert params is not None
        return plan.schema.shape_keys(params)

    return _spec_from_plan(plan).map(shape_of)


# ----------------------------------------------------------------------------------------------
# the pieces
# ----------------------------------------------------------------------------------------------

def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def _count(name: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise DGArgumentError(f"strategies.{name}: expected an integer >= {lo}; got {v!r}")
    return int(v)


def scales(shape: Sequence[int] | int, *, ue8m0: bool = True, packed: str | None = None, min_exponent: int = -126,
           max_exponent: int = 121) -> SearchStrategy[np.ndarray]:
    """A strategy of scale-factor arrays of ``shape``.

    ue8m0=True: float32 powers of two 2^e with e in [min_exponent, max_exponent] (default: the
    normal UE8M0 range, bytes 1 to 248; DeepGEMM-Ascend refuses FP4 weight scales above 2^121);
    they shrink toward 1.0.  ue8m0=False: positive float32 values 2^e (1 + f) (sm90's float
    scales).  packed="int32": the UE8M0 bytes packed four per int32 along the last axis (DeepGEMM's
    packed layout; the last axis of ``shape`` must be a multiple of 4); "int16": two per int16
    (DeepGEMM-Ascend's pairs).
    """
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise DGArgumentError(f"strategies.scales: shape: expected non-negative integers; got {shape!r}")
    if not -126 <= min_exponent <= max_exponent <= 127:
        raise DGArgumentError(f"strategies.scales: exponents: expected -126 <= min_exponent <= max_exponent <= 127; "
                              f"got [{min_exponent}, {max_exponent}]")
    if packed not in (None, "int32", "int16"):
        raise DGArgumentError(f"strategies.scales: packed: expected None, 'int32' or 'int16'; got {packed!r}")
    if packed is not None and not ue8m0:
        raise DGArgumentError("strategies.scales: packed scales are UE8M0: pass ue8m0=True")
    per = {"int32": 4, "int16": 2}.get(packed or "", 1)
    if packed is not None and (not dims or dims[-1] % per):
        raise DGArgumentError(f"strategies.scales: shape: packing {per} bytes per {packed} needs the last axis a "
                              f"multiple of {per}; got {dims}")
    exps = hnp.arrays(np.int16, dims, elements=st.integers(min_exponent, max_exponent))

    def build(e: np.ndarray, frac: np.ndarray | None) -> np.ndarray:
        if packed is not None:
            by = (e.astype(np.int64) + 127).astype(np.uint8)
            return np.ascontiguousarray(by).view(np.int32 if packed == "int32" else np.int16)
        x = np.ldexp(np.float32(1), e.astype(np.int32)).astype(np.float32)
        return x if frac is None else (x * (1 + frac)).astype(np.float32)

    if ue8m0:
        return exps.map(lambda e: build(e, None))
    fracs = hnp.arrays(np.float32, dims, elements=st.floats(0, 0.99609375, width=32))
    return st.tuples(exps, fracs).map(lambda t: build(*t))


def _group_sizes(num_groups: int, max_rows: int, empty: bool) -> SearchStrategy[list[int]]:
    return st.lists(st.integers(0 if empty else 1, max_rows), min_size=num_groups, max_size=num_groups)


def m_indices(num_groups: int, *, alignment: int = 128, max_rows: int = 256, empty: bool = True,
              ) -> SearchStrategy[np.ndarray]:
    """A strategy of contiguous M-grouped layouts as ``m_indices``: int32 (M,) where group ``g``'s
    rows are one run of ``g`` starting at a multiple of ``alignment``, padded with -1 up to the
    next multiple (DeepGEMM's ``grouped_layout`` with ``use_psum_layout=False``).  Each group has
    0 (``empty``) or 1 to ``max_rows`` rows; M is the padded total (0 when every group is empty).
    Shrinks toward empty groups."""
    g = _count("m_indices", num_groups)
    al = _count("m_indices", alignment)

    def build(sizes: list[int]) -> np.ndarray:
        out = np.full(sum(_align(s, al) for s in sizes), -1, np.int32)
        start = 0
        for i, s in enumerate(sizes):
            out[start:start + s] = i
            start += _align(s, al)
        return out

    return _group_sizes(g, _count("m_indices", max_rows), empty).map(build)


def psum_layouts(num_groups: int, *, alignment: int = 128, max_rows: int = 256, empty: bool = True,
                 ) -> SearchStrategy[np.ndarray]:
    """A strategy of psum layouts: int32 (G,) END offsets, group ``g`` holding rows
    ``[align(end[g-1], alignment), end[g])`` (``use_psum_layout=True``; an empty group ends at its
    aligned start).  The A / D rows needed are ``align(end[-1], alignment)``."""
    g = _count("psum_layouts", num_groups)
    al = _count("psum_layouts", alignment)

    def build(sizes: list[int]) -> np.ndarray:
        ends, prev = [], 0
        for i, s in enumerate(sizes):
            start = _align(prev, al) if i else 0
            ends.append(start + s)
            prev = ends[-1]
        return np.array(ends, np.int32)

    return _group_sizes(g, _count("psum_layouts", max_rows), empty).map(build)


def masked_m(num_groups: int, max_m: int) -> SearchStrategy[np.ndarray]:
    """A strategy of ``masked_m``: int32 (G,) row counts in [0, max_m] (idle experts included)."""
    g = _count("masked_m", num_groups)
    return hnp.arrays(np.int32, (g,), elements=st.integers(0, _count("masked_m", max_m, 0)))


def k_grouped_sizes(num_groups: int, *, alignment: int = 128, max_k: int = 512, empty: bool = True,
                    aligned: bool = True) -> SearchStrategy[list[int]]:
    """A strategy of k-grouped GEMM group sizes (``ks`` / ``ks_cpu``): one K size per group, 0
    for an empty group (``empty``), multiples of ``alignment`` when ``aligned`` (DeepGEMM's CUDA
    k-grouped kernels), else any size up to ``max_k`` (DeepGEMM-Ascend's psum ends)."""
    g = _count("k_grouped_sizes", num_groups)
    al = _count("k_grouped_sizes", alignment)
    top = _count("k_grouped_sizes", max_k)
    if aligned:
        return st.lists(st.integers(0 if empty else 1, max(1, top // al)), min_size=g, max_size=g).map(
            lambda units: [u * al for u in units])
    return st.lists(st.integers(0 if empty else 1, top), min_size=g, max_size=g)


def context_lens(batch: int, *, max_len: int = 512, min_len: int = 1) -> SearchStrategy[np.ndarray]:
    """A strategy of paged-attention context lengths: int32 (batch,) in [min_len, max_len]
    (reshape to (batch, next_n) as the kernel takes them)."""
    b = _count("context_lens", batch)
    return hnp.arrays(np.int32, (b,), elements=st.integers(_count("context_lens", min_len, 0),
                                                           _count("context_lens", max_len)))


def block_tables(lens: Any, block_kv: int, *, spare_blocks: int = 1) -> SearchStrategy[tuple[np.ndarray, int]]:
    """A strategy of (block_table, num_blocks) for context lengths ``lens``: int32
    (batch, max pages) where row ``i`` lists ``ceil(lens[i] / block_kv)`` distinct physical KV
    blocks (a permutation of ``num_blocks`` = the pages needed plus ``spare_blocks``), the rest 0."""
    ctx = np.asarray(lens).reshape(-1).astype(np.int64)
    bk = _count("block_tables", block_kv)
    pages = [-(-int(c) // bk) for c in ctx]
    total = sum(pages) + _count("block_tables", spare_blocks, 0)

    def build(perm: list[int]) -> tuple[np.ndarray, int]:
        table = np.zeros((len(pages), max(pages + [1])), np.int32)
        pos = 0
        for i, n in enumerate(pages):
            table[i, :n] = perm[pos:pos + n]
            pos += n
        return table, total

    return st.permutations(list(range(total))).map(build)


def topk(num_tokens: int, num_experts: int, k: int, *, masked: bool = True,
         ) -> SearchStrategy[tuple[np.ndarray, np.ndarray]]:
    """A strategy of Mega MoE routing: ``(topk_idx, topk_weights)``, int64 (N, K) distinct experts
    per token in [0, num_experts) with -1 slots (``masked``), and float32 (N, K) weights in (0, 1]
    (0 in masked slots).  Shrinks toward experts 0..K-1 with weight 1."""
    n = _count("topk", num_tokens, 0)
    e = _count("topk", num_experts)
    kk = _count("topk", k)
    if kk > e:
        raise DGArgumentError(f"strategies.topk: k: expected at most num_experts = {e}; got {kk}")
    row = st.tuples(st.lists(st.integers(0, e - 1), min_size=kk, max_size=kk, unique=True),
                    st.lists(st.booleans() if masked else st.just(False), min_size=kk, max_size=kk),
                    st.lists(st.floats(2.0**-10, 1.0, width=32), min_size=kk, max_size=kk))

    def build(rows: list[tuple[list[int], list[bool], list[float]]]) -> tuple[np.ndarray, np.ndarray]:
        idx = np.array([r[0] for r in rows], np.int64).reshape(n, kk)
        drop = np.array([r[1] for r in rows], bool).reshape(n, kk)
        w = np.array([r[2] for r in rows], np.float32).reshape(n, kk)
        idx[drop] = -1
        w[drop] = 0
        return idx, w

    return st.lists(row, min_size=n, max_size=n).map(build)

