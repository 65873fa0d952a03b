"""Cases too large to hold whole are computed and written in blocks of output rows
(golden/rowblocks.py): the same file bytes and per-tensor digests as the whole case at once, the
estimate's own memory within the limit, the streaming writer's checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from deepgemm_ref.golden import generation
from deepgemm_ref.golden import safetensors as st
from deepgemm_ref.golden.cases import estimate_case, validate_spec
from deepgemm_ref.golden.resources import OWN_SHARE, PEAK_FIXED, row_block

from .ordered import assert_ordered_close

_MiB = 1 << 20

# (kernel, profile, extra keys): every operand layout, FP8 / FP4 scales, c, alpha, skip_head_mid
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("bf16_gemm_nt", "sm100", {"out": "f32"}),
    ("bf16_gemm_tn", "sm90", {"out": "bf16", "c": "is_d"}),
    ("fp8_gemm_nt", "sm90", {"out": "bf16", "gran_n": 128}),
    ("fp8_gemm_tn", "sm100", {"out": "f32", "c": "is_d"}),
    ("fp8_gemm_nn", "sm100", {"out": "bf16"}),
    ("fp8_gemm_tt", "ascend950", {"out": "bf16"}),
    ("fp8_fp4_gemm_nt", "sm100", {"out": "bf16", "a": "fp4", "b": "fp4", "gran_k_a": 32, "gran_k_b": 32}),
    ("cublaslt_gemm_nt", "sm100", {"out": "bf16", "c": "separate"}),
    ("fp8_gemm_nt_skip_head_mid", "sm100", {"out": "f32", "head_splits": [16, 8, 16]}),
    # m-grouped: masked in blocks of whole groups, contiguous m_indices in whole alignment blocks
    ("m_grouped_fp8_gemm_nt_masked", "sm100", {"groups": 6, "m": 64, "max_m": 96}),
    ("m_grouped_bf16_gemm_nt_masked", "sm90", {"groups": 5, "m": 64, "max_m": 128}),
    ("m_grouped_fp8_gemm_nt_contiguous", "sm90", {"groups": 5, "m": 200, "layout": "m_indices"}),
    ("m_grouped_bf16_gemm_nt_contiguous", "sm100", {"groups": 4, "m": 300, "layout": "m_indices"}),
]


def _generate(spec: dict[str, Any], out: Path, max_memory: int | None) -> dict[str, Any]:
    generation.generate([spec], out, max_memory=max_memory)
    entry: dict[str, Any] = json.loads((out / "manifest.json").read_text())["cases"][0]
    return entry


def _lead(spec: dict[str, Any]) -> int:
    """The length of the case's main output's leading axis (what row blocks cut)."""
    from deepgemm_ref.golden.cases import build_case

    return int(next(iter(build_case(spec).outputs.values()))["shape"][0])


def _limit_for_blocks(spec: dict[str, Any]) -> int:
    """The smallest limit (in MiB steps) under which the case is computed in several row blocks."""
    v = validate_spec(spec)
    lead = _lead(spec)
    for mib in range(2, 256):
        est = estimate_case(v, mib * _MiB)
        if est is not None and 0 < est.row_block < lead and est.peak_bytes <= mib * _MiB:
            return mib * _MiB
    raise AssertionError(f"no limit gives row blocks for {spec}")


#: in the default run: one dense and one grouped case, normal values (the rest: slow)
_QUICK = {"bf16_gemm_nt", "m_grouped_fp8_gemm_nt_masked"}
_PARAMS = [pytest.param(kernel, profile, extra, values, id=f"{kernel}-{profile}-{values}",
                        marks=() if kernel in _QUICK and values == "normal" else pytest.mark.slow)
           for kernel, profile, extra in CASES for values in ("normal", "adversarial")]


@pytest.mark.parametrize(("kernel", "profile", "extra", "values"), _PARAMS)
def test_row_blocks_give_the_whole_case_bytes(tmp_path: Path, kernel: str, profile: str, extra: dict[str, Any],
                                             values: str) -> None:
    spec = {"id": "rb", "kernel": kernel, "profile": profile, "m": 320, "n": 256, "k": 256, "values": values,
            **extra}
    limit = _limit_for_blocks(spec)
    est = estimate_case(validate_spec(spec), limit)
    assert est is not None and est.row_block and -(-_lead(spec) // est.row_block) >= 2
    whole = _generate(spec, tmp_path / "whole", None)
    blocks = _generate(spec, tmp_path / "blocks", limit)
    _same_but_s(tmp_path, whole, blocks, spec["k"])
    # the statistics count the elements each tier of the exact model decided: which tier decides
    # can follow the chunk (a certificate from a block's own row norms), the count does not
    assert sum(blocks["golden_stats"].values()) == sum(whole["golden_stats"].values())
    assert not list((tmp_path / "blocks" / "cases").glob(".*"))  # no temporary file left


_ORDERED = ("golden.S", "golden.acc")  # bytes that follow the BLAS's summation order (docs/numerics.md)


def test_row_blocks_hold_one_block_of_goldens_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When a block's golden is computed, no earlier block's golden tensor is alive: the peak holds
    one block (the loop variables once kept the previous block's goldens through the next one's
    computation: 12.4 GiB against an estimate of 9.4 GiB for the largest deepgemm-tests case)."""
    import weakref

    from deepgemm_ref.golden import rowblocks

    refs: list[weakref.ref[Any]] = []
    alive: list[int] = []
    real = rowblocks.compute_golden

    def tracked(case: Any) -> Any:
        alive.append(sum(r() is not None for r in refs))
        golden, stats = real(case)
        refs.extend(weakref.ref(v) for v in golden.values())
        return golden, stats

    monkeypatch.setattr(rowblocks, "compute_golden", tracked)
    spec = {"id": "rb", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 320, "n": 256, "k": 256, "out": "f32"}
    _generate(spec, tmp_path / "blocks", _limit_for_blocks(spec))
    assert len(alive) >= 2 and refs and alive == [0] * len(alive), alive


def _same_but_s(tmp_path: Path, whole: dict[str, Any], blocks: dict[str, Any], k: int) -> None:
    """Every tensor's bytes equal but ``S`` and ``acc``, whose bytes follow the BLAS's summation
    order (for small M the order depends on M): ``S`` equal or within the documented factor
    G(K); ``acc`` equal or, where the rounding certificate decided, within 2 gamma_K(2^-53) S of
    each other (each float64 sum is within gamma_K(2^-53) S of the exact one)."""
    assert {n: e for n, e in blocks["tensors"].items() if n not in _ORDERED} == \
        {n: e for n, e in whole["tensors"].items() if n not in _ORDERED}
    if blocks["file_sha256"] == whole["file_sha256"]:
        assert (tmp_path / "blocks" / blocks["file"]).read_bytes() == (tmp_path / "whole" / whole["file"]).read_bytes()
        return
    w = st.load_file(tmp_path / "whole" / whole["file"])
    b = st.load_file(tmp_path / "blocks" / blocks["file"])
    assert ("golden.acc" in w) == ("golden.acc" in b)
    assert_ordered_close(w["golden.S"], b["golden.S"], k, w.get("golden.acc"), b.get("golden.acc"))


@pytest.mark.slow
def test_special_values_in_row_blocks(tmp_path: Path) -> None:
    spec = {"id": "rb", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 300, "n": 256, "k": 384,
            "values": "special", "out": "f32"}
    limit = _limit_for_blocks(spec)
    whole = _generate(spec, tmp_path / "whole", None)
    blocks = _generate(spec, tmp_path / "blocks", limit)
    _same_but_s(tmp_path, whole, blocks, spec["k"])


def test_row_block_sizes() -> None:
    limit = 64 * _MiB
    # fits: the whole case at once
    assert row_block(100, 1 * _MiB, 1000, limit) == 0
    # does not fit: balanced blocks, each within the share
    rows, fixed, per_row = 10_000, 8 * _MiB, 20_000
    b = row_block(rows, fixed, per_row, limit)
    blocks = -(-rows // b)
    assert 1 < b < rows and b * per_row <= OWN_SHARE * limit - PEAK_FIXED - fixed
    assert (blocks - 1) * b < rows <= blocks * b and blocks * b - rows < blocks
    # nothing but the fixed tensors fits: one row per block (the case's peak refuses it)
    assert row_block(10, limit, 1000, limit) == 1


def test_the_largest_preset_case_plans_within_the_default_limit_of_a_24_gib_machine() -> None:
    from deepgemm_ref.golden.presets import preset

    spec = next(s for s in preset("deepgemm-tests") if s["id"] == "sm100-bf16-f32-m4096-n129280-k7168")
    limit = 12 << 30  # half of 24 GiB
    est = estimate_case(validate_spec(spec), limit)
    assert est is not None and 0 < est.row_block < 4096
    assert est.peak_bytes <= limit and est.own_bytes <= OWN_SHARE * limit
    assert est.file_bytes > 16 << 30  # the file is whole: about 16 GiB


def test_stream_writer_matches_save_file_and_checks_its_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    tensors = {"x": rng.standard_normal((7, 3)), "flag": rng.random((7, 2)) < 0.5,
               "w": rng.standard_normal((4,)).astype(ml_dtypes.bfloat16), "s": np.asarray(np.float32(2.5))}
    st.save_file(tensors, tmp_path / "ref.safetensors", metadata={"k": "v"})
    layout = {k: (np.asarray(v).dtype, np.shape(v)) for k, v in tensors.items()}
    with st.StreamWriter(tmp_path / "new.safetensors", layout, {"k": "v"}) as w:
        w.write("w", tensors["w"])
        w.write("s", np.asarray(tensors["s"]))
        for name in ("x", "flag"):
            w.write(name, tensors[name][:3], 0)
            with pytest.raises(st.SafetensorsError, match="out of order"):
                w.write(name, tensors[name][4:], 4)
            w.write(name, tensors[name][3:], 3)
        with pytest.raises(st.SafetensorsError, match="expected rows of float64"):
            w.write("x", np.zeros((1, 4)), 7)
        digests = {k: w.tensor_sha256(k) for k in tensors}
        w.commit()
    assert (tmp_path / "new.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    assert digests == {k: st.tensor_sha256(np.asarray(v)) for k, v in tensors.items()}


def test_stream_writer_refuses_an_unfinished_file_and_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "t.safetensors"
    with pytest.raises(st.SafetensorsError, match="1 of 2 rows written"), \
            st.StreamWriter(target, {"x": (np.float32, (2, 3))}) as w:
        w.write("x", np.zeros((1, 3), np.float32), 0)
        w.commit()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), st.StreamWriter(target, {"x": (np.float32, (2, 3))}) as w:
        w.write("x", np.zeros((2, 3), np.float32), 0)
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    target.write_bytes(b"keep")
    with pytest.raises(st.SafetensorsError, match="file exists"):
        st.StreamWriter(target, {"x": (np.float32, (2, 3))})
    assert target.read_bytes() == b"keep" and len(list(tmp_path.iterdir())) == 1


def test_verify_reads_a_case_larger_than_the_limit_in_chunks(tmp_path: Path) -> None:
    from deepgemm_ref.golden.bundle import load_bundle
    from deepgemm_ref.golden.generation import verify
    from deepgemm_ref.golden.resources import ResourceError

    spec = {"id": "rb", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 320, "n": 256, "k": 256, "out": "f32"}
    limit = _limit_for_blocks(spec)
    entry = _generate(spec, tmp_path / "b", limit)
    path = tmp_path / "b" / entry["file"]
    small = path.stat().st_size // 2
    with pytest.raises(ResourceError, match="over the memory limit"):
        load_bundle(tmp_path / "b", max_memory=small).case("rb")  # loading whole is refused
    assert verify(tmp_path / "b", max_memory=small)["ok"]  # verifying streams
    # regenerating computes in row blocks as generation did, comparing digests (nothing held whole)
    report = verify(tmp_path / "b", max_memory=limit, regenerate=True)
    assert report["ok"] and report["regenerated"] == 1, report
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1  # one bit of a golden tensor
    path.write_bytes(bytes(data))
    report = verify(tmp_path / "b", max_memory=small)
    assert not report["ok"] and "sha256 differs from the manifest" in report["problems"][0]
    data[len(data) // 2] ^= 1
    data[20] = ord("!")  # the header
    path.write_bytes(bytes(data))
    report = verify(tmp_path / "b", max_memory=small)
    assert not report["ok"] and "sha256 differs from the manifest" in report["problems"][0]
