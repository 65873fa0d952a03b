"""``assert_matches_golden``: one call that checks a device's outputs of a golden case, in the
manner of ``torch.testing.assert_close``.

The case object does the work (:meth:`deepgemm_ref.golden.case.Case.compare`: the golden
checker of ``deepgemm-ref check``); this module only turns its verdict into an
``AssertionError``, so the testing helpers stay below the golden workflow.
"""

from __future__ import annotations

from typing import Any

from ..errors import DGArgumentError

__all__ = ["assert_matches_golden"]


# Note: an addition to DeepGEMM's testing helpers; a test that also runs against the real library
# imports it from deepgemm_ref.testing, not from the module under test.
def assert_matches_golden(case: Any, outputs: Any, **checker_options: Any) -> None:
    """Raise ``AssertionError`` unless ``outputs`` match the golden values of ``case``.

    case: a :class:`deepgemm_ref.strategies.Case` (drawn by ``deepgemm_ref.strategies.cases``,
    or ``Case.from_spec`` / ``Case.from_bundle``).  outputs: what ``case.call(module, device=...)``
    returns (output name -> array or tensor, on any device), or one array for the main output.
    checker_options: the checker's ``lam`` (lambda, default 8), ``u_acc`` (the accumulator's unit
    roundoff; default the case's, 2^-24 for float32 accumulation), ``n`` (rounding-path length;
    default the case's, K for GEMMs), ``worst`` (elements reported, default 10), ``accumulation``
    (the device's accumulator model, ``"fp32"`` or ``"limited(13, 128)"``), ``bias_test`` (default
    True: an output whose errors lean one way further than the model's fails, see
    docs/numerics.md), ``bias_threshold`` (log10 p, default -12), ``bias_margin`` and ``strict``
    (elements past the probabilistic bound but inside the deterministic one fail instead of
    passing with a warning).

    Every defined element must lie in ``[f(y - E), f(y + E)]`` (``y`` the exact accumulator,
    ``f`` the kernel's epilogue, ``E = lambda sqrt(n) u_acc S`` plus epilogue terms; see
    docs/numerics.md); NaN and infinities must match by class and position.  The message names
    the kernel, profile, shapes, seed and case, how many elements fail, the worst few (index,
    128x128 tile, device value, golden value, allowed interval, ULPs), NaN / inf class mismatches,
    and the specification that regenerates the case as a golden bundle.
    """
    __tracebackhide__ = True  # pytest shows the caller's line
    compare = getattr(case, "compare", None)
    if compare is None or not callable(compare):
        raise DGArgumentError(f"assert_matches_golden: case: expected a deepgemm_ref.strategies.Case; got "
                              f"{type(case).__name__}")
    result = compare(outputs, **checker_options)
    if not result.ok:
        raise AssertionError(result.message())
