"""One golden case as a Python object: its inputs, its call through any module, its golden
values, the checker's verdict on a device's outputs, and the specification that regenerates it.

A :class:`Case` comes from a case specification (:meth:`Case.from_spec`, which is what the
hypothesis strategies of :mod:`deepgemm_ref.strategies` draw) or from a bundle
(:meth:`Case.from_bundle`, what the pytest plugin's ``--dg-bundle`` items hold).  Both go through
the workflow's own code: inputs from the family builders (:func:`.cases.build_case`), the call
through :func:`.replay.call_case` (the path of ``deepgemm-ref replay``: the module's own layout
transforms, its own setup and derived-input functions), goldens from
:func:`.call.compute_golden` (the emulator's exact model under trace capture, the path of
``deepgemm-ref golden``) and checks from :func:`.check.check_case`.  So a property test, a bundle
and a device replay agree byte for byte: ``golden --spec`` on :meth:`Case.to_spec` gives a bundle
with the case's inputs and goldens.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DGArgumentError
from ..interop import to_numpy
from ..settings import numerics
from ..testing.numeric import ulp_distance
from . import safetensors as st
from .bias import describe_bias
from .bundle import CaseData, case_entry, load_bundle
from .call import compute_golden, quiet_float_errors
from .cases import BuiltCase, CaseSpec, SpecError, build_case, validate_spec
from .check import (
    CaseReport,
    CheckOptions,
    apply_model_null,
    check_case,
    describe_options,
    element_bounds,
    family_range,
    family_view,
    output_golden,
)
from .emulator import emulator, is_emulator
from .replay import _check_device, call_case
from .text import class_mismatches
from .text import failing as failing_text

__all__ = ["Case", "Golden", "Comparison", "case_id_for"]


class Golden(dict[str, np.ndarray]):
    """A case's golden tensors by name: every output (``d``, ``logits``, ``y``, ...) in its dtype,
    and what the checker needs: ``acc`` (the exact accumulator, float64), ``acc_lo`` (its low
    part, float32 outputs), ``S`` (the error scale sum |a_i b_i| * scales, rounded up),
    ``S_hard`` (Mega MoE's wider deterministic scale), ``defined`` (bool: the elements the
    kernel's contract defines) and ``extra.<name>`` (second outputs' and stages' goldens).

    ``check``: the checker parameters (rounding-path length ``n``, ``epilogue``, ``c_epi``,
    ``u_acc``); ``main``: the main output's name; ``outputs``: every output's name; ``stats``:
    the golden computation's statistics.
    """

    check: dict[str, Any]
    main: str
    outputs: tuple[str, ...]
    stats: dict[str, Any]


def case_id_for(kernel: str, profile: str, params: Mapping[str, Any], shape: Mapping[str, Any], seed: int,
                values: str = "normal", value_draw: str = "stream", row_offsets: Sequence[int] = ()) -> str:
    """A readable, reproducible case id: kernel, profile, the real shape, and a checksum of every
    key (two cases that differ in any key get different ids; the id seeds the inputs under
    ``value_draw = "stream"``)."""
    key: dict[str, Any] = {"kernel": kernel, "profile": profile, "seed": seed, "params": dict(params)}
    if value_draw != "stream":
        key["value_draw"] = value_draw
    if list(row_offsets):
        key["row_offsets"] = list(row_offsets)
    body = json.dumps(key, sort_keys=True)
    dims = "-".join(f"{k}{v}" for k, v in shape.items() if isinstance(v, int))
    mode = "" if values == "normal" else f"-{values}"
    return f"{kernel}-{profile}{'-' + dims if dims else ''}{mode}-{zlib.crc32(body.encode()):08x}"


def _readonly(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, x in arrays.items():
        a = np.array(x, copy=True)
        a.setflags(write=False)
        out[name] = a
    return out


def _unpacked(x: Any) -> np.ndarray:
    """A stored tensor as the kernels take it (packed FP4 as its int8 bytes)."""
    return np.asarray(x.data if isinstance(x, st.PackedFP4) else x)


def _host(x: Any, name: str) -> np.ndarray:
    """A device output as a host NumPy array (torch tensors on any device are copied to the host)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
    return np.asarray(to_numpy(x, "assert_matches_golden", f"outputs[{name!r}]"))


class Case:
    """One golden case: ``kernel``, ``profile``, ``inputs`` (named read-only NumPy arrays, stored
    as the kernel API takes them: contiguous, user-form scales), and the call description.

    Build one with :meth:`from_spec` (a case specification, see ``docs/case-specs.md``) or
    :meth:`from_bundle`; the strategies of :mod:`deepgemm_ref.strategies` draw them.
    """

    def __init__(self, spec: CaseSpec | None, entry: Mapping[str, Any], inputs: Mapping[str, np.ndarray],
                 built: BuiltCase | None = None, golden: Golden | None = None) -> None:
        self.spec = spec
        self.entry: dict[str, Any] = dict(entry)
        self.inputs: dict[str, np.ndarray] = _readonly(inputs)
        self._built = built
        self._golden = golden

    # -- construction ------------------------------------------------------------------------

    @staticmethod
    def from_spec(spec: CaseSpec | Mapping[str, Any], *, max_memory: int | None = None) -> Case:
        """The case a specification describes (validated: :class:`.cases.SpecError` names the key),
        its inputs generated as ``deepgemm-ref golden`` generates them."""
        if not isinstance(spec, CaseSpec) or spec.values is None:
            spec = validate_spec(spec.to_dict() if isinstance(spec, CaseSpec) else spec)
        built = build_case(spec, max_memory=max_memory)
        entry = case_entry(built, {}, "", {})
        return Case(spec, entry, built.inputs, built=built)

    @staticmethod
    def from_bundle(case: CaseData) -> Case:
        """A case of a loaded bundle (``golden.load_bundle(path).case(case_id)``): its stored
        inputs and goldens (nothing is recomputed)."""
        try:
            spec: CaseSpec | None = validate_spec(case.entry["spec"])
        except (SpecError, KeyError):
            spec = None
        g = Golden(_readonly({k: _unpacked(v) for k, v in case.golden().items()}))
        inputs = {k: _unpacked(v) for k, v in case.inputs().items()}
        return Case(spec, case.entry, inputs, golden=_finish_golden(g, case.entry, case.entry.get("golden_stats", {})))

    @staticmethod
    def load(bundle_dir: Any, case_id: str) -> Case:
        """:meth:`from_bundle` of one case of the bundle at ``bundle_dir`` (verified on load)."""
        return Case.from_bundle(load_bundle(bundle_dir).case(case_id))

    # -- what it is ----------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return str(self.entry["id"])

    @property
    def kernel(self) -> str:
        return str(self.entry["kernel"])

    @property
    def profile(self) -> str:
        return str(self.entry["profile"])

    @property
    def seed(self) -> int:
        return int(self.entry.get("seed", self.spec.seed if self.spec is not None else 0))

    @property
    def values(self) -> str:
        """The value mode (``"normal"``, ``"adversarial"``, ``"special"``)."""
        if self.spec is not None:
            return self.spec.value_mode
        return str(self.entry.get("spec", {}).get("values", "normal"))

    @property
    def value_draw(self) -> str:
        """What the input values are keyed by (``"stream"``, ``"position"``; the spec's ``value_draw``)."""
        if self.spec is not None:
            return self.spec.value_draw
        return str(self.entry.get("spec", {}).get("value_draw", "stream"))

    @property
    def params(self) -> dict[str, Any]:
        """Every key of the case's family, given or default (the manifest's ``params``)."""
        return dict(self.entry.get("params") or (self.spec.resolved.as_dict() if self.spec is not None else {}))

    @property
    def shape(self) -> dict[str, Any]:
        """The case's real shape (its family's shape keys, e.g. ``{"m": 1, "n": 8, "k": 129}``)."""
        return dict(self.entry.get("shape") or (self.spec.shape() if self.spec is not None else {}))

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        """Output name -> ``{"init", "shape", "dtype"}`` (the main output first)."""
        return dict(self.entry["outputs"])

    @property
    def main_output(self) -> str:
        return str(self.entry.get("main_output") or next(iter(self.entry["outputs"])))

    def describe(self) -> str:
        """One line: kernel, profile, real shape, seed, value mode and case id."""
        dims = " ".join(f"{k}={v}" for k, v in self.shape.items())
        drawn = " by position" if self.value_draw == "position" else ""
        return (f"{self.kernel} under {self.profile} ({dims or 'no shape keys'}; seed {self.seed}, values "
                f"{self.values}{drawn}; case {self.id!r})")

    def input_shapes(self) -> str:
        """The inputs' shapes and dtypes, compactly (``a (128, 256) float8_e4m3fn, ...``)."""
        parts = [f"{k} {tuple(v.shape)} {v.dtype}" for k, v in self.inputs.items()]
        text = ", ".join(parts[:12])
        return text + (f", ... ({len(parts)} inputs)" if len(parts) > 12 else "")

    def __repr__(self) -> str:
        return f"Case.from_spec({self.to_spec()!r})"

    # -- the call, the golden, the specification ----------------------------------------------------

    def call(self, module: Any = None, *, device: str | None = None, transforms: bool = True,
             accumulation: str | None = None) -> dict[str, np.ndarray]:
        """Run the case's kernel of ``module`` and return its outputs by name (host NumPy arrays).

        module: ``None`` (this package), the real library (``import deep_gemm``) or any object with
        DeepGEMM's names (a stand-in).  The inputs are fresh copies; the manifest's layout
        transforms (``transform_sf_into_required_layout``, ...) are applied with ``module``'s own
        functions (``transforms=False`` skips them), then its setup calls, derived inputs and the
        kernel call, exactly as ``deepgemm-ref replay`` does.  The emulator's arch profile is the
        case's during the call (for this package and for stand-ins built on it).
        device: ``None``: NumPy arrays; a torch device name (``"cpu"``, ``"cuda"``, ``"npu"``):
        torch tensors on it (``"cpu"`` without torch installed falls back to NumPy).  This
        package computes on the host, so it takes only ``None`` or ``"cpu"``.
        accumulation: with this package, the accumulation model to emulate (``"fp32"``,
        ``"limited(13, 128)"``; default: the active numerics option).
        """
        mod = emulator() if module is None else module
        ours = is_emulator(mod)
        use_torch = device is not None
        if use_torch and device == "cpu":
            try:
                import torch  # noqa: F401
            except ImportError:
                use_torch = False
        _check_device(ours, use_torch, device)
        if accumulation is not None and not ours:
            raise DGArgumentError("Case.call: accumulation: emulates a device accumulator with this package only "
                                  f"(module=None); got module {getattr(mod, '__name__', type(mod).__name__)!r}")
        data = CaseData(self.entry, {f"input.{k}": np.array(v, copy=True) for k, v in self.inputs.items()})
        with numerics(arch=self.profile), quiet_float_errors():
            return call_case(data, mod, ours=ours, use_torch=use_torch, device=device, transforms=transforms,
                             accumulation=accumulation)

    def golden(self) -> Golden:
        """The golden values (computed once with the emulator's exact model, the generation path
        of ``deepgemm-ref golden``; a bundle case's stored goldens).  See :class:`Golden`."""
        if self._golden is None:
            assert self._built is not None
            tensors, stats = compute_golden(self._built)
            self._golden = _finish_golden(Golden(_readonly(tensors)), self.entry, stats)
        return self._golden

    def to_spec(self) -> dict[str, Any]:
        """The specification entry that regenerates this case (``deepgemm-ref golden --spec``):
        id, kernel, profile, seed, the family keys, ``values`` and ``value_draw``."""
        if self.spec is not None:
            return self.spec.to_dict()
        return dict(self.entry.get("spec", {}))

    # -- checking --------------------------------------------------------------------------------

    def check(self, outputs: Any, **checker_options: Any) -> list[CaseReport]:
        """The checker's report on ``outputs`` (see :meth:`compare`), one per checked output."""
        return self.compare(outputs, **checker_options).reports

    def compare(self, outputs: Any, **checker_options: Any) -> Comparison:
        """Check a device's ``outputs`` against the goldens (``deepgemm-ref check``'s checker).

        outputs: a mapping output name -> array or tensor (any device), or one array for the main
        output.  checker_options: :class:`.check.CheckOptions` fields (``lam``, ``u_acc``, ``n``,
        ``worst``, ``acc_max``, ``accumulation``, ``bias_test``, ``bias_threshold``, ``bias_margin``) and
        ``strict`` (elements between the probabilistic and the deterministic bound
        fail instead of warning).  Shape or dtype mismatches and missing outputs are failures.
        """
        strict = bool(checker_options.pop("strict", False))
        known = {"lam", "u_acc", "n", "worst", "acc_max", "accumulation", "bias_test", "bias_threshold", "bias_margin"}
        unknown = set(checker_options) - known
        if unknown:
            raise DGArgumentError(f"assert_matches_golden: unknown checker options {sorted(unknown)} (options: "
                                  f"{', '.join(sorted(known))}, strict)")
        options = CheckOptions(**checker_options)
        gold = self.golden()
        problems: list[str] = []
        if isinstance(outputs, Mapping):
            given = dict(outputs)
            unexpected = sorted(set(given) - set(gold.outputs))
            if unexpected:
                problems.append(f"outputs {unexpected} are not outputs of {self.kernel} (outputs: "
                                f"{', '.join(gold.outputs)})")
            names = [n for n in gold.outputs if n in given]
            problems += [f"output {n!r} is missing" for n in gold.outputs if n not in given]
        else:
            given, names = {gold.main: outputs}, [gold.main]
        reports: list[CaseReport] = []
        checked: list[tuple[str, np.ndarray]] = []
        for name in names:
            dev = _host(given[name], name)
            want = gold[name]
            if dev.shape != want.shape or dev.dtype != want.dtype:
                problems.append(f"output {name!r}: shape {dev.shape} and dtype {dev.dtype}; expected shape "
                                f"{want.shape} and dtype {want.dtype}")
                continue
            checked.append((name, dev))
        view = family_view(self.entry, gold, dict(checked))
        goldens: dict[str, dict[str, np.ndarray]] = {}
        for name, dev in checked:
            label = self.id if len(gold.outputs) == 1 else f"{self.id}/{name}"
            hook = family_range(self.entry, gold, self.inputs, name)
            if view is None:
                goldens[name] = output_golden(gold, name, gold.main)
                reports.append(check_case(label, dev, goldens[name], gold.check, self.inputs, options, range_hook=hook))
            else:
                goldens[name] = view.goldens[name]
                reports.append(check_case(label, view.device[name], goldens[name], view.checks[name], self.inputs,
                                          options, range_hook=hook))

        def run_model() -> Mapping[str, np.ndarray]:  # the bias test's null: the model on these inputs
            outs = self.call(accumulation=options.model())
            v = family_view(self.entry, gold, outs)
            return outs if v is None else v.device

        apply_model_null([(n, r, goldens[n]) for (n, _), r in zip(checked, reports, strict=True)], run_model,
                         options)
        return Comparison(self, reports, [n for n, _ in checked], problems, options, strict,
                          {n: d for n, d in checked}, goldens)


def _finish_golden(g: Golden, entry: Mapping[str, Any], stats: Mapping[str, Any]) -> Golden:
    g.check = dict(entry.get("check") or {})
    g.outputs = tuple(entry["outputs"])
    g.main = str(entry.get("main_output") or g.outputs[0])
    g.stats = dict(stats)
    return g


def _fmt(v: float) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return f"{v:.9g}"


def _ulps(dev: float, gold: float, dtype: np.dtype) -> str:
    if not (math.isfinite(dev) and math.isfinite(gold)):
        return "n/a"
    d = ulp_distance(np.array([dev], np.float64).astype(dtype), np.array([gold], np.float64).astype(dtype))
    return str(int(d[0]))


def _special_class(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+inf" if v > 0 else "-inf"
    return "finite"


@dataclass
class Comparison:
    """The checker's verdict on a device's outputs: ``reports`` (one :class:`.check.CaseReport`
    per checked output), ``problems`` (missing outputs, shape or dtype mismatches); ``ok`` and the
    readable :meth:`message`."""

    case: Case
    reports: list[CaseReport]
    names: list[str]
    problems: list[str]
    options: CheckOptions
    strict: bool = False
    device: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    #: the golden tensors each output was checked against (see :func:`.check.output_golden`)
    goldens: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        bad = ("fail", "warn") if self.strict else ("fail",)
        return not self.problems and not any(r.status in bad for r in self.reports)

    def message(self, worst: int = 5) -> str:
        """What is wrong, for a person: the case, each failing output's counts, its worst elements
        (index, 128x128 tile, device value, golden, allowed interval, ULPs) and NaN / inf class
        mismatches, and how to save the case as a golden bundle."""
        c = self.case
        lines = [f"{c.kernel} under {c.profile} does not match its golden values",
                 f"case: {c.describe()}", f"inputs: {c.input_shapes()}"]
        lines += [f"problem: {p}" for p in self.problems]
        gold = c.golden()
        for name, rep in zip(self.names, self.reports, strict=True):
            failing = rep.status == "fail" or (self.strict and rep.status == "warn")
            if not failing:
                continue
            total = rep.checked
            bad = rep.failed + (rep.warned if self.strict else 0)
            share = f" ({100 * bad / total:.3g}%)" if total else ""
            lines.append(f"output {name!r} {tuple(gold[name].shape)} {gold[name].dtype}: {failing_text(bad, total)}"
                         f"{share}; {class_mismatches(rep.special_mismatches, 'NaN/inf')}"
                         f"; {rep.warned} between the bounds (warn); {rep.undefined} undefined by the kernel's "
                         "contract")
            lines.append("  " + _bound_text(rep.bound) + f"; {describe_options(rep.options)}")
            if rep.bias is not None and rep.bias.get("failed"):
                lines.append("  the errors lean one way: " + describe_bias(rep.bias))
            shown = [w for w in rep.worst if w["status"] == "fail" or (self.strict and w["status"] == "warn")]
            if shown:
                lines.append(f"  worst {min(worst, len(shown))} of them:")
            g = self.goldens.get(name) or output_golden(gold, name, gold.main)
            # an output compared as bit patterns (DeepEP's dispatch payloads): values and bits
            as_bits = np.asarray(g["main"]).dtype.kind in "iu" and gold[name].dtype.kind not in "iub"
            for w in shown[:worst]:
                idx = tuple(w["index"])
                dv, gv = float(w["device"]), float(w["golden"])
                where = f"    at {idx} (128x128 tile {tuple(w['tile_128x128'])}): device {_fmt(dv)}, golden {_fmt(gv)}"
                if as_bits:
                    width = 2 * gold[name].dtype.itemsize
                    dec = np.array([int(dv), int(gv)], np.asarray(g["main"]).dtype).view(gold[name].dtype)
                    lines.append(f"    at {idx}: device {_fmt(float(dec[0]))} (bits 0x{int(dv):0{width}x}), golden "
                                 f"{_fmt(float(dec[1]))} (bits 0x{int(gv):0{width}x}), compared bit for bit")
                    continue
                if gold[name].dtype.kind in "iub":
                    lines.append(f"{where}, compared bit for bit")
                    continue
                if _special_class(dv) != _special_class(gv) or not (math.isfinite(dv) and math.isfinite(gv)):
                    lines.append(f"{where}: class mismatch ({_special_class(dv)} where the golden value is "
                                 f"{_special_class(gv)})")
                    continue
                b = element_bounds(g, gold.check, c.inputs, self.options, idx)
                if b is None:
                    lines.append(f"{where}, compared bit for bit, ULPs {_ulps(dv, gv, gold[name].dtype)}")
                else:
                    warn = (f" (warns up to [{_fmt(b['warn'][0])}, {_fmt(b['warn'][1])}])"
                            if b["warn"] != b["pass"] else "")
                    lines.append(f"{where}, allowed [{_fmt(b['pass'][0])}, {_fmt(b['pass'][1])}]{warn}, ULPs "
                                 f"{_ulps(dv, gv, gold[name].dtype)}; exact accumulator (before the epilogue) "
                                 f"{_fmt(b['acc'])}, S {b['S']:.3g}")
            if rep.ulp_histogram:
                hist = ", ".join(f"{k}: {v}" for k, v in rep.ulp_histogram.items() if v)
                lines.append(f"  ULP distances to the golden: {hist}; calc_diff {rep.calc_diff:.3g}")
        lines.append(f"reproduce: Case.from_spec({c.to_spec()!r})")
        lines.append(f"save it as a golden case: echo '[{json.dumps(c.to_spec())}]' > case.json && deepgemm-ref golden "
                     "--spec case.json --out BUNDLE")
        return "\n".join(lines)


def _bound_text(bound: Mapping[str, Any]) -> str:
    if bound.get("mode") != "interval":
        return "bound: bit for bit (no accumulator to bound)"
    u = float(bound["u_acc"])
    e = math.log2(u)
    u_text = f"2^{int(e)}" if e == int(e) else f"{u:.3g}"
    return (f"bound: device within f(y +- E), E = lambda sqrt(n) u_acc S + epilogue terms (lambda {bound['lambda']:g}, "
            f"u_acc {u_text}, n {bound['n']}); beyond gamma_n(u_acc) S it fails")
