"""Named case lists: ``smoke``, ``ascend-headline``, ``deepgemm-tests-small``, ``deepgemm-tests``,
``deepep-tests-small``, ``ascend-probes``.

* ``smoke``: every kernel family at tiny sizes, each under at least one profile that provides
  it (seconds).
* ``ascend-headline``: DeepGEMM-Ascend's published headline, a BF16 GEMM M=4096 N=7168 K=16384,
  under ``ascend950`` (about half a minute here).
* ``deepgemm-tests-small``: DeepGEMM's test shape lists (dense, grouped, MQA, Mega MoE), with
  every dimension scaled down (the case ids keep the original sizes) so that the whole preset
  runs in seconds on two cores.
* ``deepgemm-tests``: the dense GEMM shape lists at DeepGEMM's full sizes (hours here; use
  ``--jobs`` or Dask).
* ``deepep-tests-small``: DeepEP's dispatch and combine (``golden.ep``): DeepEP's test
  configuration (8 ranks, hidden 7168, top-6 of 256 experts) with a few tokens per rank, under
  ``sm100`` and ``ascend950``, and the Mega MoE baseline's dispatch and combine (expanded, no CPU
  sync, alignment 224) at the Mega MoE small preset's shapes (seconds).
* ``ascend-probes``: inputs crafted so that a device's outputs reveal its accumulator width and
  rounding, its output rounding and its reading of the UE8M0 byte 0x00 (``golden.probes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import DGArgumentError

__all__ = ["PRESETS", "preset", "register_preset_cases"]

_EXTRA: dict[str, list[Callable[[], list[dict[str, Any]]]]] = {}


def register_preset_cases(name: str, make: Callable[[], list[dict[str, Any]]]) -> None:
    """Let a kernel family add cases to a preset (grouped, MQA and Mega MoE families do)."""
    _EXTRA.setdefault(name, []).append(make)


def _smoke() -> list[dict[str, Any]]:
    c: list[dict[str, Any]] = []
    for profile in ("sm100", "ascend950"):
        g = 32 if profile == "ascend950" else 128
        c += [
            {"id": f"{profile}-fp8-nt-bf16", "kernel": "fp8_gemm_nt", "profile": profile, "m": 64, "n": 96, "k": 256,
             "gran_k_a": g, "gran_k_b": g, "out": "bf16"},
            {"id": f"{profile}-fp8-nn-f32-c", "kernel": "fp8_fp4_gemm_nn", "profile": profile, "m": 40, "n": 64,
             "k": 320, "gran_k_a": g, "gran_k_b": g, "out": "f32", "c": "is_d"},
            {"id": f"{profile}-fp8xfp4-nt", "kernel": "fp8_fp4_gemm_nt", "profile": profile, "m": 32, "n": 64,
             "k": 256, "a": "fp8", "b": "fp4", "gran_k_a": g, "gran_k_b": 32, "out": "bf16"},
            {"id": f"{profile}-fp4xfp4-tt", "kernel": "fp8_fp4_gemm_tt", "profile": profile, "m": 32, "n": 48,
             "k": 192, "a": "fp4", "b": "fp4", "gran_k_a": 32, "gran_k_b": 32, "out": "f32"},
            {"id": f"{profile}-bf16-nt-c", "kernel": "bf16_gemm_nt", "profile": profile, "m": 48, "n": 40, "k": 200,
             "out": "bf16", "c": "separate"},
            {"id": f"{profile}-bf16-tn-f32", "kernel": "bf16_gemm_tn", "profile": profile, "m": 33, "n": 17, "k": 96,
             "out": "f32"},
        ]
    c += [
        {"id": "ascend950-fp8-alpha", "kernel": "fp8_gemm_nt", "profile": "ascend950", "m": 24, "n": 32, "k": 128,
         "gran_k_a": 32, "gran_k_b": 32, "out": "bf16", "c": "is_d", "alpha": 0.75},
        {"id": "ascend950-aclnn-fp8", "kernel": "aclnn_fp8_fp4_gemm_nt", "profile": "ascend950", "m": 16, "n": 32,
         "k": 128, "gran_k_a": 32, "gran_k_b": 32, "out": "bf16"},
        {"id": "sm90-fp8-1d2d", "kernel": "fp8_gemm_nt", "profile": "sm90", "m": 64, "n": 160, "k": 256,
         "gran_n": 128, "out": "bf16"},
        {"id": "sm90-fp8-1d1d-c", "kernel": "fp8_gemm_nt", "profile": "sm90", "m": 48, "n": 64, "k": 384,
         "out": "f32", "c": "is_d"},
        {"id": "sm100-cublaslt", "kernel": "cublaslt_gemm_nt", "profile": "sm100", "m": 32, "n": 32, "k": 64,
         "out": "bf16", "c": "separate"},
        {"id": "sm100-skip-head-mid", "kernel": "fp8_gemm_nt_skip_head_mid", "profile": "sm100", "m": 32, "n": 64,
         "k": 256, "head_splits": [16, 8, 16], "out": "f32"},
        {"id": "sm90-skip-head-mid", "kernel": "fp8_gemm_nt_skip_head_mid", "profile": "sm90", "m": 16, "n": 64,
         "k": 256, "gran_n": 128, "head_splits": [24, 4, 8]},
    ]
    return c


def _ascend_headline() -> list[dict[str, Any]]:
    return [{"id": "ascend950-bf16-headline", "kernel": "bf16_gemm_nt", "profile": "ascend950",
             "m": 4096, "n": 7168, "k": 16384, "out": "bf16"}]


def _deepgemm_tests() -> list[dict[str, Any]]:
    """Spec 14's dense lists at full size (hours here): forward M in {1, 128, 4096}, backward M 4096."""
    return _dense_lists(scale=1, m_fwd=(1, 128, 4096), m_bwd=4096)


def _deepgemm_tests_small() -> list[dict[str, Any]]:
    """Spec 14's dense lists, each dimension divided by 16 (min 16), M in {1, 128}."""
    return _dense_lists(scale=16, m_fwd=(1, 128), m_bwd=256)


def _dense_lists(scale: int, m_fwd: tuple[int, ...], m_bwd: int) -> list[dict[str, Any]]:
    bf16_nk = [(2112, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
    f32_nk = [(256, 7168), (129280, 7168)]
    c: list[dict[str, Any]] = []

    def s(x: int) -> int:
        return max(16, x // scale)

    for m in m_fwd:
        for n, k in bf16_nk:
            c.append({"id": f"sm100-fp8-m{m}-n{n}-k{k}", "kernel": "fp8_gemm_nt", "profile": "sm100",
                      "m": m, "n": s(n), "k": s(k), "out": "bf16"})
            c.append({"id": f"sm100-fp8xfp4-m{m}-n{n}-k{k}", "kernel": "fp8_fp4_gemm_nt", "profile": "sm100",
                      "m": m, "n": s(n), "k": s(k), "b": "fp4", "gran_k_b": 32, "out": "bf16"})
            c.append({"id": f"sm90-fp8-m{m}-n{n}-k{k}", "kernel": "fp8_gemm_nt", "profile": "sm90",
                      "m": m, "n": s(n), "k": s(k), "gran_n": 128, "out": "bf16"})
            c.append({"id": f"ascend950-fp8-m{m}-n{n}-k{k}", "kernel": "fp8_gemm_nt", "profile": "ascend950",
                      "m": m, "n": s(n), "k": s(k), "out": "bf16"})
            c.append({"id": f"sm100-bf16-m{m}-n{n}-k{k}-acc", "kernel": "bf16_gemm_nt", "profile": "sm100",
                      "m": m, "n": s(n), "k": s(k), "out": "bf16", "c": "is_d"})
        for n, k in f32_nk:
            c.append({"id": f"sm100-bf16-f32-m{m}-n{n}-k{k}", "kernel": "bf16_gemm_nt", "profile": "sm100",
                      "m": m, "n": s(n), "k": s(k), "out": "f32"})
    m = m_bwd
    for n, k in bf16_nk:
        c.append({"id": f"sm100-fp8-dgrad-n{n}-k{k}", "kernel": "fp8_gemm_nn", "profile": "sm100",
                  "m": m, "n": s(k), "k": s(n), "out": "bf16"})
        c.append({"id": f"sm100-fp8-wgrad-n{n}-k{k}", "kernel": "fp8_gemm_tn", "profile": "sm100",
                  "m": s(n), "n": m, "k": s(k), "out": "f32", "c": "is_d"})
    return c


def _ascend_probes() -> list[dict[str, Any]]:
    from .probes import probe_cases

    return probe_cases("ascend950")


PRESETS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "smoke": _smoke,
    "ascend-probes": _ascend_probes,
    "ascend-headline": _ascend_headline,
    "deepgemm-tests-small": _deepgemm_tests_small,
    "deepgemm-tests": _deepgemm_tests,
    "deepep-tests-small": lambda: [],  # DeepEP's dispatch and combine: every case comes from golden.ep
}


def preset(name: str) -> list[dict[str, Any]]:
    """The case specifications of a named preset."""
    if name not in PRESETS:
        raise DGArgumentError(f"golden: preset: expected one of {sorted(PRESETS)}; got {name!r}")
    cases = PRESETS[name]()
    for make in _EXTRA.get(name, []):
        cases += make()
    return cases
