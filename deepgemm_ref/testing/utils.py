"""``deepgemm_ref.testing.utils``: ``deep_gemm.testing.utils`` (get_arch_major, test_filter, ignore_env)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..profiles import get_arch_major as _get_arch_major

__all__ = ["get_arch_major", "test_filter", "ignore_env"]


def get_arch_major() -> int:
    """The arch major of the active profile (9 for sm90, 10 for sm100; see ``profiles``)."""
    return _get_arch_major()


def test_filter(condition: Callable[[], bool]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: run the test only if ``condition()``; otherwise print that it was filtered."""

    def decorator(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition():
                return f(*args, **kwargs)
            print(f"{f.__name__}:")
            print(f" > Filtered by {condition}")
            return None

        return wrapper

    return decorator


test_filter.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def ignore_env(name: str, condition: Callable[[], bool]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: when ``condition()`` holds, remove env var ``name`` during the call."""

    def decorator(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not condition():
                return f(*args, **kwargs)
            with _without_env(name):
                return f(*args, **kwargs)

        return wrapper

    return decorator


@contextlib.contextmanager
def _without_env(name: str) -> Iterator[None]:
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved
