"""The ascend-probes preset and `deepgemm-ref probe analyse` (numerics.md section 7)."""

from __future__ import annotations

import pytest

from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.golden.probes import analyse


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes") / "b"
    golden.generate(golden.preset("ascend-probes"), root)
    return root


# 32: promotion every MMA block (only the position-16 probe inside the first group sees it);
# 320, 480: intervals that are not powers of two; 8: narrow enough to have truncated the output
# rounding probe's small terms when they shared the 1.0's interval.
@pytest.mark.parametrize("bits,interval", [(13, 128), (10, 64), (17, 256), (13, 32), (13, 320), (20, 480),
                                           (8, 128)])
def test_limited_model_is_recovered(probes, tmp_path, bits, interval):
    outs = golden.replay(probes, tmp_path / "o.safetensors", accumulation=f"limited({bits}, {interval})")
    result = analyse(outs)
    assert result["accumulator_bits"] == bits and result["promotion_interval"] == interval
    assert result["model"] == f"limited({bits}, {interval})"
    assert result["group_rounding"].startswith("truncation")
    assert result["output_rounding"] == "round to nearest even"


def test_exact_and_fp32_show_no_narrow_accumulator(probes, tmp_path):
    for model in ("exact", "fp32"):
        outs = golden.replay(probes, tmp_path / f"{model}.safetensors", accumulation=model)
        result = analyse(outs)
        assert result["accumulator_bits"].startswith(">= 24")
        assert result["ue8m0_byte_0"].startswith("2^-127")


def test_exact_outputs_pass_the_checker_and_cli(probes, tmp_path, capsys):
    out = tmp_path / "o.safetensors"
    assert main(["replay", str(probes), "--out", str(out), "--accumulation", "limited(13, 128)"]) == 0
    capsys.readouterr()
    assert main(["probe", "analyse", str(out)]) == 0
    text = capsys.readouterr().out
    assert "accumulator_bits: 13" in text and "promotion_interval: 128" in text and "limited(13, 128)" in text


def test_hand_made_device_outputs():
    """A device reading UE8M0 byte 0 as zero and truncating its bf16 output is recognised."""
    import ml_dtypes
    import numpy as np

    outs = {"probe-ue8m0_zero/d": np.zeros((1, 1), np.float32),
            "probe-output_rounding/d": np.array([[1.0], [1 + 2.0**-7], [1], [1], [1], [1]], ml_dtypes.bfloat16)}
    r = analyse(outs)
    assert r["ue8m0_byte_0"].startswith("zero") and r["output_rounding"] == "truncation"
