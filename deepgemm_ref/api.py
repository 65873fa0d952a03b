"""Public names whose signature and behaviour follow the active arch profile.

DeepGEMM and DeepGEMM-Ascend export many of the same names with different parameters
(``fp8_fp4_mqa_logits``'s sixth positional argument changes meaning, ``use_psum_layout``
defaults differ, ...).  A :class:`ProfiledFunction` holds one implementation per target; calling
it runs the implementation of the active profile, and ``inspect.signature`` reports that
implementation's signature, so signature-parity checks see exactly what a caller would.
A name the active target does not provide raises the argument error saying so.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import DGArgumentError
from .profiles import Profile, get_profile

__all__ = ["ProfiledFunction", "profiled", "not_implemented", "TARGET_LABEL"]

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
        if DRY_RUN["on"] and p.is_ascend:
            # DeepGEMM-Ascend's _C.set_dry_run(True): entry points check their arguments and
            # return without launching, outputs untouched.  The call runs on copies of every array
            # argument (aliases kept: c is d stays true), so checks and errors are the real ones.
            memo: dict[int, Any] = {}
            args = tuple(_detached(a, memo) for a in args)
            kwargs = {k: _detached(v, memo) for k, v in kwargs.items()}
        return impl(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        impl = self.impl_for() or next(iter(self._impls.values()))
        return inspect.signature(impl)

    def __repr__(self) -> str:
        return f"<deepgemm_ref function {self.__name__} ({', '.join(self._impls)})>"


DRY_RUN = {"on": False}  # set by _C.set_dry_run (DeepGEMM-Ascend)


def _detached(x: Any, memo: dict[int, Any]) -> Any:
    """A copy of x's arrays and tensors (recursing into tuples and lists), other values as they are."""
    if id(x) in memo:
        return memo[id(x)]
    from .interop import is_tensor

    out: Any
    if isinstance(x, np.ndarray):
        out = x.copy()
    elif is_tensor(x):
        out = x.clone()
    elif isinstance(x, tuple):
        out = tuple(_detached(v, memo) for v in x)
    elif isinstance(x, list):
        out = [_detached(v, memo) for v in x]
    else:
        out = x
    memo[id(x)] = out
    return out


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
