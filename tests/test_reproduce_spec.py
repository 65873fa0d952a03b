"""The reproduce spec printed by a failing ``assert_matches_golden`` rebuilds the same case: the
same input bytes and the same golden bytes (values drawn by position, ``row_offsets`` included)."""

from __future__ import annotations

import ast
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from deepgemm_ref.golden.case import Case
from deepgemm_ref.strategies import cases
from deepgemm_ref.testing import assert_matches_golden


def _corrupt(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Flip bits in every byte of every output (a device that is certainly wrong)."""
    out = {}
    for name, v in outputs.items():
        a = np.array(v, copy=True)
        a.view(np.uint8).reshape(-1)[:] ^= 0x41
        out[name] = a
    return out


@pytest.mark.parametrize("values", ["normal", "adversarial", "special"])
@pytest.mark.parametrize("kernel", ["fp8_gemm_nt", "m_grouped_bf16_gemm_nt_masked", "fp8_fp4_paged_mqa_logits"])
def test_printed_reproduce_spec_rebuilds_the_same_bytes(kernel: str, values: str) -> None:
    checked = []

    @settings(max_examples=2, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases(kernel, values=values))
    def run(case: Case) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            golden = case.golden()
            bad = _corrupt({k: golden[k] for k in case.entry["outputs"]})
            if case.compare(bad).ok:
                return  # nothing defined to corrupt (e.g. every row masked)
            with pytest.raises(AssertionError) as err:
                assert_matches_golden(case, bad)
        found = re.search(r"reproduce: Case\.from_spec\((\{.*\})\)", str(err.value))
        assert found, str(err.value)[-400:]
        again = Case.from_spec(ast.literal_eval(found.group(1)))
        for name, x in case.inputs.items():
            assert np.asarray(again.inputs[name]).tobytes() == np.asarray(x).tobytes(), name
        g2 = again.golden()
        for name, x in golden.items():
            assert np.asarray(g2[name]).tobytes() == np.asarray(x).tobytes(), name
        checked.append(case.id)

    run()
    assert checked
