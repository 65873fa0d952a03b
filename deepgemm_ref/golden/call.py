"""The call of a case, shared by generation (the emulator's exact model under trace capture) and
replay (any module with DeepGEMM's names: deepgemm_ref, deep_gemm on a device).

A case's call is its setup calls (runtime settings), its derived inputs (computed by the module
itself, e.g. the paged-MQA schedule), then either one function call with the recorded arguments
or the family's driver (Mega MoE).  Every function named by a manifest is checked against the
functions its family registered (:meth:`.cases.Family.allows`): a manifest cannot make replay
call anything else of the module.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import ml_dtypes
import numpy as np

from .. import trace
from .._parallel import single_threaded_blas
from .._state import isolated
from ..settings import numerics
from .bundle import BundleError
from .cases import FAMILIES, ArgRef, BuiltCase, Family, family_for, family_of
from .emulator import emulator

__all__ = ["DTYPES", "call_kernel", "run_case_call", "fresh_outputs", "compute_golden", "golden_of_call",
           "entry_family", "registered_function", "quiet_float_errors"]

#: Output dtypes a manifest may name.
DTYPES: dict[str, Any] = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64,
                          "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "int32": np.int32, "int16": np.int16,
                          "int8": np.int8, "int64": np.int64, "uint8": np.uint8, "bool": np.bool_}


def registered_function(function: str) -> bool:
    """Whether any registered family may call ``function``."""
    return any(f.allows(function) for f in FAMILIES.values())


def entry_family(entry: Mapping[str, Any]) -> Family:
    """The family of a manifest entry (its spec's ``family`` key, else its kernel's)."""
    spec = entry.get("spec")
    name = spec.get("family") if isinstance(spec, Mapping) else None
    name = name if isinstance(name, str) else family_of(str(entry.get("kernel")))
    if name not in FAMILIES:
        raise BundleError(f"manifest: case {entry.get('id')!r}: unknown family {name!r}")
    return FAMILIES[name]


def _materialise(ref: ArgRef, tensors: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    if ref.kind == "value":
        v = ref.value
        return tuple(v) if isinstance(v, list) else v
    first = str(ref.names[0])
    if ref.kind == "output":
        return outputs[first]
    if ref.kind == "tensor":
        return tensors[first]
    second = ref.names[1]
    return (tensors[first], None if second is None else tensors[second])  # pair


def call_kernel(module: Any, function: str, args: list[ArgRef], kwargs: Mapping[str, ArgRef],
                tensors: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    """``module.function(*args, **kwargs)`` with references resolved to tensors and outputs;
    ``function`` must be one a registered family may call."""
    if not registered_function(function):
        raise BundleError(f"manifest: {function!r} is not a function any case family calls")
    fn = getattr(module, function, None)
    if fn is None or not callable(fn):
        raise BundleError(f"module {getattr(module, '__name__', module)!r} has no function {function!r}")
    return fn(*[_materialise(a, tensors, outputs) for a in args],
              **{k: _materialise(v, tensors, outputs) for k, v in kwargs.items()})


def run_case_call(module: Any, entry: Mapping[str, Any], args: list[ArgRef], kwargs: Mapping[str, ArgRef],
                  tensors: dict[str, Any], outputs: dict[str, Any],
                  overrides: Mapping[str, Any] | None = None) -> None:
    """Setup calls, derived inputs, the kernel call (or the family's driver); a returned output
    lands in ``outputs``.  ``overrides``: tensors replaced after the derived inputs are made (what
    only the kernel sees, e.g. a kernel that misreads an input the schedule was derived from)."""
    for call in entry.get("setup") or []:
        _call_desc(module, call, tensors, outputs)
    for call in entry.get("derived") or []:
        tensors[call["name"]] = _call_desc(module, call, tensors, outputs)
    if overrides:
        tensors.update(overrides)
    driver = entry.get("driver")
    if driver:
        fam = FAMILIES.get(driver.get("name"))
        if fam is None or fam.driver is None:
            raise BundleError(f"manifest: unknown driver {driver.get('name')!r}")
        fam.driver(module, dict(entry), tensors, outputs)
        return
    result = call_kernel(module, entry["function"], args, kwargs, tensors, outputs)
    ret = entry.get("returns")
    if ret:
        outputs[ret] = result


def _call_desc(module: Any, call: Mapping[str, Any], tensors: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    return call_kernel(module, call["function"], [ArgRef.from_json(a) for a in call.get("args", [])],
                       {k: ArgRef.from_json(v) for k, v in call.get("kwargs", {}).items()}, tensors, outputs)


def fresh_outputs(outputs: Mapping[str, Mapping[str, Any]], tensors: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The output buffers of a case before its call: zeros, NaN, or a copy of an input."""
    out = {}
    for name, o in outputs.items():
        if o["init"] == "returned":
            continue
        if o["init"] == "zeros":
            out[name] = np.zeros(o["shape"], np.dtype(DTYPES[o["dtype"]]))
        elif o["init"] == "nan":
            out[name] = np.full(o["shape"], np.nan, np.dtype(DTYPES[o["dtype"]]))
        else:
            out[name] = np.array(tensors[o["init"]], copy=True)
    return out


@contextlib.contextmanager
def quiet_float_errors() -> Iterator[None]:
    """NumPy's floating-point error state for a kernel call: overflow, underflow, invalid and
    divide are results (inf, 0, NaN), not warnings; so is NumPy's all-NaN warning of the core's
    ``nanmax`` on a NaN row."""
    with warnings.catch_warnings(), np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        yield


def _entry_of(built: BuiltCase) -> dict[str, Any]:
    return {"id": built.spec.id, "function": built.function, "setup": built.setup, "derived": built.derived,
            "returns": built.returns, "driver": built.driver, "profile": built.spec.profile,
            "kernel": built.spec.kernel}


def compute_golden(built: BuiltCase, module: Any = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run the case through the emulator's exact model; returns (golden tensors, stats).

    module: the emulator to run (default this package's namespace, :func:`.emulator.emulator`).

    Goldens: every output; from the kernel's trace record ``acc``, ``acc_lo``, ``S``,
    ``defined`` and ``extra.<name>`` (or what the family's finish hook makes of a driver's
    records, e.g. Mega MoE's per-rank stack).
    """
    return golden_of_call(_entry_of(built), built.args, built.kwargs, built.inputs, built.outputs,
                          family_for(built.spec), module=module)


def golden_of_call(entry: Mapping[str, Any], args: list[ArgRef], kwargs: Mapping[str, ArgRef],
                   inputs: Mapping[str, Any], outputs: Mapping[str, Mapping[str, Any]], family: Family, *,
                   accumulation: Any = "exact", overrides: Mapping[str, Any] | None = None,
                   module: Any = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The golden tensors of one call (``entry``: its ``id``, ``function``, ``setup``,
    ``derived``, ``returns``, ``driver`` and ``profile``) under an accumulation model (default
    the exact one: :func:`compute_golden`); the diagnosis regenerates mutated calls with it.
    ``module``: the emulator whose trace records give the accumulator and error scale (default
    this package's namespace)."""
    if family.compute is not None:
        # A family whose goldens come from a pure model of the call (DeepEP's dispatch and combine:
        # the driver's ranks run in threads, which a trace capture does not follow).  The model
        # follows the kernels' own numerics whatever the accumulation option says.
        with isolated(), single_threaded_blas(), numerics(arch=entry["profile"]), quiet_float_errors():
            tensors = dict(inputs)
            tensors.update(overrides or {})
            return family.compute(entry, tensors, outputs)
    emu = emulator() if module is None else module

    # One BLAS thread: stored float64 tensors (acc, S) that no certificate makes exact would
    # otherwise depend on the BLAS thread count (see _parallel.single_threaded_blas).
    # Adversarial and special inputs overflow and make NaN on purpose: those are golden values,
    # not errors, so NumPy's floating-point warnings are off during the call.
    # isolated(): the profile and options are this call's own (concurrent runs in other threads
    # neither see nor change them; the process-global settings are untouched).
    with isolated(), single_threaded_blas(), numerics(arch=entry["profile"], accumulation=accumulation), \
            quiet_float_errors():
        outs = fresh_outputs(outputs, inputs)
        tensors = dict(inputs)
        with trace.capture(want_acc=True, want_S=True) as cap:
            run_case_call(emu, entry, args, kwargs, tensors, outs, overrides)
    golden: dict[str, np.ndarray] = {}
    for name in outputs:
        golden[name] = np.ascontiguousarray(outs[name])
    stats: dict[str, Any] = {}
    if cap.records and family.finish is not None:
        stats = family.finish(golden, cap.records, dict(inputs))
    elif cap.records:
        rec = cap.records[-1]
        main = next(iter(outputs))
        shape = golden[main].shape
        if rec.acc is not None:
            golden["acc"] = np.ascontiguousarray(rec.acc, np.float64)
        if rec.acc_lo is not None:
            golden["acc_lo"] = np.ascontiguousarray(rec.acc_lo, np.float64)
        if rec.S is not None:
            golden["S"] = np.ascontiguousarray(rec.S, np.float64)
        golden["defined"] = np.ones(shape, bool) if rec.defined is None else np.ascontiguousarray(rec.defined, bool)
        for k, v in rec.extra.items():
            golden[f"extra.{k}"] = np.ascontiguousarray(v)
        stats = dict(rec.stats)
    return golden, stats
