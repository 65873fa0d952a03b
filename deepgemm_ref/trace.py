"""Capture what a kernel call computed beyond its output: exact accumulator, error scale, defined mask.

Public kernel signatures are DeepGEMM's, so the extra results the golden workflow needs travel
through this side channel::

    with deepgemm_ref.trace.capture(want_acc=True, want_S=True) as cap:
        deepgemm_ref.fp8_gemm_nt(a, b, d)
    rec = cap.records[-1]       # KernelRecord: acc, acc_lo, S, defined, stats

Kernels call :func:`wants` to learn what to compute and :func:`record` once per public call.
Capturing is per thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["KernelRecord", "Capture", "capture", "wants", "record"]


@dataclass
class KernelRecord:
    """What one kernel call computed, in the shape of its output.

    acc:     float64 accumulator (exact where the certificate held; see ``core``), or None.
    acc_lo:  float64 low part (float32 outputs): ``acc + acc_lo`` is the accumulator to ~2^-100.
    S:       float64 upper bound of sum |a_i b_i| * scales (the checker's error scale), or None.
    defined: bool mask of the output elements whose value the kernel's contract defines (None:
             all of them).  Rows a kernel leaves unspecified (padding, masked rows, undefined
             logits) are False and are excluded from checks.
    extra:   kernel-specific arrays (e.g. Mega MoE stage outputs), by name.
    tasks:   the labels of the executor tasks the call ran, in order (matmuls, fills).
    """

    func: str
    acc: np.ndarray | None = None
    acc_lo: np.ndarray | None = None
    S: np.ndarray | None = None
    defined: np.ndarray | None = None
    stats: dict[str, int] = field(default_factory=dict)
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    tasks: tuple[str, ...] = ()


@dataclass
class Capture:
    want_acc: bool = False
    want_S: bool = False
    records: list[KernelRecord] = field(default_factory=list)

    @property
    def last(self) -> KernelRecord:
        if not self.records:
            raise LookupError("no kernel call was captured")
        return self.records[-1]


_local = threading.local()


@contextmanager
def capture(want_acc: bool = False, want_S: bool = False) -> Iterator[Capture]:
    """Record every kernel call made in this thread inside the block."""
    prev = getattr(_local, "cap", None)
    cap = Capture(want_acc, want_S)
    _local.cap = cap
    try:
        yield cap
    finally:
        _local.cap = prev


def active() -> Capture | None:
    return getattr(_local, "cap", None)


def wants() -> tuple[bool, bool]:
    """(want_acc, want_S) of the active capture, (False, False) when none."""
    cap = active()
    return (cap.want_acc, cap.want_S) if cap is not None else (False, False)


def record(func: str, **kwargs: Any) -> None:
    """Add a KernelRecord to the active capture (no-op without one)."""
    cap = active()
    if cap is not None:
        cap.records.append(KernelRecord(func, **kwargs))
