"""The deepgemm-ref command."""

from __future__ import annotations

from deepgemm_ref.cli import main


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "active arch profile: sm100" in out
    assert "numpy" in out and "ml_dtypes" in out
    assert "public names implemented" in out


def test_demo(capsys):
    assert main(["demo", "--m", "2", "--n", "256"]) == 0
    out = capsys.readouterr().out
    assert "per_token_cast_to_fp8(use_ue8m0=True" in out and "calc_diff" in out


def test_usage_error_exit_code():
    assert main(["no-such-command"]) == 2
