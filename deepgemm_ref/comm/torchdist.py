"""The transport of a ``torch.distributed`` process group (one rank per process; gloo on a CPU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["TorchTransport"]


class TorchTransport:
    """A rank's end of a torch.distributed process group's collectives (to be written)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    @property
    def size(self) -> int:
        return int(self.group.size())

    def barrier(self) -> None:
        raise NotImplementedError("TorchTransport.barrier: not written yet")

    def all_to_all(self, send: Sequence[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError("TorchTransport.all_to_all: not written yet")

    def all_gather(self, x: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError("TorchTransport.all_gather: not written yet")
