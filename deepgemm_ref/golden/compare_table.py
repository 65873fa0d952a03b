"""msprobe's compare table beside the exact-golden verdict, and threshold tables (issue 28, items 4-5).

``deepgemm-ref check --compare-table FILE.csv`` writes one row per checked output with the
columns MindStudio Probe's ``msprobe compare`` writes for a PyTorch tensor dump (``NPU Name``,
``Bench Name``, dtypes, shapes, ``Cosine``, ``EucDist``, ``MaxAbsErr``, ``MaxRelativeErr``,
``One Thousandth Err Ratio``, ``Five Thousandths Err Ratio``, the max / min / mean / l2norm of
each side), computed the way msprobe 26.2 computes them, plus ``Accuracy Reached or Not`` by
msprobe's ``check_accuracy`` rule, next to this package's own columns (the bound's status, its
failing / warning / range counts, the bias test, the maximum normalised error, the worst element,
the threshold table's verdict and, with ``--diagnose``, the diagnosis).

How msprobe computes its columns (the facts this module reproduces; docs/compare-table.md):

* the tensors are read as msprobe's PyTorch reader reads a ``.pt``: bf16 and FP8 as float32,
  other dtypes unchanged, size-1 axes squeezed;
* NaN / infinity: where the NaN and the infinity positions of the two sides agree (the sign of an
  infinity is not compared), those elements become 0 on both sides; where they do not, every
  metric column reads ``N/A`` (and the accuracy rule says ``No``);
* Cosine ``= x.y / (|x| |y|)`` in float64; 1 when both norms are at most float64's epsilon,
  ``Nan`` when one is; values above 0.9999 rounded to 6 decimals;
* EucDist ``= |x - y|_2`` and MaxAbsErr ``= max |x - y|`` in float64;
* the relative error ``|x - y| / |y|`` is computed in float32 for float16 / bf16 / FP8 / float32
  data (float64 for float64 and non-float data), with the dtype's epsilon added to both sides
  where ``y == 0``; MaxRelativeErr is its maximum, the err ratios are the shares of elements
  whose relative error is *below* 0.001 and 0.005 (the share that agrees, not that errs);
* every column but EucDist is rounded to 12 decimals (msprobe's ``format_value``);
* a 0-d tensor (one element) has no Cosine, EucDist or ratios (``unsupported``); an empty one
  no column at all.

Elements the kernel's contract leaves undefined (the bundle's ``defined`` mask) are set, on
both sides, to the golden's value (0 where that is not finite) before any msprobe column is
computed, exactly as ``deepgemm-ref export --format msprobe`` writes them: they add no error to
any column (EucDist, MaxAbsErr, MaxRelativeErr see none there), so the table is msprobe's own
compare of the exported dumps, row for row.  The threshold verdict and the bound leave them out.

Row names are msprobe's: ``DeepGEMM.<kernel>.<case id>.forward.output.<output>``
(:func:`msprobe_api_name`: :func:`.export.api_name`, the one place this name is made).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DGArgumentError
from .bias import describe_bias
from .bundle import Bundle, atomic_write_text
from .check import CaseReport, family_view, output_golden
from .export import api_name, encode_name
from .text import count, plural

__all__ = ["msprobe_api_name", "torch_dtype_name", "msprobe_values",
           "msprobe_read", "msprobe_metrics", "check_accuracy", "tensor_statistics", "statistics_columns",
           "ThresholdRule", "ThresholdTable", "CANN_DEFAULT", "load_thresholds", "threshold_verdict", "compare_rows",
           "write_compare_table", "MSPROBE_COLUMNS", "METRIC_COLUMNS", "describe_thresholds"]

#: msprobe's metric columns, in its order.
METRIC_COLUMNS = ("Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                  "Five Thousandths Err Ratio")
#: The msprobe columns of the table (its PyTorch compare's, less Requires_grad, Result, Err_message
#: and Data_name), then the accuracy rule.
MSPROBE_COLUMNS = ("NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
                   *METRIC_COLUMNS, "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min",
                   "Bench mean", "Bench l2norm", "Accuracy Reached or Not")
#: This package's columns.
OUR_COLUMNS = ("Output", "Bound Status", "Checked", "Failing", "Warning", "Range Allowed", "Undefined",
               "Bias log10 p", "Bias", "Max Normalised Error", "Worst Element")
THRESHOLD_COLUMNS = ("Thresholds Status", "Thresholds Violating", "Thresholds Rule")



# ----------------------------------------------------------------------------------------------
# names
# ----------------------------------------------------------------------------------------------

def msprobe_api_name(kernel: str, case_id: str) -> str:
    """msprobe's API name of one case, ``DeepGEMM.<kernel>.<case id>.forward``: the name
    :func:`.export.api_name` gives the case's dump (one definition); an output's row is
    ``<api>.output.<encoded output name>``."""
    return api_name(kernel, case_id)


_TORCH_NAMES = {"float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "float8_e8m0fnu": "float8_e8m0fnu",
                "bool": "bool"}


def torch_dtype_name(dtype: Any) -> str:
    """The ``torch.<dtype>`` name msprobe prints for a NumPy (or ml_dtypes) dtype."""
    name = np.dtype(dtype).name
    return "torch." + _TORCH_NAMES.get(name, name)


# ----------------------------------------------------------------------------------------------
# msprobe's columns
# ----------------------------------------------------------------------------------------------

def msprobe_values(device: np.ndarray, golden: np.ndarray,
                   defined: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(device, golden) as the msprobe export writes them: undefined elements set on both sides
    to the golden's value, 0 where that is not finite (same dtypes and shapes)."""
    if defined is None or bool(np.all(defined)):
        return device, golden
    keep = np.asarray(defined, bool)
    with np.errstate(invalid="ignore"):
        fill = np.where(np.isfinite(golden.astype(np.float64)), golden, np.zeros_like(golden))
    return np.where(keep, device, fill).astype(device.dtype), np.where(keep, golden, fill).astype(golden.dtype)


def msprobe_read(x: np.ndarray) -> np.ndarray:
    """A tensor as msprobe's PyTorch reader hands it to the algorithms: bf16 and FP8 as float32,
    other dtypes unchanged, size-1 axes squeezed."""
    x = np.asarray(x)
    name = x.dtype.name
    if name == "bfloat16" or name.startswith("float8"):
        x = x.astype(np.float32)
    return np.squeeze(x)


def _fmt(x: Any) -> float:
    """msprobe's ``format_value``: rounded to 12 decimals."""
    return float(f"{float(x):.12f}")


_FLOAT_TYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.longdouble))


def _relative_error(n: np.ndarray, b: np.ndarray) -> np.ndarray:
    """msprobe's relative error: float32 for float16 / float32 data, float64 otherwise, the
    dtype's epsilon added to both sides where the bench value is 0."""
    if n.dtype not in _FLOAT_TYPES:
        n = n.astype(np.float64)
    if b.dtype not in _FLOAT_TYPES:
        b = b.astype(np.float64)
    zero = b == 0
    rt = np.result_type(n, b, np.float32)
    nn, bb = n.astype(rt), b.astype(rt)
    eps = np.finfo(rt).eps
    nn[zero] += eps
    bb[zero] += eps
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.abs(np.divide(nn - bb, bb))


def msprobe_metrics(npu: np.ndarray, bench: np.ndarray) -> dict[str, float | str]:
    """msprobe's six metric columns for two tensors of one shape (as :func:`msprobe_read` gives
    them; see the module docstring): floats, or msprobe's words ``unsupported``, ``Nan``,
    ``N/A``."""
    n, b = np.array(npu), np.array(bench)  # copies: NaN / inf positions are zeroed below
    if n.size == 0:
        return dict.fromkeys(METRIC_COLUMNS, "unsupported")
    out: dict[str, float | str] = {}
    if n.ndim == 0:  # one element: no cosine, distance or ratios (msprobe skips the NaN check too)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = float(np.abs(n.astype(np.float64) - b.astype(np.float64)))
            rel1 = float(_relative_error(n, b))
        out = dict.fromkeys(METRIC_COLUMNS, "unsupported")
        out["MaxAbsErr"] = "Nan" if math.isnan(diff) else _fmt(diff)
        out["MaxRelativeErr"] = "Nan" if math.isnan(rel1) else _fmt(rel1)
        return out
    n64, b64 = n.astype(np.float64), b.astype(np.float64)
    n_inf, b_inf, n_nan, b_nan = np.isinf(n64), np.isinf(b64), np.isnan(n64), np.isnan(b64)
    if n_inf.any() or n_nan.any() or b_inf.any() or b_nan.any():
        if not (np.array_equal(n_inf, b_inf) and np.array_equal(n_nan, b_nan)):
            return dict.fromkeys(METRIC_COLUMNS, "N/A")
        bad = n_inf | n_nan
        n[bad] = 0
        b[bad] = 0
        n64, b64 = n.astype(np.float64), b.astype(np.float64)
    x, y = n64.reshape(-1), b64.reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        num = np.dot(x, y)
        nx, ny = np.linalg.norm(x), np.linalg.norm(y)
        eps = np.finfo(np.float64).eps
        if nx <= eps and ny <= eps:
            out["Cosine"] = 1.0
        elif nx <= eps or ny <= eps:
            out["Cosine"] = "Nan"
        else:
            cos = num / (nx * ny)
            if np.isnan(cos):
                out["Cosine"] = "Nan"
            else:
                c = _fmt(cos)
                out["Cosine"] = round(c, 6) if c > 0.9999 else c
        out["EucDist"] = float(np.linalg.norm(x - y, ord=2))
        mx = np.max(np.abs(x - y))
        out["MaxAbsErr"] = "Nan" if np.isnan(mx) else _fmt(mx)
        rel = _relative_error(n, b)
        mr = np.max(rel)
        out["MaxRelativeErr"] = "Nan" if np.isnan(mr) else _fmt(mr)
        for col, thr in (("One Thousandth Err Ratio", 0.001), ("Five Thousandths Err Ratio", 0.005)):
            out[col] = _fmt(np.sum(rel < thr) / rel.size)
    return out


def check_accuracy(cosine: float | str, max_abs_err: float | str) -> str:
    """msprobe's ``check_accuracy``: ``No`` when Cosine < 0.99 and MaxAbsErr > 0.001, or Cosine <
    0.9, or MaxAbsErr > 1 (or either is ``N/A``); ``None`` when either is no number; else
    ``Yes``."""
    if cosine == "N/A" or max_abs_err == "N/A":
        return "No"
    try:
        cos, mae = float(cosine), float(max_abs_err)
    except ValueError:
        return "None"
    if cos < 0.99 and mae > 0.001:
        return "No"
    if cos < 0.9 or mae > 1:
        return "No"
    return "Yes"


def tensor_statistics(x: np.ndarray) -> tuple[float, float, float, float] | None:
    """(max, min, mean, l2 norm) of the values in float64 (the ``Max``, ``Min``, ``Mean``,
    ``Norm`` an msprobe dump records); None for an empty tensor."""
    v = np.asarray(x).astype(np.float64).reshape(-1)
    if v.size == 0:
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        return float(v.max()), float(v.min()), float(v.mean()), float(np.linalg.norm(v))


def statistics_columns(x: np.ndarray, side: str) -> dict[str, float | str]:
    """``<side> max`` / ``min`` / ``mean`` / ``l2norm`` of :func:`tensor_statistics`, NaN written
    ``Nan`` as msprobe writes it (empty for an empty tensor)."""
    stats = tensor_statistics(x)
    return {f"{side} {key}": ("" if stats is None else "Nan" if math.isnan(stats[i]) else stats[i])
            for i, key in enumerate(("max", "min", "mean", "l2norm"))}


# ----------------------------------------------------------------------------------------------
# threshold tables
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ThresholdRule:
    """An element violates when ``|d - g| > atol`` and ``|d - g| > rtol |g|`` (a NaN / infinity
    that differs from the golden's by class violates); an output fails when more than
    ``max_share`` of its checked elements violate."""

    atol: float = 1e-3
    rtol: float = 1e-3
    max_share: float = 1e-3

    def describe(self) -> str:
        return f"atol {self.atol:g}, rtol {self.rtol:g}, fails above {100 * self.max_share:g} % violating"


@dataclass(frozen=True)
class ThresholdTable:
    """Per output dtype (NumPy names: ``bfloat16``, ``float32``, ``float8_e4m3fn``, ...) a
    :class:`ThresholdRule`; ``default`` for the others.  ``source`` names where it came from."""

    default: ThresholdRule = ThresholdRule()
    dtypes: Mapping[str, ThresholdRule] = field(default_factory=dict)
    name: str = "CANN samples' rule"
    source: str = "built in"

    def rule(self, dtype: str) -> ThresholdRule:
        return self.dtypes.get(dtype, self.default)


#: The CANN operator samples' rule: atol = rtol = 1e-3, failing above 0.1 % violating elements.
CANN_DEFAULT = ThresholdTable()

_RULE_KEYS = ("atol", "rtol", "max_share")
_TOP_KEYS = ("name", "default", "dtype")
_MAX_TABLE_BYTES = 1 << 20


def _known_table(path: str, where: str, raw: Any, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """``raw`` as a table whose keys are all among ``keys`` (``where``: its place in the file, ""
    for the top level), else the argument error naming file, place and key."""
    at = f"{where}: " if where else ""
    if not isinstance(raw, Mapping):
        raise DGArgumentError(f"check: --thresholds {path}: {at}expected a table {'of' if where else 'with'} "
                              f"{', '.join(keys)}; got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise DGArgumentError(f"check: --thresholds {path}: {key}: unknown key (expected {', '.join(keys)})")
    return raw


def _rule(path: str, where: str, raw: Any, base: ThresholdRule) -> ThresholdRule:
    raw = _known_table(path, where, raw, _RULE_KEYS)
    vals = {k: getattr(base, k) for k in _RULE_KEYS}
    for k, v in raw.items():
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)) and float(v) >= 0
        if ok and k == "max_share":
            ok = float(v) <= 1
        if not ok:
            want = "a share in [0, 1]" if k == "max_share" else "a finite tolerance >= 0"
            raise DGArgumentError(f"check: --thresholds {path}: {where}.{k}: expected {want}; got {v!r}")
        vals[k] = float(v)
    return ThresholdRule(**vals)


def _dtype_key(path: str, key: str) -> str:
    from .. import dtypes  # noqa: F401  (registers ml_dtypes' names with NumPy)

    try:
        name = np.dtype(key).name
    except TypeError:
        name = ""
    if name != key:
        raise DGArgumentError(f"check: --thresholds {path}: dtype.{key}: not a NumPy dtype name (e.g. bfloat16, "
                              "float32, float8_e4m3fn, int32)")
    return name


def load_thresholds(path: str | os.PathLike[str]) -> ThresholdTable:
    """A threshold table from a TOML (``.toml``) or JSON file::

        name = "sgl-kernel-npu DeepEP tests"     # optional
        [default]                                # optional: the CANN samples' rule where absent
        atol = 1e-3
        rtol = 1e-3
        max_share = 1e-3                         # fails when more than this share violates
        [dtype.bfloat16]                         # keys missing here come from [default]
        atol = 1e-5
        rtol = 1e-5

    Strict: unknown keys, numbers that are not finite, negative tolerances, shares above 1 and
    unknown dtype names are refused (:class:`DGArgumentError` naming the file and the key)."""
    p = os.fspath(path)
    from .reading import read_table_file

    # a regular file of at most 1 MiB: never a FIFO or a device read without end
    data = read_table_file(p, "threshold table", "check: --thresholds", limit=_MAX_TABLE_BYTES)
    data = _known_table(p, "", data, _TOP_KEYS)
    name = data.get("name", os.path.basename(p))
    if not isinstance(name, str):
        raise DGArgumentError(f"check: --thresholds {p}: name: expected a string; got {name!r}")
    default = _rule(p, "default", data["default"], CANN_DEFAULT.default) if "default" in data else CANN_DEFAULT.default
    per = data.get("dtype", {})
    if not isinstance(per, Mapping):
        raise DGArgumentError(f"check: --thresholds {p}: dtype: expected a table of dtype tables; got "
                              f"{type(per).__name__}")
    dtypes = {_dtype_key(p, str(k)): _rule(p, f"dtype.{k}", v, default) for k, v in per.items()}
    return ThresholdTable(default, dtypes, name, p)


def threshold_verdict(device: np.ndarray, golden: np.ndarray, defined: np.ndarray | None,
                      rule: ThresholdRule) -> dict[str, Any]:
    """The rule's verdict on one output, over its defined elements: ``{"status", "violating",
    "checked", "share", "rule"}``."""
    keep = np.ones(golden.shape, bool) if defined is None else np.asarray(defined, bool)
    d = np.asarray(device).astype(np.float64)[keep]
    g = np.asarray(golden).astype(np.float64)[keep]
    fin = np.isfinite(d) & np.isfinite(g)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(d - g)
        viol = fin & (err > rule.atol) & (err > rule.rtol * np.abs(g))
    special = ~fin & ~((np.isnan(d) & np.isnan(g)) | (d == g))
    count = int(np.count_nonzero(viol | special))
    share = count / d.size if d.size else 0.0
    return {"status": "fail" if share > rule.max_share else "pass", "violating": count, "checked": int(d.size),
            "share": share, "rule": {"atol": rule.atol, "rtol": rule.rtol, "max_share": rule.max_share}}


def describe_thresholds(t: Mapping[str, Any]) -> str:
    """One clause: ``thresholds FAIL: 12 of 4096 elements violate (0.293 %) atol 1e-05, rtol ...``."""
    if t.get("error"):
        return f"thresholds {t['status'].upper()}: {t['error']}"
    r = t["rule"]
    verb = plural(t["violating"], "violates", "violate")
    return (f"thresholds {t['status'].upper()}: {t['violating']} of {count(t['checked'], 'element')} {verb} "
            f"({100 * t['share']:.3g} %; atol {r['atol']:g}, rtol {r['rtol']:g}, fails above "
            f"{100 * r['max_share']:g} %)")


# ----------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------

def _outputs_of(bundle: Bundle, outputs: Mapping[str, np.ndarray],
                case_id: str) -> Iterator[tuple[str, str, np.ndarray, np.ndarray, np.ndarray | None]]:
    """(output name, report id, device, golden, defined) of one case's present outputs, as the
    checker compares them (a family's own view where it has one)."""
    entry = bundle.cases[case_id]
    outs = entry["outputs"]
    main = entry.get("main_output") or next(iter(outs))
    names = [main] + [n for n in outs if n != main]
    single = set(outputs) == {""}
    keys = {name: ("" if single else f"{case_id}/{name}") for name in names}
    present = {name: outputs[keys[name]] for name in names if keys[name] in outputs}
    if not present:
        return
    golden = bundle.case(case_id).golden()
    view = family_view(entry, golden, present)
    for name in names:
        if name not in present:
            continue
        label = case_id if len(outs) == 1 else f"{case_id}/{name}"
        if view is None:
            g = output_golden(golden, name, main)
            dev = present[name]
        else:
            g, dev = view.goldens[name], view.device[name]
        defined = g.get("defined")
        yield name, label, np.asarray(dev), np.asarray(g["main"]), None if defined is None else np.asarray(defined)


def _worst_text(r: CaseReport) -> str:
    if not r.worst:
        return ""
    w = r.worst[0]
    return (f"{w['status']} at {tuple(w['index'])}: device {w['device']:.6g}, golden {w['golden']:.6g}, "
            f"normalised error {w['normalised_error']:.3g}")


def _diagnosis_text(d: Any) -> str:
    if d is None or d.status not in ("fail", "error"):
        return ""
    best = d.best
    return d.verdict if best is None else f"{best.name}: reproduces {100 * best.share:.1f}% ({d.verdict})"


def compare_rows(bundle: Bundle, outputs: Mapping[str, np.ndarray], reports: list[CaseReport], *,
                 thresholds: ThresholdTable | None = None,
                 diagnoses: list[Any] | None = None) -> list[dict[str, Any]]:
    """One row per report (:data:`MSPROBE_COLUMNS`, our columns, the threshold columns when
    ``thresholds`` is given, ``Diagnosis`` when ``diagnoses`` is); with ``thresholds`` each
    report's ``thresholds`` field is set to its :func:`threshold_verdict` (or a failure naming
    why the output could not be compared)."""
    by_id = {r.id: r for r in reports}
    verdicts = {d.id: d for d in diagnoses or []}
    computed: dict[str, dict[str, Any]] = {}
    case_of: dict[str, str] = {}
    for case_id in dict.fromkeys(cid for r in reports for cid in (r.id, r.id.rsplit("/", 1)[0])
                                 if cid in bundle.cases):
        kernel = str(bundle.cases[case_id].get("kernel", ""))
        for name, label, dev, gd, defined in _outputs_of(bundle, outputs, case_id):
            rep = by_id.get(label)
            if rep is None or rep.error is not None:
                continue
            case_of[label] = case_id
            row_name = f"{msprobe_api_name(kernel, case_id)}.output.{encode_name(name)}"
            npu, bench = msprobe_values(dev, gd, defined)
            row: dict[str, Any] = {"NPU Name": row_name, "Bench Name": row_name,
                                   "NPU Dtype": torch_dtype_name(dev.dtype), "Bench Dtype": torch_dtype_name(gd.dtype),
                                   "NPU Tensor Shape": str(list(dev.shape)), "Bench Tensor Shape": str(list(gd.shape))}
            row.update(msprobe_metrics(msprobe_read(npu), msprobe_read(bench)))
            row.update(statistics_columns(npu, "NPU"))
            row.update(statistics_columns(bench, "Bench"))
            row["Accuracy Reached or Not"] = check_accuracy(row["Cosine"], row["MaxAbsErr"])
            computed[label] = row
            if thresholds is not None:
                t = threshold_verdict(dev, gd, defined, thresholds.rule(gd.dtype.name))
                rep.thresholds = {**t, "table": thresholds.name, "text": describe_thresholds(t)}
    rows = []
    for r in reports:
        row = dict.fromkeys(MSPROBE_COLUMNS, "")
        row.update(computed.get(r.id, {}))
        if thresholds is not None and r.thresholds is None:
            t = {"status": "fail", "error": r.error or "not compared", "violating": 0, "checked": 0, "share": 0.0,
                 "rule": None}
            r.thresholds = {**t, "table": thresholds.name, "text": describe_thresholds(t)}
        row.update({"Output": r.id, "Bound Status": r.status, "Checked": r.checked, "Failing": r.failed,
                    "Warning": r.warned, "Range Allowed": r.range_allowed, "Undefined": r.undefined,
                    "Bias log10 p": "" if r.bias is None else float(r.bias["log10_p"]),
                    "Bias": "" if r.bias is None else describe_bias(r.bias),
                    "Max Normalised Error": "" if r.error else r.max_normalised_error,
                    "Worst Element": _worst_text(r)})
        if thresholds is not None:
            t = r.thresholds or {}
            row["Thresholds Status"] = t.get("status", "")
            row["Thresholds Violating"] = ("" if t.get("error") else
                                           f"{t['violating']} of {t['checked']} ({100 * t['share']:.3g} %)")
            rule = t.get("rule")
            row["Thresholds Rule"] = (t.get("error", "") if not rule else
                                      f"{thresholds.name}: {ThresholdRule(**rule).describe()}")
        if diagnoses is not None:
            cid = case_of.get(r.id, r.id if r.id in verdicts else r.id.rsplit("/", 1)[0])
            row["Diagnosis"] = _diagnosis_text(verdicts.get(cid)) if r.status == "fail" else ""
        row["Error"] = r.error or ""
        rows.append(row)
    return rows


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """The table's columns in order (those of the first row; all rows share them)."""
    return list(rows[0]) if rows else [*MSPROBE_COLUMNS, *OUR_COLUMNS, "Error"]


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def compare_csv(rows: list[dict[str, Any]]) -> str:
    """The table as CSV text (floats in Python's shortest round-trip form, as msprobe's pandas
    writes them)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = columns(rows)
    w.writerow(cols)
    for row in rows:
        w.writerow([_cell(row.get(c, "")) for c in cols])
    return buf.getvalue()


def xlsx_available() -> bool:
    """Whether openpyxl (the ``.xlsx`` writer) is installed."""
    try:
        import openpyxl  # noqa: F401
    except ImportError:
        return False
    return True


def write_compare_table(path: str | os.PathLike[str], rows: list[dict[str, Any]]) -> Path:
    """Write the table to ``path``: CSV, or an Excel workbook when the name ends in ``.xlsx``
    (needs openpyxl; non-finite numbers as text, Excel has none)."""
    out = Path(path)
    if out.suffix.lower() != ".xlsx":
        from .reading import printable

        atomic_write_text(out, printable(compare_csv(rows)))  # a lone surrogate as "\\ud800"
        return out
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "compare"
    cols = columns(rows)
    ws.append(cols)
    for row in rows:
        vals = []
        for c in cols:
            v = row.get(c, "")
            if isinstance(v, float) and not math.isfinite(v):
                v = repr(v)
            vals.append(v)
        ws.append(vals)
    from .paths import create_temp

    tmp, fd = create_temp(out)  # the umask's mode, a name within the file-name limit
    os.close(fd)
    try:
        wb.save(tmp)
        os.replace(tmp, out)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise OSError(e.errno, e.strerror or str(e), os.fspath(out)) from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return out


def rows_json(rows: list[dict[str, Any]]) -> str:
    """The table as strict JSON (non-finite numbers as strings)."""
    from .check import strict_json_value

    return json.dumps(strict_json_value(rows), indent=1, allow_nan=False)
