"""``deepgemm_ref.testing.utils``: mirrors ``deep_gemm.testing.utils``."""

from . import get_arch_major, ignore_env, test_filter  # noqa: F401
