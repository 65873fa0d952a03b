"""Signature parity with DeepGEMM 2.6.1 and DeepGEMM-Ascend, under the matching profile.

The reference tables are the package data ``deepgemm_ref/spec/deepgemm-signatures.json`` and
``deepgemm-ascend-signatures.json`` (derived from the real libraries' sources).  Every name must
exist with the same parameter names, order, kinds and defaults, except the differences listed in
the "Signature differences" table of docs/compatibility.md, which must match exactly what the
code does: nothing differs silently, and nothing is listed that does not differ.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import deepgemm_ref as dg
from deepgemm_ref import names

ROOT = Path(__file__).resolve().parent.parent
KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "positional_only",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional_or_keyword",
    inspect.Parameter.KEYWORD_ONLY: "keyword_only",
    inspect.Parameter.VAR_POSITIONAL: "var_positional",
    inspect.Parameter.VAR_KEYWORD: "var_keyword",
}


def _fmt_default(v: object) -> str | None:
    if v is inspect.Parameter.empty:
        return None
    return repr(v)


def _ours(obj: object) -> list[tuple[str, str | None, str]]:
    sig = inspect.signature(obj)  # classes: __init__ without self
    return [(p.name, _fmt_default(p.default), KINDS[p.kind]) for p in sig.parameters.values()]


def _difference(entry: names.SignatureEntry, obj: object) -> str:
    if obj is None:
        return "missing"
    if entry.kind in ("module", "constant"):
        return ""
    try:
        ours = _ours(obj)
    except (TypeError, ValueError):
        return "no signature"
    ref = [(p["name"], p["default"], p["kind"]) for p in entry.params]
    if ours == ref:
        return ""
    diffs = []
    ref_names = [r[0] for r in ref]
    our_names = [o[0] for o in ours]
    for r in ref:
        if r[0] not in our_names:
            diffs.append(f"-{r[0]}")
    for o in ours:
        if o[0] not in ref_names:
            diffs.append(f"+{o[0]}={o[1]}" if o[1] is not None else f"+{o[0]}")
    common_ref = [r for r in ref if r[0] in our_names]
    common_our = [o for o in ours if o[0] in ref_names]
    if [r[0] for r in common_ref] != [o[0] for o in common_our]:
        diffs.append("order")
    for r, o in zip(common_ref, [dict((x[0], x) for x in ours)[r[0]] for r in common_ref], strict=True):
        if r[1] != o[1]:
            diffs.append(f"~{r[0]} default {o[1]} (reference {r[1]})")
        if r[2] != o[2]:
            diffs.append(f"~{r[0]} kind {o[2]} (reference {r[2]})")
    return "; ".join(diffs)


def _documented() -> dict[tuple[str, str], str]:
    text = (ROOT / "docs" / "compatibility.md").read_text()
    section = text.split("## Signature differences", 1)[1] if "## Signature differences" in text else ""
    out = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*(deepgemm|deepgemm-ascend)\s*\|\s*`([^`]+)`\s*\|\s*`([^`]*)`\s*\|", line)
        if m:
            out[(m.group(1), m.group(2))] = m.group(3)
    return out


@pytest.mark.parametrize("target,arch", [("deepgemm", "sm90"), ("deepgemm", "sm100"), ("deepgemm-ascend", "ascend950")])
def test_signature_parity(target, arch):
    """Every reference name under every profile of its target: the one signature-parity test."""
    documented = {k[1]: v for k, v in _documented().items() if k[0] == target}
    actual = {}
    with dg.numerics(arch=arch):
        for entry in names.reference_entries(target):
            if entry.module.startswith("deep_gemm.legacy"):
                continue  # the Triton A100 kernels: not emulated (README, "Not implemented")
            diff = _difference(entry, names.resolve(entry, dg))
            if diff:
                actual[entry.qualified] = diff
    undocumented = {k: v for k, v in actual.items() if documented.get(k) != v}
    stale = {k: v for k, v in documented.items() if k not in actual}
    assert not undocumented, f"signature differences not listed in docs/compatibility.md: {undocumented}"
    assert not stale, f"listed in docs/compatibility.md but not (or no longer) different: {stale}"


def test_names_missing_under_the_other_target_raise_saying_so():
    """Hidden from the namespace (deepgemm_ref.namespace); the objects themselves, reached through
    the module dictionary or a reference taken under another profile, raise the argument error."""
    with dg.numerics(arch="ascend950"):
        for name in ("m_grouped_fp8_fp4_gemm_nt_masked", "fp8_gemm_nt_skip_head_mid", "set_tc_util"):
            assert not hasattr(dg, name)
            with pytest.raises(dg.DGArgumentError, match="not provided by DeepGEMM-Ascend"):
                vars(dg)[name]()
    with dg.numerics(arch="sm100"):
        with pytest.raises(dg.DGArgumentError, match="not provided by DeepGEMM 2.6.1"):
            vars(dg)["set_npu_arch"](3510)


@pytest.mark.parametrize("target,arch", [("deepgemm", "sm100"), ("deepgemm-ascend", "ascend950")])
def test_every_missing_name_raises_not_implemented_with_its_reason(target, arch):
    _, missing = names.implementation_status(target, dg)
    entries = {e.qualified: e for e in names.reference_entries(target)}
    assert missing
    with dg.numerics(arch=arch):
        for qualified, reason in missing.items():
            obj = names.resolve(entries[qualified], dg)
            with pytest.raises(NotImplementedError) as info:
                obj(*([None] * len(entries[qualified].params)))
            assert reason in str(info.value) and entries[qualified].name in str(info.value)
