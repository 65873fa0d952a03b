"""The deepgemm-ref command."""

from __future__ import annotations

import deepgemm_ref as dg
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
        done, missing = names.implementation_status(target, dg)
        assert done and all(why for why in missing.values())
        for n, why in missing.items():
            assert f"[ ] {n}: {why}" in out
    assert set(names.implementation_status("deepgemm", dg)[1]) == {
        "deep_gemm._C.fp8_fp4_mega_moe", "deep_gemm._C.bf16_mega_moe"}
    assert set(names.implementation_status("deepgemm-ascend", dg)[1]) == {"deep_gemm._C.fp8_fp4_mega_moe"}


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


def test_unexpected_errors_are_one_line_without_traceback(monkeypatch, capsys):
    """A bug (an unexpected exception) is one line naming it, exit 2; DEEPGEMM_REF_TRACEBACK=1
    lets the traceback through for a developer."""
    import pytest

    from deepgemm_ref import cli

    def broken(args):
        raise TypeError("something unexpected")

    monkeypatch.setattr(cli, "_cmd_list", broken)
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: TypeError: something unexpected" in err
    assert "Traceback" not in err
    monkeypatch.setenv("DEEPGEMM_REF_TRACEBACK", "1")
    with pytest.raises(TypeError):
        main(["list"])


def test_resource_and_interrupt_exit_codes(monkeypatch, capsys):
    import signal

    from deepgemm_ref import cli
    from deepgemm_ref.golden.generation import GenerationInterrupted

    for exc, code, words in ((MemoryError(), 2, "out of memory"), (OSError(28, "No space left on device"), 2,
                                                                      "No space left"),
                             (GenerationInterrupted(signal.SIGTERM, "interrupted by SIGTERM: kept"), 143, "kept"),
                             (KeyboardInterrupt(), 130, "interrupted")):
        def raiser(args, exc=exc):
            raise exc

        monkeypatch.setattr(cli, "_cmd_list", raiser)
        assert main(["list"]) == code
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err


def test_list_counts_every_preset(capsys):
    from deepgemm_ref import golden

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in golden.PRESETS:
        n = len(golden.preset(name))
        assert f"{name}: {n} case{'' if n == 1 else 's'}\n" in out  # "ascend-headline: 1 case"


def test_usage_errors_exit_2(capsys):
    for argv in (["golden"], ["golden", "--out", "x"], ["golden", "--preset", "smoke", "--out", "x", "--jobs", "0"],
                 ["check", "b"], ["replay"]):
        assert main(argv) == 2, argv
    capsys.readouterr()
