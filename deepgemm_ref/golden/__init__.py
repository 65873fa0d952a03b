"""Golden-value bundles: storage, generation, replay and checking.

Python equivalents of the ``deepgemm-ref`` subcommands::

    from deepgemm_ref import golden
    golden.generate(golden.preset("smoke"), "bundle/")          # deepgemm-ref golden --preset smoke
    golden.replay("bundle/", "outputs.safetensors")              # deepgemm-ref replay
    reports = golden.check("bundle/", "outputs.safetensors")     # deepgemm-ref check
    golden.verify("bundle/", regenerate=True)                    # deepgemm-ref verify --regenerate
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from . import families, moe, probes, safetensors  # families, moe and probes register their case builders
from .bundle import Bundle, BundleError, CaseData, generate, load_bundle, verify
from .cases import CaseSpec, build_case, register_family
from .check import CaseReport, CheckOptions, check_case, format_report
from .presets import PRESETS, preset
from .replay import replay

__all__ = [
    "safetensors", "Bundle", "BundleError", "CaseData", "CaseSpec", "CaseReport", "CheckOptions",
    "generate", "load_bundle", "verify", "replay", "check", "check_outputs", "format_report",
    "preset", "PRESETS", "build_case", "register_family", "load_outputs", "probes", "families", "moe",
]


def load_outputs(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Device outputs: a safetensors file (names ``<case id>/<output>``) or a single ``.npy``."""
    p = os.fspath(path)
    if p.endswith(".npy"):
        try:
            arr = np.load(p, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise BundleError(f"{p}: cannot read the .npy outputs: {e}") from e
        return {"": arr}
    try:
        raw = safetensors.load_file(p)
    except (OSError, safetensors.SafetensorsError) as e:
        raise BundleError(f"{p}: cannot read the outputs: {e}") from e
    return {k: (v.data if isinstance(v, safetensors.PackedFP4) else v) for k, v in raw.items()}


def check_outputs(bundle: Bundle, outputs: dict[str, np.ndarray], options: CheckOptions | None = None,
                  cases: list[str] | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> list[CaseReport]:
    """Check device outputs against a loaded bundle; one report per (case, output)."""
    options = options or CheckOptions()
    ids = list(bundle.cases) if cases is None else cases
    single = set(outputs) == {""}
    if single and len(ids) != 1:
        raise BundleError("a .npy outputs file can only be checked against a one-case bundle (use --case)")
    reports = []
    for i, case_id in enumerate(ids):
        if progress is not None:
            progress(i, len(ids), case_id)
        case = bundle.case(case_id)
        golden = case.golden()
        inputs = case.inputs()
        outs = case.entry["outputs"]
        main = case.entry.get("main_output") or next(iter(outs))  # the manifest's keys are sorted
        for name in [main] + [n for n in outs if n != main]:
            key = "" if single else f"{case_id}/{name}"
            if key not in outputs:
                raise BundleError(f"outputs: missing {key!r} (case {case_id!r}, output {name!r})")
            dev = outputs[key]
            want = golden[name]
            if dev.shape != want.shape or dev.dtype != want.dtype:
                raise BundleError(f"outputs: {key!r} has shape {dev.shape} and dtype {dev.dtype}; "
                                  f"expected shape {want.shape} and dtype {want.dtype}")
            if name == main:
                keys = ("acc", "acc_lo", "S", "S_hard", "defined")
                g = {"main": want, **{k: v for k, v in golden.items() if k in keys}}
            else:  # a second output: its own accumulator and error scale when the kernel reports them
                g = {"main": want, **{k: golden[f"extra.{name}.{k}"] for k in ("acc", "S")
                                      if f"extra.{name}.{k}" in golden}}
            label = case_id if len(case.entry["outputs"]) == 1 else f"{case_id}/{name}"
            reports.append(check_case(label, dev, g, case.entry.get("check", {}), inputs, options))
    if progress is not None:
        progress(len(ids), len(ids), "")
    return reports


def check(bundle_dir: str | os.PathLike[str], outputs_path: str | os.PathLike[str], *,
          options: CheckOptions | None = None, cases: list[str] | None = None) -> list[CaseReport]:
    """``deepgemm-ref check``: load a bundle and a device's outputs, and check every case."""
    return check_outputs(load_bundle(bundle_dir), load_outputs(outputs_path), options, cases)


_ = Any
