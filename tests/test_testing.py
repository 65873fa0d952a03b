"""calc_diff, count_bytes, assert_bitwise_equal and ulp_distance."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from deepgemm_ref import testing
from deepgemm_ref.errors import DGArgumentError


def test_calc_diff_identity_and_zero():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(100), rng.standard_normal(100)
    d = testing.calc_diff(x, y)
    assert isinstance(d, np.float64)
    assert d == pytest.approx(np.sum((x - y) ** 2) / (np.sum(x**2) + np.sum(y**2)), rel=1e-12)
    assert testing.calc_diff(np.zeros(3), np.zeros(3)) == 0.0 and isinstance(testing.calc_diff(np.zeros(3), np.zeros(3)), float)
    assert testing.calc_diff(x.astype(ml_dtypes.bfloat16), x.astype(ml_dtypes.bfloat16)) == pytest.approx(0.0, abs=1e-15)


def test_count_bytes():
    a = np.zeros((3, 4), np.float32)
    b = np.zeros(5, ml_dtypes.bfloat16)
    assert testing.count_bytes(a, [b, None, (a,)]) == 48 + 10 + 48
    assert testing.count_bytes() == 0


def test_assert_bitwise_equal_reports_first_mismatch():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    testing.assert_bitwise_equal(x, x.copy())
    y = x.copy()
    y[2, 1] = -9.0
    y[2, 3] = 5.0
    with pytest.raises(AssertionError) as info:
        testing.assert_bitwise_equal(x, y, label="probe")
    msg = str(info.value)
    for part in ("(probe)", "num_bytes=48", "elem=9", "coord=(2, 1)", "x_val=9.0", "y_val=-9.0", "first_byte=", "byte_in_elem="):
        assert part in msg
    with pytest.raises(AssertionError):
        testing.assert_bitwise_equal(x, x.astype(np.float64))
    # -0.0 and +0.0 differ in bytes
    with pytest.raises(AssertionError):
        testing.assert_bitwise_equal(np.array([0.0]), np.array([-0.0]))


def test_ulp_distance():
    x = np.array([1.0, 1.0, 0.0, -0.0, np.nan, np.nan, -1.0], np.float32)
    y = np.array([1.0, np.nextafter(np.float32(1), np.float32(2)), -0.0, np.float32(1.4e-45), np.nan, 1.0, 1.0], np.float32)
    d = testing.ulp_distance(x, y)
    big = np.iinfo(np.int64).max
    assert d.tolist() == [0, 1, 0, 1, 0, big, 2 * 0x3F800000]
    b = np.array([1.0, 2.0], ml_dtypes.bfloat16)
    assert testing.ulp_distance(b, np.array([1.0078125, 2.0], ml_dtypes.bfloat16)).tolist() == [1, 0]
    e = np.array([-448.0], ml_dtypes.float8_e4m3fn)
    assert testing.ulp_distance(e, np.array([448.0], ml_dtypes.float8_e4m3fn)).tolist() == [2 * 0x7E]
    f64 = testing.ulp_distance(np.array([1.0]), np.array([np.nextafter(1.0, 2.0)]))
    assert f64.tolist() == [1]
    with pytest.raises(DGArgumentError):
        testing.ulp_distance(np.zeros(2, np.float32), np.zeros(2, np.float64))


def test_filters_and_context_managers(capsys, monkeypatch):
    ran = []

    @testing.test_filter(lambda: False)
    def skipped():
        ran.append(1)

    skipped()
    assert not ran and "Filtered by" in capsys.readouterr().out
    monkeypatch.setenv("DG_X", "1")
    seen = []

    @testing.ignore_env("DG_X", lambda: True)
    def probe():
        import os
        seen.append(os.environ.get("DG_X"))

    probe()
    assert seen == [None]
    import os
    assert os.environ["DG_X"] == "1"
    with testing.empty_suppress():
        pass
    assert testing.bench(lambda: None, num_warmups=1, num_tests=3) >= 0
