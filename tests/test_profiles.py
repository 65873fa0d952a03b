"""Arch profiles as data: the kernel rules each kernel family reads instead of testing the arch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref.profiles import PROFILES, KernelRules, ScaleRules


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_states_every_rule(name):
    p = PROFILES[name]
    assert p.name == name and isinstance(p.rules, KernelRules) and isinstance(p.rules.scales, ScaleRules)
    for f in dataclasses.fields(KernelRules):
        assert getattr(p.rules, f.name) is not None or f.name in ("zero_psum_gaps", "fixed_mk_alignment"), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.rules.mqa_fp4 = True  # type: ignore[misc]
    # MMA block scaling goes with per-32 UE8M0 scales; the promotion multiply with float32 ones
    assert p.mma_block_scaling == (32 in p.rules.scales.gran_k and p.rules.scales.float32 == "ue8m0")
    if p.rules.fixed_mk_alignment is not None:
        assert p.rules.fixed_mk_alignment == p.default_mk_alignment


@pytest.mark.parametrize("arch", sorted(PROFILES))
def test_rules_are_what_the_public_functions_do(arch):
    with dg.numerics(arch=arch):
        rules = dg.get_profile().rules
        assert dg.get_mk_alignment_for_contiguous_layout() == (rules.fixed_mk_alignment or 128)
        start, step = rules.theoretical_mk_alignment
        assert dg.get_theoretical_mk_alignment_for_contiguous_layout() == start
        if step:
            assert dg.get_theoretical_mk_alignment_for_contiguous_layout(40) == 64
        # FP4 operands exactly where the rules list int8 packed data
        a = np.zeros((4, 64), np.int8)
        d = np.zeros((4, 4), np.float32)
        sf = np.ones((4, 4), np.float32) if 32 in rules.scales.gran_k else np.ones((4, 1), np.float32)
        if np.dtype(np.int8) in rules.fp8_dtypes:
            dg.fp8_fp4_gemm_nt((a, sf), (a, sf), d, recipe=(1, 1, 32))
        else:
            with pytest.raises(dg.DGArgumentError, match="a: expected dtype float8_e4m3fn"):
                dg.fp8_fp4_gemm_nt((a, sf), (a, sf), d, recipe=(1, 1, 32))
