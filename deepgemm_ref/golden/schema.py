"""Case specifications as data: one schema per kernel family.

A case specification is a flat table (JSON or TOML): the common keys ``id``, ``kernel``,
``profile``, ``seed`` (and ``family`` where a kernel has more than one builder), plus the keys of
the kernel's family.  Each family describes its keys with :class:`Key` records: the type, the
range, the allowed values, the default (a value, or a rule of the other keys written out in
words), which kernels and profiles read it, and per-profile or per-kernel restrictions
(:class:`Only`: e.g. a dtype a kernel does not take under a profile).  Keys that need each other
are checked by :class:`Rule` records.  :func:`validate_spec` applies the schema to one table:
unknown keys, wrong types, non-integral floats, values out of range or not allowed, and keys the
kernel does not read are refused with :class:`SpecError` naming the case, the key, what is
allowed and, for near misses, what was probably meant.  The same records render the reference
page ``docs/case-specs.md`` (:func:`render_markdown`) and ``deepgemm-ref list -v``.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import DGArgumentError
from ..profiles import PROFILES

__all__ = ["SpecError", "Key", "Only", "Rule", "Schema", "Params", "COMMON_KEYS", "MAX_ID_LENGTH", "did_you_mean",
           "validate_params", "collect_params", "spec_error",
           "describe_key", "render_markdown", "normalise_value", "as_int", "expected_text"]

#: Longest case id, in UTF-8 bytes (the case file name, its temporary name and the suffix fit in
#: 255 bytes).
MAX_ID_LENGTH = 200
#: Seeds are non-negative integers below 2^63 (numpy's SeedSequence takes any; a bound keeps
#: manifests portable to JSON readers with 64-bit integers).
MAX_SEED = 2**63 - 1
#: Dimensions are below 2^31 (DeepGEMM's kernels index with int32).
MAX_DIM = 2**31 - 1


class SpecError(DGArgumentError):
    """A case specification that the schema refuses (the message names the case and the key)."""


_KINDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
          "ints": "a list of integers"}


@dataclass(frozen=True)
class Only:
    """Under ``profiles`` (every profile if empty) and for ``kernels`` (every kernel of the family
    if empty) the key takes only ``values``; ``why`` says why."""

    values: tuple[Any, ...]
    why: str
    profiles: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    label: str = ""  # how the docs name the kernels ("the BF16 kernels"); default: their names

    def applies(self, kernel: str, profile: str) -> bool:
        return (not self.profiles or profile in self.profiles) and (not self.kernels or kernel in self.kernels)


@dataclass(frozen=True)
class Key:
    """One key of a family's specification.

    kind: ``int``, ``float``, ``str``, ``bool`` or ``ints`` (a list of integers, ``length`` long).
    default: a value, or a function of the resolved :class:`Params` (``default_doc`` says how);
    ``None`` with ``nullable`` means "none".  lo / hi: inclusive range (numbers; for ``ints`` each
    element).  choices: the allowed values.  kernels / profiles: who reads the key (empty: every
    kernel / profile of the family); ``when`` (with ``when_doc``) narrows it by other keys.
    only: restrictions of the allowed values by profile or kernel.  shape: the key is part of the
    case's real shape (shown next to the case id).
    """

    name: str
    kind: str
    doc: str
    default: Any = None
    default_doc: str = ""
    lo: float | None = None
    hi: float | None = None
    choices: tuple[Any, ...] | None = None
    length: int | None = None
    nullable: bool = False
    kernels: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    when: Callable[[Params], bool] | None = None
    when_doc: str = ""
    only: tuple[Only, ...] = ()
    shape: bool = False

    def read_by(self, params: Params) -> bool:
        """Whether a case with these (partly resolved) parameters reads the key."""
        if self.kernels and params.kernel not in self.kernels:
            return False
        if self.profiles and params.profile not in self.profiles:
            return False
        return self.when is None or bool(self.when(params))

    def resolve_default(self, params: Params) -> Any:
        return self.default(params) if callable(self.default) else self.default


@dataclass(frozen=True)
class Rule:
    """A check that involves several keys: ``check(params)`` returns an error text or None."""

    doc: str
    check: Callable[[Params], str | None]
    keys: tuple[str, ...] = ()  # the keys it involves (named in the error)


@dataclass(frozen=True)
class Schema:
    """A family's keys: ``kernels`` maps each kernel the family builds to the profiles it is
    generated under (``why_not`` says why a kernel is not generated under another profile)."""

    family: str
    doc: str
    kernels: Mapping[str, tuple[str, ...]]
    keys: tuple[Key, ...]
    rules: tuple[Rule, ...] = ()
    why_not: Mapping[str, str] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)  # common misspellings -> key

    def key(self, name: str) -> Key | None:
        return next((k for k in self.keys if k.name == name), None)

    def shape_keys(self, params: Params) -> dict[str, Any]:
        """The case's real shape: the resolved values of the ``shape`` keys it reads."""
        return {k.name: params[k.name] for k in self.keys if k.shape and k.name in params}


class Params(Mapping[str, Any]):
    """The resolved keys of one case (given values and defaults), with its kernel and profile."""

    def __init__(self, kernel: str, profile: str, values: Mapping[str, Any] | None = None) -> None:
        self.kernel = kernel
        self.profile = profile
        self._values: dict[str, Any] = dict(values or {})

    @property
    def ascend(self) -> bool:
        return self.profile == "ascend950"

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def set(self, key: str, value: Any) -> None:
        self._values[key] = value

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __repr__(self) -> str:
        return f"Params({self.kernel!r}, {self.profile!r}, {self._values!r})"


COMMON_KEYS = ("id", "kernel", "profile", "seed", "family", "values", "value_draw", "row_offsets")


def did_you_mean(word: str, candidates: Sequence[str], aliases: Mapping[str, str] | None = None) -> list[str]:
    """Near misses of ``word`` among ``candidates``: an alias, close spellings, or a candidate that
    is one of the word's ``_``-separated parts (``a_dtype`` -> ``a``, ``num_groups`` -> ``groups``)."""
    out: list[str] = []
    if aliases and word in aliases and aliases[word] in candidates:
        out.append(aliases[word])
    lower = {c.lower(): c for c in candidates}
    out += [lower[m] for m in difflib.get_close_matches(word.lower(), list(lower), n=3, cutoff=0.6)]
    parts = [p for p in word.lower().replace("-", "_").split("_") if p]
    if len(parts) > 1:
        out += [lower[p] for p in parts if p in lower]
    seen: list[str] = []
    for c in out:
        if c not in seen:
            seen.append(c)
    return seen[:3]


def _suggest(word: str, candidates: Sequence[str], aliases: Mapping[str, str] | None = None) -> str:
    near = did_you_mean(word, candidates, aliases)
    return f"; did you mean {' or '.join(repr(c) for c in near)}?" if near else ""


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, (list, tuple)):
        return "a list"
    if isinstance(v, Mapping):
        return "a table"
    return type(v).__name__


def _show(v: Any) -> str:
    """A value as a specification file writes it (JSON: true, false, null, "text" as 'text')."""
    if v is None or isinstance(v, bool):
        text = json.dumps(v)
    elif isinstance(v, (list, tuple)):
        text = "[" + ", ".join(_show(x) for x in v) + "]"
    else:
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def as_int(v: Any) -> int | None:
    """An integer, or a float with an integral value (16.0 -> 16); None otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return int(v)
    return None


def _range_text(key: Key) -> str:
    if key.lo is not None and key.hi is not None:
        return f"in [{_num(key.lo)}, {_num(key.hi)}]"
    if key.lo is not None:
        return f">= {_num(key.lo)}"
    if key.hi is not None:
        return f"<= {_num(key.hi)}"
    return ""


def _num(x: float) -> str:
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 2**53):
        n = int(x)
        return "2^31 - 1" if n == MAX_DIM else ("2^63 - 1" if n == MAX_SEED else str(n))
    return repr(x)


def expected_text(key: Key) -> str:
    """What the key accepts, in words (for error messages and the docs)."""
    if key.choices is not None:
        text = "one of " + ", ".join(_show(c) for c in key.choices)
    else:
        text = _KINDS[key.kind]
        if key.kind == "ints" and key.length is not None:
            text = f"a list of {key.length} integers"
        rng = _range_text(key)
        if rng:
            text += (" each " if key.kind == "ints" else " ") + rng
    if key.nullable:
        text += " or null"
    return text


def normalise_value(key: Key, value: Any) -> tuple[Any, str | None]:
    """(the value in canonical form, None) or (None, what is wrong)."""
    if value is None:
        return (None, None) if key.nullable else (None, f"expected {expected_text(key)}; got null")
    if key.kind == "int":
        iv = as_int(value)
        if iv is None:
            why = "a non-integral number" if isinstance(value, float) else _type_name(value)
            return None, f"expected {expected_text(key)}; got {why} {_show(value)}"
        value = iv
    elif key.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, f"expected {expected_text(key)}; got {_type_name(value)} {_show(value)}"
        value = float(value)
        if not math.isfinite(value):
            return None, f"expected a finite number; got {value!r}"
    elif key.kind == "str":
        if not isinstance(value, str):
            return None, f"expected {expected_text(key)}; got {_type_name(value)} {_show(value)}"
    elif key.kind == "bool":
        if not isinstance(value, bool):
            return None, f"expected true or false; got {_type_name(value)} {_show(value)}"
    elif key.kind == "ints":
        if not isinstance(value, (list, tuple)):
            return None, f"expected {expected_text(key)}; got {_type_name(value)} {_show(value)}"
        items = [as_int(v) for v in value]
        if any(v is None for v in items):
            return None, f"expected {expected_text(key)}; got {_show(value)}"
        if key.length is not None and len(items) != key.length:
            return None, f"expected {expected_text(key)}; got {len(items)} items {_show(value)}"
        value = [int(v) for v in items if v is not None]
    else:  # pragma: no cover - a schema bug
        raise AssertionError(f"unknown key kind {key.kind!r}")
    numbers = value if key.kind == "ints" else ([value] if key.kind in ("int", "float") else [])
    for x in numbers:
        if (key.lo is not None and x < key.lo) or (key.hi is not None and x > key.hi):
            return None, f"expected {expected_text(key)}; got {_show(value)}"
    if key.choices is not None and value not in key.choices:
        hint = _suggest(value, [c for c in key.choices if isinstance(c, str)]) if isinstance(value, str) else ""
        return None, f"expected {expected_text(key)}; got {_show(value)}{hint}"
    return value, None


def _readers(key: Key, schema: Schema) -> str:
    """Who reads a key, in words."""
    if key.kernels:
        who = ("kernels " + ", ".join(key.kernels)) if len(key.kernels) > 1 else "kernel " + key.kernels[0]
    else:
        who = f"every {schema.family} kernel"
    if key.profiles:
        who += " under " + " / ".join(key.profiles)
    if key.when_doc:
        who += f" ({key.when_doc})"
    return who


def validate_params(schema: Schema, kernel: str, profile: str, given: Mapping[str, Any],
                    where: str) -> tuple[dict[str, Any], Params]:
    """Check ``given`` (the family keys of one case) against ``schema``.

    Returns (the given keys in canonical form, every key the case reads with its default filled
    in).  Raises :class:`SpecError` listing every problem found, one a line, each prefixed by
    ``where`` and naming its key (see :func:`collect_params`).
    """
    canonical, params, problems = collect_params(schema, kernel, profile, given, where)
    if problems:
        raise spec_error(problems)
    return canonical, params


def spec_error(problems: Sequence[str]) -> SpecError:
    """One :class:`SpecError` for a case's problems (one a line); ``.problems`` holds the list."""
    err = SpecError("\n".join(problems))
    err.problems = list(problems)  # type: ignore[attr-defined]
    return err


def collect_params(schema: Schema, kernel: str, profile: str, given: Mapping[str, Any],
                   where: str) -> tuple[dict[str, Any], Params, list[str]]:
    """:func:`validate_params` without raising: (canonical keys, resolved keys, every problem).

    Every given key is checked on its own (unknown, not read, wrong type or range, a value the
    kernel does not take under the profile); a key that is wrong takes its default for the checks
    that follow, and the checks across keys (:class:`Rule`) run only when each key is right by
    itself (so that one wrong value is not reported twice).
    """
    problems: list[str] = []
    names = [k.name for k in schema.keys]
    for name in given:
        if schema.key(name) is None:
            problems.append(f"{where}: unknown key {name!r} for the {schema.family} family (keys: "
                            f"{', '.join(names) or 'none'}){_suggest(name, names, schema.aliases)}")
    canonical: dict[str, Any] = {}
    params = Params(kernel, profile)
    # The given values first (so that a default may depend on any given key), then the defaults
    # of the keys the case reads, in the schema's order.
    for key in schema.keys:
        if key.name not in given:
            continue
        try:
            reads = key.read_by(params)
        except KeyError:  # a condition on a key already reported
            if not problems:
                raise
            continue
        if not reads:
            problems.append(f"{where}: key {key.name!r} is not read by {kernel} under {profile} "
                            f"(it is read by {_readers(key, schema)}); remove it")
            continue
        value, problem = normalise_value(key, given[key.name])
        if problem is not None:
            problems.append(f"{where}: key {key.name!r}: {problem}")
            continue
        bad = False
        for only in key.only:
            if only.applies(kernel, profile) and value not in only.values:
                allowed = ", ".join(_show(v) for v in only.values)
                problems.append(f"{where}: key {key.name!r}: {kernel} under {profile} takes only {allowed} "
                                f"({only.why}); got {_show(value)}")
                bad = True
                break
        if bad:
            continue
        canonical[key.name] = value
        params.set(key.name, value)
    for key in schema.keys:
        if key.name in params:
            continue
        try:
            if not key.read_by(params):
                continue
            if key.default is None and not key.nullable:
                if key.name not in given:  # (a given wrong value is reported above)
                    problems.append(f"{where}: missing key {key.name!r} ({expected_text(key)}: {key.doc})")
                continue
            params.set(key.name, key.resolve_default(params))
        except KeyError:  # a condition or default that depends on a key already reported
            if not problems:
                raise
    params = Params(kernel, profile, {k.name: params[k.name] for k in schema.keys if k.name in params})
    if problems:
        return canonical, params, problems
    for rule in schema.rules:
        problem = rule.check(params)
        if problem is not None:
            named = f"key{'s' if len(rule.keys) > 1 else ''} {', '.join(map(repr, rule.keys))}: " if rule.keys else ""
            problems.append(f"{where}: {named}{problem}")
    return canonical, params, problems


def describe_key(key: Key, schema: Schema) -> dict[str, str]:
    """One key as text fields: type, allowed values, default, read by, restrictions."""
    if callable(key.default):
        default = key.default_doc or "derived"
    elif key.default is None:
        default = key.default_doc or ("none" if key.nullable else "required")
    else:
        default = _show(key.default) + (f" ({key.default_doc})" if key.default_doc else "")
    restrictions = "; ".join(
        ("under " + "/".join(o.profiles) if o.profiles else "")
        + (" " if o.profiles and o.kernels else "")
        + (("for " + (o.label or ", ".join(o.kernels))) if o.kernels else "")
        + f": only {', '.join(_show(v) for v in o.values)} ({o.why})" for o in key.only)
    return {"name": key.name, "type": expected_text(key), "default": default,
            "read_by": _readers(key, schema), "only": restrictions, "doc": key.doc}


def common_key_docs() -> list[dict[str, str]]:
    """The keys every specification has."""
    return [
        {"name": "id", "type": f"a string of 1 to {MAX_ID_LENGTH} bytes naming a file", "default": "required",
         "doc": "the case id; also seeds the case's inputs (crc32 of the id; not under value_draw 'position') "
                "and names its file "
                "(characters other than letters, digits, '-', '_' and '.' become '_'; two ids giving one "
                "file name, ignoring case, are refused)"},
        {"name": "kernel", "type": "a kernel name (see the families below)", "default": "required",
         "doc": "the public function the case calls"},
        {"name": "profile", "type": "one of " + ", ".join(map(repr, PROFILES)), "default": "required",
         "doc": "the arch profile the case is generated and replayed under"},
        {"name": "seed", "type": f"an integer in [0, {_num(MAX_SEED)}]", "default": "0",
         "doc": "seed of the case's generator: PCG64(SeedSequence(seed, spawn_key=(crc32(id),))); under "
                "value_draw 'position', of its positional streams (deepgemm_ref/golden/values.py)"},
        {"name": "family", "type": "a family name", "default": "the kernel's family",
         "doc": "only where a kernel has a second builder (the probe cases of fp8_gemm_nt)"},
        {"name": "values", "type": "one of 'normal', 'adversarial', 'special'", "default": "'normal'",
         "doc": "how the input values are drawn: 'normal' as DeepGEMM's test generators; 'adversarial' (rounding "
                "ties, cancelling pairs, rows scaled across the exponent range, scale factors across the UE8M0 "
                "range); 'special' (NaN, infinities and -0 in the operands that can hold them); the shapes and "
                "layouts are drawn alike (deepgemm_ref/golden/values.py)"},
        {"name": "value_draw", "type": "one of 'stream', 'position'", "default": "'stream'",
         "doc": "what each input value is keyed by: 'stream' draws them all from the case's generator in the "
                "builder's order; 'position' draws each value from a stream keyed by the seed, the builder's draw "
                "and the element's position (not the id), so an element is the same whatever the shape: a property "
                "test's failing rows survive shrinking (deepgemm_ref.strategies draws 'position')"},
        {"name": "row_offsets", "type": "a list of at most 16 integers in [0, 2^31)", "default": "[]",
         "doc": "value_draw 'position' only: row i of the leading axis of the builder's n-th draw (of 2 or more "
                "axes) is row row_offsets[n] + i of its positional streams (0 past the end), so a shrinker can drop "
                "an operand's leading rows and keep the rest (deepgemm_ref.strategies draws them)"},
    ]


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(schemas: Sequence[Schema]) -> str:
    """The case-specification reference (docs/case-specs.md)."""
    out = ["# Case specifications", "",
           "Generated by `python docs/gen_case_specs.py` from the schemas in `deepgemm_ref/golden`; do not edit "
           "by hand.  `deepgemm-ref list -v` prints the same tables.", "",
           "A specification file is a JSON list of case tables, or a JSON / TOML table with a `cases` list.  "
           "Every key is checked: an unknown key, a value of the wrong type, a non-integral number where an "
           "integer is expected, a value out of range or not allowed for the kernel and profile, or a key "
           "the kernel does not read is refused (exit 2) with the case id, the key, what is allowed and, for "
           "near misses, what was probably meant.  Defaults are filled in from these tables; the manifest "
           "records each case's resolved keys (`params`) and its real shape (`shape`).", "",
           "## Keys of every case", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for d in common_key_docs():
        out.append(f"| `{d['name']}` | {_md(d['type'])} | {_md(d['default'])} | {_md(d['doc'])} |")
    out.append("")
    for schema in schemas:
        out += [f"## Family `{schema.family}`", "", schema.doc, "", "| kernel | profiles |", "| --- | --- |"]
        for kernel, profiles in schema.kernels.items():
            note = schema.why_not.get(kernel, "")
            out.append(f"| `{kernel}` | {', '.join(profiles)}{' (' + _md(note) + ')' if note else ''} |")
        out += ["", "| key | type | default | read by | meaning |", "| --- | --- | --- | --- | --- |"]
        for key in schema.keys:
            d = describe_key(key, schema)
            doc = d["doc"] + (f"  Restricted {d['only']}." if d["only"] else "")
            out.append(f"| `{d['name']}` | {_md(d['type'])} | {_md(d['default'])} | {_md(d['read_by'])} | {_md(doc)} |")
        if schema.rules:
            out += ["", "Checks across keys:", ""]
            out += [f"- {rule.doc}" for rule in schema.rules]
        out.append("")
    return "\n".join(out).rstrip() + "\n"
