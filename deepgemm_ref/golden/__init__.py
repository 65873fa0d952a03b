"""Golden-value bundles: storage, generation, replay and checking.

Python equivalents of the ``deepgemm-ref`` subcommands::

    from deepgemm_ref import golden
    golden.generate(golden.preset("smoke"), "bundle/")          # deepgemm-ref golden --preset smoke
    golden.replay("bundle/", "outputs.safetensors")              # deepgemm-ref replay
    reports = golden.check("bundle/", "outputs.safetensors")     # deepgemm-ref check
    found = golden.diagnose("bundle/", "outputs.safetensors")    # deepgemm-ref diagnose
    golden.verify("bundle/", regenerate=True)                    # deepgemm-ref verify --regenerate
"""

from __future__ import annotations

from . import families, moe, probes, safetensors  # families, moe and probes register their case builders
from .bundle import Bundle, BundleError, CaseData, load_bundle
from .cases import CaseSpec, SpecError, build_case, register_family, validate_spec
from .check import CaseReport, CheckOptions, check, check_case, check_outputs, format_report, load_outputs
from .diagnose import CATALOGUE, CaseDiagnosis, diagnose  # noqa: E402  (after check: it builds on it)
from .ep import EPConfig  # DeepEP's families (registered after the others: docs and presets list them last)
from .generation import CaseFailures, GenerationInterrupted, Plan, generate, plan_generation, verify
from .presets import PRESETS, preset
from .progress import Progress
from .replay import ReplayOutputs, replay
from .resources import Estimate, ResourceError

__all__ = [
    "safetensors", "Bundle", "BundleError", "CaseData", "CaseSpec", "CaseReport", "CheckOptions", "SpecError",
    "generate", "plan_generation", "Plan", "load_bundle", "verify", "replay", "ReplayOutputs", "check",
    "check_outputs", "check_case", "format_report", "preset", "PRESETS", "build_case", "register_family",
    "validate_spec", "load_outputs", "probes", "families", "moe", "ep", "EPConfig", "CaseFailures",
    "GenerationInterrupted", "Progress", "Estimate", "ResourceError", "diagnose", "CaseDiagnosis", "CATALOGUE",
]
