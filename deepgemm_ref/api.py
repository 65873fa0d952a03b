"""Public names whose signature and behaviour follow the active arch profile.

DeepGEMM and DeepGEMM-Ascend export many of the same names with different parameters
(``fp8_fp4_mqa_logits``'s sixth positional argument changes meaning, ``use_psum_layout``
defaults differ, ...).  A :class:`ProfiledFunction` holds one implementation per target; calling
it runs the implementation of the active profile, and ``inspect.signature`` reports that
implementation's signature, so signature-parity checks see exactly what a caller would.
A name the active target does not provide raises the argument error saying so.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import dryrun
from .errors import DGArgumentError
from .profiles import Profile, get_profile

__all__ = ["ProfiledFunction", "profiled", "not_implemented", "TARGET_LABEL", "CallLog", "log_calls"]

TARGET_LABEL = {"deepgemm": "DeepGEMM 2.6.1", "deepgemm-ascend": "DeepGEMM-Ascend"}


class ProfiledFunction:
    """A callable dispatching on the active profile's target (or, if given, the profile name)."""

    def __init__(
        self,
        name: str,
        impls: dict[str, Callable[..., Any]],
        missing: dict[str, str] | None = None,
        module: str = "deepgemm_ref",
    ) -> None:
        self.__name__ = name
        self.__qualname__ = name
        self.__module__ = module
        self._impls = dict(impls)
        self._missing = dict(missing or {})
        first = next(iter(self._impls.values()))
        self.__doc__ = first.__doc__
        self.__wrapped_impls__ = self._impls

    def impl_for(self, profile: Profile | None = None) -> Callable[..., Any] | None:
        p = profile or get_profile()
        return self._impls.get(p.name) or self._impls.get(p.target)

    def provided_by(self, profile: Profile) -> bool:
        return self.impl_for(profile) is not None

    def _unavailable(self, p: Profile) -> DGArgumentError:
        reason = self._missing.get(p.name) or self._missing.get(p.target) or ""
        return DGArgumentError(
            f"{self.__name__}: not provided by {TARGET_LABEL[p.target]} (active arch profile {p.name!r})"
            + (f": {reason}" if reason else "")
            + "; switch profiles with deepgemm_ref.set_arch(...) or deepgemm_ref.numerics(arch=...)"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        p = get_profile()
        impl = self.impl_for(p)
        if impl is None:
            raise self._unavailable(p)
        log = _log.get()
        if log is not None and not log.depth:
            return log.timed(self.__name__, self._call, impl, p, args, kwargs)
        return self._call(impl, p, args, kwargs)

    def _call(self, impl: Callable[..., Any], p: Profile, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if dryrun.enabled() and p.is_ascend:
            # DeepGEMM-Ascend's _C.set_dry_run(True): the entry point checks its arguments and
            # returns without launching (deepgemm_ref.dryrun).
            with dryrun.call(self.__name__) as outermost:
                try:
                    return impl(*args, **kwargs)
                except dryrun.Stop as done:
                    if not outermost:  # a public function called by another: the outer one returns
                        raise
                    return done.result
        return impl(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        impl = self.impl_for() or next(iter(self._impls.values()))
        return inspect.signature(impl)

    def __repr__(self) -> str:
        return f"<deepgemm_ref function {self.__name__} ({', '.join(self._impls)})>"


class CallLog:
    """The public calls made while :func:`log_calls` is active: ``(name, wall-clock ns)`` of each
    outermost call (a public function called by another counts as part of its caller)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.depth = 0

    def timed(self, name: str, call: Callable[..., Any], *args: Any) -> Any:
        self.depth += 1
        t0 = time.perf_counter_ns()
        try:
            return call(*args)
        finally:
            self.calls.append((name, time.perf_counter_ns() - t0))
            self.depth -= 1


_log: contextvars.ContextVar[CallLog | None] = contextvars.ContextVar("deepgemm_ref_call_log", default=None)


@contextlib.contextmanager
def log_calls() -> Iterator[CallLog]:
    """Log the public calls of this thread for the block (``testing.bench_msprof``'s kernels)."""
    log = CallLog()
    token = _log.set(log)
    try:
        yield log
    finally:
        _log.reset(token)


def profiled(
    name: str, missing: dict[str, str] | None = None, **impls: Callable[..., Any]
) -> ProfiledFunction:
    """``profiled("f", deepgemm=f_cuda, deepgemm_ascend=f_npu)``: keyword names use ``_`` for ``-``."""
    return ProfiledFunction(name, {k.replace("_", "-") if k.startswith("deepgemm") else k: v for k, v in impls.items()},
                            missing)


def not_implemented(reason: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a function kept only for its signature: calling it raises ``NotImplementedError``
    naming the function and ``reason``; ``deepgemm-ref info`` lists it with the reason."""

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def raiser(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"{func.__name__}: not implemented: {reason}")

        raiser.__not_implemented__ = reason  # type: ignore[attr-defined]
        return raiser

    return wrap
