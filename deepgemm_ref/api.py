"""Public names whose signature and behaviour follow the active arch profile.

DeepGEMM and DeepGEMM-Ascend export many of the same names with different parameters
(``fp8_fp4_mqa_logits``'s sixth positional argument changes meaning, ``use_psum_layout``
defaults differ, ...).  A :class:`ProfiledFunction` holds one implementation per target; calling
it runs the implementation of the active profile, and ``inspect.signature`` reports that
implementation's signature, so signature-parity checks see exactly what a caller would.
A name the active target does not provide raises the argument error saying so.

The dispatcher resolves the profile once per call and hands it on: an implementation whose
first parameter is the positional-only ``profile`` receives the active :class:`Profile` there
(kernels validate and compute for that profile without reading the global again), and the
signature reported for it leaves that parameter out.
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

__all__ = ["ProfiledFunction", "profiled", "takes_profile", "public_signature", "not_implemented", "TARGET_LABEL",
           "CallLog", "log_calls"]

TARGET_LABEL = {"deepgemm": "DeepGEMM 2.6.1", "deepgemm-ascend": "DeepGEMM-Ascend"}


def takes_profile(impl: Callable[..., Any]) -> bool:
    """Whether ``impl``'s first parameter is the positional-only ``profile`` the dispatcher fills."""
    try:
        params = list(inspect.signature(impl).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False
    return bool(params) and params[0].name == "profile" and params[0].kind is inspect.Parameter.POSITIONAL_ONLY


def public_signature(impl: Callable[..., Any]) -> inspect.Signature:
    """``impl``'s signature as callers see it (without the ``profile`` the dispatcher fills)."""
    sig = inspect.signature(impl)
    if takes_profile(impl):
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return sig


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
        self._with_profile = {id(f) for f in self._impls.values() if takes_profile(f)}

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

    def alias(self, name: str) -> ProfiledFunction:
        """The same function under another public name: its argument errors name ``name``."""
        # Note: DeepGEMM registers an FP8 name (fp8_gemm_nt, ...) as the very object of its
        # fp8_fp4 name; here it is a second object sharing the implementations, so an argument
        # error names the function the caller called.
        twin = ProfiledFunction(name, self._impls, self._missing, self.__module__)
        twin._canonical = self._canonical or self.__name__
        return twin

    _canonical: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        p = get_profile()
        impl = self.impl_for(p)
        if impl is None:
            raise self._unavailable(p)
        log = _log.get()
        try:
            if log is not None and not log.depth:
                return log.timed(self.__name__, self._call, impl, p, args, kwargs)
            return self._call(impl, p, args, kwargs)
        except DGArgumentError as e:
            self._retell(e, args, kwargs)
            raise

    def _retell(self, e: DGArgumentError, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """An argument error as the caller sees it: it names the function called (an alias's own
        name), and describes the caller's torch tensors as tensors (the checks see NumPy views)."""
        if len(e.args) != 1 or not isinstance(e.args[0], str):
            return
        msg = e.args[0]
        if self._canonical and msg.startswith(f"{self._canonical}:"):
            msg = self.__name__ + msg[len(self._canonical):]
        if "array of dtype" in msg and _any_tensor(args, kwargs):
            msg = msg.replace("array of dtype", "tensor of dtype")
        e.args = (msg,)

    def _call(self, impl: Callable[..., Any], p: Profile, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if dryrun.enabled() and p.is_ascend:
            # DeepGEMM-Ascend's _C.set_dry_run(True): the entry point checks its arguments and
            # returns without launching (deepgemm_ref.dryrun).
            with dryrun.call(self.__name__) as outermost:
                try:
                    return self._run(impl, p, args, kwargs)
                except dryrun.Stop as done:
                    if not outermost:  # a public function called by another: the outer one returns
                        raise
                    return done.result
        return self._run(impl, p, args, kwargs)

    def _run(self, impl: Callable[..., Any], p: Profile, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if id(impl) in self._with_profile:
            return impl(p, *args, **kwargs)
        return impl(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        impl = self.impl_for() or next(iter(self._impls.values()))
        return public_signature(impl)

    def __repr__(self) -> str:
        return f"<deepgemm_ref function {self.__name__} ({', '.join(self._impls)})>"


def _any_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a torch tensor is among the arguments (or inside a tuple / list of them)."""
    from .interop import is_tensor

    for x in (*args, *kwargs.values()):
        if is_tensor(x) or (isinstance(x, (tuple, list)) and any(is_tensor(y) for y in x)):
            return True
    return False


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
