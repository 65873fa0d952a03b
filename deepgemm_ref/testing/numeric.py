"""``deepgemm_ref.testing.numeric``: mirrors ``deep_gemm.testing.numeric``."""

from . import assert_bitwise_equal, calc_diff, count_bytes, ulp_distance  # noqa: F401
