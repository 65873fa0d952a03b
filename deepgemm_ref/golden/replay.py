"""Replay a bundle through a real library (or through deepgemm_ref itself) and save its outputs.

On a host with DeepGEMM-Ascend (torch + torch_npu)::

    deepgemm-ref replay BUNDLE --module deep_gemm --device npu --out OUTPUTS.safetensors

loads every case, converts its inputs to torch tensors on the device, applies the manifest's
layout transforms with the module's own functions, calls the named function with the stored
arguments, and saves the outputs as ``<case id>/<output name>`` in a safetensors file.  It needs
only torch and this package.  With ``--module deepgemm_ref`` it runs here, on NumPy arrays (or on
torch CPU tensors with ``--torch``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..interop import from_numpy, to_numpy
from ..settings import numerics
from . import safetensors as st
from .bundle import BundleError, CaseData, _fresh_outputs, load_bundle, run_case_call

__all__ = ["replay"]


def _to_device(x: Any, use_torch: bool, device: str | None) -> Any:
    if not use_torch or x is None:
        return x
    if isinstance(x, st.PackedFP4):
        x = x.data
    t = from_numpy(np.ascontiguousarray(x), "torch")
    return t.to(device) if device and device != "cpu" else t


def _apply_transforms(module: Any, case: CaseData, tensors: dict[str, Any]) -> dict[str, Any]:
    out = dict(tensors)
    for name, t in case.entry.get("transforms", {}).items():
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
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, np.ndarray]:
    """Run every case of a bundle through ``module`` and save the outputs; returns them.

    use_torch: pass torch tensors (default: True unless ``module`` is deepgemm_ref).
    device: torch device for the inputs and outputs (e.g. "npu", "cuda").
    transforms: apply the manifest's layout transforms before the call.
    accumulation: with ``module="deepgemm_ref"``, the accumulation model to emulate the device
    with (e.g. ``"limited(13, 128)"``; default: the active numerics option).
    """
    b = load_bundle(bundle_dir)
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise BundleError(f"replay: cannot import module {module!r}: {e}") from e
    ours = module == "deepgemm_ref" or module.startswith("deepgemm_ref.")
    if use_torch is None:
        use_torch = not ours
    if use_torch:
        try:
            import torch  # noqa: F401
        except ImportError as e:
            raise BundleError("replay: torch is needed to pass torch tensors (use --no-torch)") from e
    ids = list(b.cases) if cases is None else cases
    results: dict[str, np.ndarray] = {}
    for i, case_id in enumerate(ids):
        if progress is not None:
            progress(i, len(ids), case_id)
        case = b.case(case_id)
        inputs = {k: (v.data if isinstance(v, st.PackedFP4) else v) for k, v in case.inputs().items()}
        outs = _fresh_outputs(case.entry["outputs"], inputs)
        dev_inputs = {k: _to_device(v, use_torch, device) for k, v in inputs.items()}
        dev_outs = {k: _to_device(v, use_torch, device) for k, v in outs.items()}
        if transforms:
            with _profile(mod, ours, case.entry["profile"]):
                dev_inputs = _apply_transforms(mod, case, dev_inputs)
        with _profile(mod, ours, case.entry["profile"], accumulation):
            run_case_call(mod, case.entry, case.args, case.kwargs, dev_inputs, dev_outs)
        for name in case.entry["outputs"]:
            v = dev_outs[name]
            if use_torch and hasattr(v, "cpu"):
                v = v.cpu()
            results[f"{case_id}/{name}"] = np.ascontiguousarray(to_numpy(v, "replay", name))
    if progress is not None:
        progress(len(ids), len(ids), "")
    st.save_file(results, out_path, metadata={"bundle": str(bundle_dir), "module": module}, overwrite=force)
    return results


class _profile:
    """Under deepgemm_ref, run each case with the profile it was generated for."""

    def __init__(self, module: Any, ours: bool, profile: str, accumulation: str | None = None) -> None:
        extra = {} if accumulation is None else {"accumulation": accumulation}
        self.ctx = numerics(arch=profile, **extra) if ours else None

    def __enter__(self) -> None:
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


_ = Mapping
