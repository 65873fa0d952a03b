"""Small text helpers of the reports and messages: counts with the right noun form."""

from __future__ import annotations

__all__ = ["plural", "count", "failing", "class_mismatches"]

_IRREGULAR = {"matrix": "matrices", "index": "indices", "was": "were", "is": "are"}


def plural(n: int, word: str, words: str | None = None) -> str:
    """``word`` for n == 1 (and -1), else its plural (``words``, or the word with an ``s``)."""
    if abs(int(n)) == 1:
        return word
    return words if words is not None else _IRREGULAR.get(word, word + "s")


def count(n: int, word: str, words: str | None = None) -> str:
    """``"1 case"``, ``"2 cases"``, ``"0 cases"``: a number with its noun."""
    return f"{n} {plural(n, word, words)}"


def failing(failed: int, checked: int) -> str:
    """``"1 of 64 checked elements fails"``, ``"2 of 2 checked elements fail"``,
    ``"1 of 1 checked element fails"``."""
    return f"{failed} of {count(checked, 'checked element')} {plural(failed, 'fails', 'fail')}"


def class_mismatches(n: int, classes: str = "NaN / infinity") -> str:
    """``"1 NaN / infinity class mismatch"``, ``"3 NaN / infinity class mismatches"``."""
    return count(n, f"{classes} class mismatch", f"{classes} class mismatches")
