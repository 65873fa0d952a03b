"""The public namespace is derived from one table (deepgemm_ref._exports): imports and __all__ of
deepgemm_ref, deepgemm_ref.utils (math, layout) and deepgemm_ref.runtime are generated from it; what
the namespaces show follows the active profile (deepgemm_ref.namespace)."""

from __future__ import annotations

import importlib

import pytest

import deepgemm_ref as dg
from deepgemm_ref import _exports, names


def test_generated_blocks_are_up_to_date():
    assert _exports.rewrite(check=True) == [], "run python -m deepgemm_ref._exports"


def test_every_row_points_at_an_object_of_its_home():
    seen = set()
    for e in _exports.EXPORTS:
        assert e.name not in seen, f"{e.name} listed twice"
        seen.add(e.name)
        home = importlib.import_module(f"deepgemm_ref.{e.home}" if e.home else "deepgemm_ref")
        if e.attr is not None:
            assert hasattr(home, e.attr), (e.name, e.home, e.attr)


@pytest.mark.parametrize("namespace,module", [("top", "deepgemm_ref"), ("utils", "deepgemm_ref.utils"),
                                              ("utils.math", "deepgemm_ref.utils.math"),
                                              ("utils.layout", "deepgemm_ref.utils.layout")])
def test_each_namespace_holds_exactly_its_table_rows(namespace, module):
    mod = importlib.import_module(module)
    assert vars(mod)["__all__"] == _exports.names(namespace)
    for e in _exports.EXPORTS:
        if namespace in e.namespaces:
            home = importlib.import_module(f"deepgemm_ref.{e.home}")
            want = home if e.attr is None else vars(home)[e.attr]
            assert vars(mod)[e.name] is want, e.name


def test_runtime_all_lists_the_names_it_defines():
    import deepgemm_ref.runtime as rt

    assert rt.__all__ == _exports.defined_in("runtime")
    assert all(getattr(rt, n).__module__ in ("deepgemm_ref", "deepgemm_ref.runtime")
               for n in rt.__all__ if callable(getattr(rt, n)))


# ---------------------------------------------------------------------------------------------
# the namespace follows the profile
# ---------------------------------------------------------------------------------------------

#: Names shown under a target that does not export them, each with a row in docs/compatibility.md:
#: the quantisation utilities under ascend950 (inputs for its kernels are made with them) and the
#: epilogue objects under DeepGEMM's profiles (the GEMMs there take DeepGEMM-Ascend's epilogue=).
KEPT = {"deepgemm-ascend": {"align", "cast_back_from_fp4", "ceil_div", "ceil_to_ue8m0", "pack_ue8m0_to_int",
                            "per_block_cast_to_fp8", "per_channel_cast_to_fp8", "per_custom_dims_cast_to_fp8",
                            "per_token_cast_to_fp4", "per_token_cast_to_fp8", "transpose_packed_fp4",
                            "unpack_ue8m0_from_int"},
        "deepgemm": {"epilogue"}}
OTHER = {"deepgemm": "deepgemm-ascend", "deepgemm-ascend": "deepgemm"}


def _reference(target: str, module: str) -> set[str]:
    return {e.name for e in names.reference_entries(target) if e.module == module}


@pytest.mark.parametrize("arch,target", [("sm90", "deepgemm"), ("sm100", "deepgemm"), ("ascend950", "deepgemm-ascend")])
def test_hasattr_and_dir_show_what_the_target_exports(arch, target):
    top = set(_exports.names("top"))
    with dg.numerics(arch=arch):
        mine, theirs = _reference(target, "deep_gemm"), _reference(OTHER[target], "deep_gemm")
        shown = {n for n in top if hasattr(dg, n)}
        assert mine & top <= shown, sorted(mine & top - shown)
        assert (shown & theirs) - mine == KEPT[target] & top, sorted((shown & theirs) - mine)
        assert {n for n in dir(dg) if n in top} == shown
        assert set(dg.__all__) == shown
        ns: dict[str, object] = {}
        exec("from deepgemm_ref import *", ns)  # noqa: S102 - the star import must work under every profile
        assert set(ns) - {"__builtins__"} == shown
        c_mine, c_theirs = _reference(target, "deep_gemm._C"), _reference(OTHER[target], "deep_gemm._C")
        c_shown = {n for n in vars(dg._C) if not n.startswith("__") and hasattr(dg._C, n)}
        assert c_mine <= c_shown, sorted(c_mine - c_shown)
        assert not (c_shown & c_theirs) - c_mine, sorted((c_shown & c_theirs) - c_mine)


def test_hidden_names_come_back_with_the_profile():
    assert hasattr(dg, "fp8_mqa_logits") and hasattr(dg, "set_pdl") and hasattr(dg, "utils")
    assert not hasattr(dg, "aclnn_bf16_gemm_nt") and not hasattr(dg, "ASCEND_HOME")
    with dg.numerics(arch="ascend950"):
        for name in ("fp8_mqa_logits", "fp8_paged_mqa_logits", "m_grouped_fp8_fp4_gemm_nt_masked",
                     "m_grouped_bf16_gemm_nt_masked", "set_pdl", "get_pdl", "set_tc_util", "bf16_mega_moe",
                     "fp8_gemm_nt_skip_head_mid", "get_tma_aligned_size", "utils", "math", "init_dist"):
            assert not hasattr(dg, name) and name not in dir(dg), name
        with pytest.raises(AttributeError, match="ascend950 profile: DeepGEMM-Ascend does not export it"):
            dg.set_pdl  # noqa: B018
        with pytest.raises(ImportError, match="fp8_mqa_logits"):
            from deepgemm_ref import fp8_mqa_logits  # noqa: F401
        assert hasattr(dg, "aclnn_bf16_gemm_nt") and hasattr(dg, "ASCEND_HOME") and hasattr(dg, "set_npu_arch")
        assert hasattr(dg._C, "set_dry_run") and hasattr(dg._C, "Runtime") and not hasattr(dg._C, "bf16_mega_moe")
        # the objects stay in the module dictionary and in their homes
        assert vars(dg)["fp8_mqa_logits"] is dg.attention.fp8_mqa_logits
    from deepgemm_ref import fp8_mqa_logits  # noqa: F401, F811 - back under sm100
    assert hasattr(dg, "set_pdl") and not hasattr(dg._C, "set_dry_run") and hasattr(dg._C, "bf16_mega_moe")


def test_reference_names_resolve_under_any_profile():
    """deepgemm-ref info lists both targets whatever the active profile: resolution ignores it."""
    for arch in ("sm100", "ascend950"):
        with dg.numerics(arch=arch):
            for target in ("deepgemm", "deepgemm-ascend"):
                done, _ = names.implementation_status(target, dg)
                assert f"deep_gemm.{'set_pdl' if target == 'deepgemm' else 'set_npu_arch'}" in done
