"""The deepgemm-ref command."""

from __future__ import annotations

from deepgemm_ref.cli import main


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "active arch profile: sm100" in out
    assert "numpy" in out and "ml_dtypes" in out
    assert "public names implemented" in out
    # Every name that is not implemented is listed with its reason.
    from deepgemm_ref import names

    for target in ("deepgemm", "deepgemm-ascend"):
        done, missing = names.implementation_status(target)
        assert done and all(why for why in missing.values())
        for n, why in missing.items():
            assert f"[ ] {n}: {why}" in out
    assert set(names.implementation_status("deepgemm")[1]) == {
        "deep_gemm._C.fp8_fp4_mega_moe", "deep_gemm._C.bf16_mega_moe", "deep_gemm.init_dist",
        "deep_gemm.uneven_all_gather"}
    assert set(names.implementation_status("deepgemm-ascend")[1]) == {"deep_gemm._C.fp8_fp4_mega_moe",
                                                                       "deep_gemm.testing.envs.init_dist"}


def test_demo(capsys):
    assert main(["demo", "--m", "2", "--n", "256"]) == 0
    out = capsys.readouterr().out
    assert "per_token_cast_to_fp8(use_ue8m0=True" in out and "calc_diff" in out


def test_usage_error_exit_code():
    assert main(["no-such-command"]) == 2


def test_u_acc_accepts_powers_of_two():
    from deepgemm_ref.cli import build_parser

    p = build_parser()
    for text, want in (("2^-13", 2.0**-13), ("2**-13", 2.0**-13), ("1e-4", 1e-4)):
        assert p.parse_args(["check", "b", "--outputs", "o", "--u-acc", text]).u_acc == want
