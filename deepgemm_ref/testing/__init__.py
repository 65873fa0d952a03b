"""DeepGEMM's testing helpers (``deep_gemm.testing``), DeepGEMM-Ascend's, and a ULP-distance helper.

``calc_diff``, ``count_bytes`` and ``assert_bitwise_equal`` keep DeepGEMM's names, signatures
and results; they accept NumPy arrays and torch CPU tensors.  Timing helpers (:mod:`.bench`)
measure wall-clock time on the CPU (there is no device).  DeepGEMM-Ascend's additions
(``bench_msprof``, ``KernelProfile``, ``close_persistent_profiler`` and the ``bench``, ``envs``,
``par_compile``, ``disable_fallback`` sub-modules) are here too; :mod:`.npu_shim` maps
``torch.npu`` to the CPU so that DeepGEMM-Ascend's own test helpers run unchanged.
"""

from __future__ import annotations

import sys

from . import numeric, utils  # noqa: F401  (sub-modules)
from .bench import KernelProfile, bench, bench_kineto, bench_msprof, close_persistent_profiler, empty_suppress
from .bench import _SuppressStdoutStderr as suppress_stdout_stderr
from .numeric import assert_bitwise_equal, calc_diff, count_bytes, ulp_distance
from .utils import get_arch_major, ignore_env, test_filter

__all__ = [
    "calc_diff",
    "count_bytes",
    "assert_bitwise_equal",
    "ulp_distance",
    "bench",
    "empty_suppress",
    "suppress_stdout_stderr",
    "get_arch_major",
    "test_filter",
    "ignore_env",
    "bench_kineto",
    "bench_msprof",
    "KernelProfile",
    "close_persistent_profiler",
]

# ``deepgemm_ref.testing.bench`` is DeepGEMM's function ``bench`` (its star import shadows the
# module); ``from deepgemm_ref.testing.bench import ...`` still imports the module.  The function
# also carries the module's DeepGEMM-Ascend names, so ``testing.bench.bench_msprof`` and
# ``testing.bench.suppress_stdout_stderr(False)`` work as with DeepGEMM-Ascend's module.
# ``testing.suppress_stdout_stderr`` is DeepGEMM's argument-less class.
for _name in ("bench_msprof", "KernelProfile", "close_persistent_profiler", "suppress_stdout_stderr",
              "bench_kineto", "empty_suppress"):
    setattr(bench, _name, getattr(sys.modules[__name__ + ".bench"], _name))
del _name

from . import disable_fallback, envs, npu_shim, par_compile  # noqa: E402, F401  (sub-modules)
