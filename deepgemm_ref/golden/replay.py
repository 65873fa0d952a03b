"""Replay a bundle through a real library (or through deepgemm_ref itself) and save its outputs.

On a host with DeepGEMM-Ascend (torch + torch_npu)::

    deepgemm-ref replay BUNDLE --module deep_gemm --device npu --out OUTPUTS.safetensors

loads every case, converts its inputs to torch tensors on the device, applies the manifest's
layout transforms with the module's own functions, calls the named function with the stored
arguments, and saves the outputs as ``<case id>/<output name>`` in a safetensors file.  It needs
only torch and this package.  With ``--module deepgemm_ref`` it runs here, on NumPy arrays (or on
torch CPU tensors with ``--torch``).

A case that fails (the library raises, a case file does not verify) does not stop the replay:
its error is recorded and the other cases go on.  The outputs file holds the outputs of the
cases that succeeded, and its metadata ``deepgemm_ref.errors`` (JSON: case id -> error) and
``deepgemm_ref.cases`` (JSON: the replayed case ids), which ``check`` reports as failures.

``device``: with a torch module, the torch device every input and output is moved to (checked
before the first case: an unknown or unavailable device is refused).  The deepgemm_ref module
computes on the host, so there only ``None`` or ``"cpu"`` is accepted (another device is
refused, never ignored).
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

import numpy as np

from ..errors import DGArgumentError
from ..interop import from_numpy, to_numpy
from ..settings import numerics
from . import safetensors as st
from .bundle import BundleError, CaseData, load_bundle
from .call import entry_family, fresh_outputs, run_case_call
from .cases import validate_spec
from .progress import as_progress
from .resources import ResourceError, default_memory_limit, format_size

__all__ = ["replay", "ReplayOutputs", "ERRORS_KEY", "CASES_KEY", "read_replay_record"]

#: Metadata key of the outputs file: JSON object case id -> error message.
ERRORS_KEY = "deepgemm_ref.errors"
#: Metadata key of the outputs file: JSON list of the replayed case ids.
CASES_KEY = "deepgemm_ref.cases"


class ReplayOutputs(dict[str, np.ndarray]):
    """The outputs of a replay (``<case id>/<output>`` -> array), with ``errors`` (case id -> error)."""

    errors: dict[str, str]


def _to_device(x: Any, use_torch: bool, device: str | None) -> Any:
    if not use_torch or x is None:
        return x
    if isinstance(x, st.PackedFP4):
        x = x.data
    t = from_numpy(np.ascontiguousarray(x), "torch")
    return t.to(device) if device and device != "cpu" else t


def _apply_transforms(module: Any, case: CaseData, tensors: dict[str, Any]) -> dict[str, Any]:
    out = dict(tensors)
    family = entry_family(case.entry)
    for name, t in case.entry.get("transforms", {}).items():
        if not family.allows(t["function"]):
            raise BundleError(f"manifest: case {case.id!r}: transform {t['function']!r} is not a function of its "
                              "family")
        fn = getattr(module, t["function"], None)
        if fn is None:
            continue  # a module without the transform consumes the user form itself
        x = out[name]
        back = bool(t.get("transpose_back"))
        if back:
            x = x.T
        kwargs = dict(t["kwargs"])
        for key in ("recipe",):
            if isinstance(kwargs.get(key), list):
                kwargs[key] = tuple(kwargs[key])
        if kwargs.get("is_sfa") is None:
            kwargs.pop("is_sfa", None)
        y = fn(x, **kwargs)
        out[name] = y.T if back else y
    return out


def _check_device(ours: bool, use_torch: bool, device: str | None) -> None:
    """Refuse a device the replay could not honour (before any case runs)."""
    if device is None or device == "cpu":
        return
    if ours:
        raise BundleError(f"replay: --device {device}: the deepgemm_ref module computes on the host (NumPy arrays, "
                          "or torch CPU tensors with --torch); use --device cpu, or replay on the device host with "
                          "--module deep_gemm")
    if not use_torch:
        raise BundleError(f"replay: --device {device}: NumPy arrays (--no-torch) stay on the host; pass torch tensors")
    import torch

    try:
        dev = torch.device(device)
        torch.empty(1, device=dev)
    except (RuntimeError, ValueError, TypeError, AssertionError) as e:
        raise BundleError(f"replay: --device {device}: not available here ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None


def read_replay_record(path: str | os.PathLike[str]) -> tuple[dict[str, str], list[str] | None]:
    """(case id -> error, replayed case ids or None) from an outputs file's metadata."""
    try:
        meta = st.read_metadata(path)
    except (OSError, st.SafetensorsError):
        return {}, None
    errors: dict[str, str] = {}
    cases: list[str] | None = None
    try:
        raw = st.strict_json(meta[ERRORS_KEY]) if ERRORS_KEY in meta else {}
        if isinstance(raw, dict):
            errors = {str(k): str(v) for k, v in raw.items()}
        raw_cases = st.strict_json(meta[CASES_KEY]) if CASES_KEY in meta else None
        if isinstance(raw_cases, list):
            cases = [str(c) for c in raw_cases]
    except ValueError as e:
        raise BundleError(f"{os.fspath(path)}: metadata {ERRORS_KEY!r} / {CASES_KEY!r} is not valid JSON: "
                          f"{e}") from None
    return errors, cases


def replay(
    bundle_dir: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    module: str = "deepgemm_ref",
    use_torch: bool | None = None,
    device: str | None = None,
    transforms: bool = True,
    force: bool = False,
    cases: list[str] | None = None,
    accumulation: str | None = None,
    progress: Any = None,
    max_memory: int | None = None,
) -> ReplayOutputs:
    """Run every case of a bundle through ``module`` and save the outputs; returns them (with
    ``.errors``, case id -> error, for the cases that failed).

    use_torch: pass torch tensors (default: True unless ``module`` is deepgemm_ref).
    device: torch device for the inputs and outputs (e.g. "npu", "cuda"; see the module docstring).
    transforms: apply the manifest's layout transforms before the call.
    accumulation: with ``module="deepgemm_ref"``, the accumulation model to emulate the device
    with (e.g. ``"limited(13, 128)"``; default: the active numerics option).
    progress: a :class:`.progress.Progress`-like object or a callable ``f(done, total, case_id)``.
    """
    limit = default_memory_limit() if max_memory is None else max_memory
    b = load_bundle(bundle_dir, max_memory=limit)
    if os.path.lexists(out_path) and not force:
        raise BundleError(f"{os.fspath(out_path)}: file exists; pass force=True (--force) to replace it")
    ids = list(b.cases) if not cases else list(dict.fromkeys(cases))
    for case_id in ids:
        if case_id not in b.cases:
            why = "it was not generated (the bundle is incomplete)" if case_id in b.incomplete else "no such case"
            raise BundleError(f"replay: --case {case_id!r}: {why}")
    if not isinstance(module, str) or not module:
        raise BundleError(f"replay: module: expected a module name; got {module!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise BundleError(f"replay: cannot import module {module!r}: {e}") from None
    except Exception as e:  # a module that fails while importing
        raise BundleError(f"replay: importing module {module!r} failed: {type(e).__name__}: {e}") from None
    ours = module == "deepgemm_ref" or module.startswith("deepgemm_ref.")
    if use_torch is None:
        use_torch = not ours
    if use_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise BundleError("replay: torch is needed to pass torch tensors (use --no-torch)") from None
    _check_device(ours, use_torch, device)
    if accumulation is not None:
        if not ours:
            raise BundleError("replay: --accumulation emulates a device accumulator with --module deepgemm_ref only")
        with numerics(accumulation=accumulation):  # validated once, before any case
            pass
    results = ReplayOutputs()
    errors: dict[str, str] = {}
    prog = as_progress(progress)
    costs = {i: float(sum(np.prod(t["shape"]) for t in b.cases[i]["tensors"].values())) + 1.0 for i in ids}
    prog.start(len(ids), sum(costs.values()))
    done_work = 0.0
    for n, case_id in enumerate(ids, start=1):
        try:
            results.update(_replay_case(b, case_id, mod, ours, use_torch, device, transforms, accumulation, limit))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # one failing case must not stop the others
            errors[case_id] = f"{type(e).__name__}: {e}" if not isinstance(e, DGArgumentError) else str(e)
        done_work += costs[case_id]
        prog.update(n, done_work, case_id)
    prog.finish()
    results.errors = errors
    meta = {"bundle": str(bundle_dir), "module": module, ERRORS_KEY: json.dumps(errors, sort_keys=True),
            CASES_KEY: json.dumps(ids)}
    st.save_file(dict(results), out_path, metadata=meta, overwrite=force)
    return results


def _replay_case(b: Any, case_id: str, mod: Any, ours: bool, use_torch: bool, device: str | None,
                 transforms: bool, accumulation: str | None, limit: int) -> dict[str, np.ndarray]:
    case = b.case(case_id)
    if ours:
        from .cases import estimate_case

        try:
            est = estimate_case(validate_spec(case.entry["spec"]))
        except DGArgumentError:
            est = None
        if est is not None and est.peak_bytes > limit:
            raise ResourceError(f"case {case_id!r}: needs about {format_size(est.peak_bytes)} of memory; the limit "
                                f"is {format_size(limit)} (--max-memory)")
    inputs = {k: (v.data if isinstance(v, st.PackedFP4) else v) for k, v in case.inputs().items()}
    outs = fresh_outputs(case.entry["outputs"], inputs)
    dev_inputs = {k: _to_device(v, use_torch, device) for k, v in inputs.items()}
    dev_outs = {k: _to_device(v, use_torch, device) for k, v in outs.items()}
    if transforms:
        with _profile(ours, case.entry["profile"]):
            dev_inputs = _apply_transforms(mod, case, dev_inputs)
    with _profile(ours, case.entry["profile"], accumulation):
        run_case_call(mod, case.entry, case.args, case.kwargs, dev_inputs, dev_outs)
    got: dict[str, np.ndarray] = {}
    for name in case.entry["outputs"]:
        if name not in dev_outs:
            raise BundleError(f"case {case_id!r}: the call returned no {name!r}")
        v = dev_outs[name]
        if use_torch and hasattr(v, "cpu"):
            v = v.cpu()
        got[f"{case_id}/{name}"] = np.ascontiguousarray(to_numpy(v, "replay", name))
    return got


class _profile:
    """Under deepgemm_ref, run each case with the profile it was generated for."""

    def __init__(self, ours: bool, profile: str, accumulation: str | None = None) -> None:
        extra = {} if accumulation is None else {"accumulation": accumulation}
        self.ctx = numerics(arch=profile, **extra) if ours else None

    def __enter__(self) -> None:
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)

