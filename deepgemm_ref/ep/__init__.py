"""``deepgemm_ref.ep``: DeepEP 2.1.0's public Python API on the CPU (``import deepgemm_ref.ep as deep_ep``).

Expert-parallel dispatch and combine over a group of ranks with DeepEP's bitwise numerics
(contract: the project's DeepEP API notes; sections cited as "contract N"):

* :class:`ElasticBuffer` and :class:`EPBuffer` (the V2 buffers), :class:`EPHandle`,
  :class:`Buffer` (the legacy V1 buffer: intranode and low-latency dispatch / combine) and its
  :class:`Config` (the legacy kernels' chunking), :class:`EventOverlap`, :class:`EventHandle`,
  ``topk_idx_t`` (``torch.int64``; NumPy's int64 when torch is not installed),
  :func:`get_physical_domain_size`, :func:`get_logical_domain_size`, ``__version__``;
* :func:`run_emulated`: R ranks as threads of this process (``fn(group, *args)`` per rank), the
  in-process form of a process group; a ``torch.distributed`` process group (gloo) is accepted too;
* :mod:`.utils.math`, :mod:`.utils.envs`: DeepEP's script helpers;
* :mod:`.routing`, :mod:`.reduction` and :mod:`.cast`: the layouts, the combine recipes and the
  low-latency FP8 cast as pure functions of the routing and the data (one rank or a whole case at
  once, no transport), for golden values.

Under the ``ascend950`` profile a buffer constructed there behaves as DeepEP-Ascend's (contract 13);
DeepEP-Ascend has no legacy ``Buffer``, so constructing one there raises the argument error.
Importing this package does not import torch.
"""

from __future__ import annotations

from typing import Any

from ..comm import run_emulated
from . import cast, reduction, routing, utils
from ._buffer import ElasticBuffer, EPBuffer
from ._config import Config
from ._event import EventHandle, EventOverlap
from ._handle import EPHandle
from ._legacy import Buffer
from ._topology import get_logical_domain_size, get_physical_domain_size

__all__ = [
    "Buffer",
    "ElasticBuffer",
    "EPBuffer",
    "EPHandle",
    "EventOverlap",
    "EventHandle",
    "Config",
    "topk_idx_t",
    "get_physical_domain_size",
    "get_logical_domain_size",
    "run_emulated",
    "utils",
    "routing",
    "reduction",
    "cast",
    "__version__",
]

# Note: additions: run_emulated, routing, reduction and cast; topk_idx_t is NumPy's int64 without torch.
#: The DeepEP API version emulated.
__version__ = "2.1.0"


def __getattr__(name: str) -> Any:
    """``topk_idx_t``, resolved on first use: ``torch.int64`` when torch can be imported, else
    NumPy's ``int64`` (importing this package never imports torch)."""
    if name == "topk_idx_t":
        try:
            import torch
        except ImportError:
            import numpy as np

            return np.dtype(np.int64)
        return torch.int64
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
