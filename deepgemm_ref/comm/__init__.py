"""Groups of ranks, one abstraction for every form in which ranks run.

Kernel families that move data between ranks (Mega MoE, DeepEP's dispatch and combine in
:mod:`deepgemm_ref.ep`) take a ``group`` as DeepGEMM and DeepEP do and talk to it only through a
:class:`Transport` (:func:`transport` makes one from whatever the caller passed):

* a rank view of a :class:`LocalGroup`: R ranks in one process.  The ranks' calls either run in
  their own threads (:func:`run_emulated`; collectives rendezvous and block until every rank has
  arrived, bounded by the group's timeout; a rank that fails makes the others' collectives fail
  instead of hanging), or come one after another from one thread (Mega MoE's ``EmulatedGroup``:
  :meth:`LocalGroup.join`, the last rank's call completes the collective);
* a ``torch.distributed`` process group, one rank per process (gloo on a CPU machine): the
  collectives are torch.distributed's, arrays travel as byte views (gloo refuses float8 and
  int16), so every form gives the same bytes (:class:`TorchTransport`; torch is imported only
  when a collective runs).

Ranks that call different collectives at once, or disagree on an array's dtype or row shape,
all raise the same :class:`CollectiveMismatch` in every form; waits are bounded (the group's
``timeout_s``, or the process group's timeout) and a failed rank fails the others' collectives.

:mod:`deepgemm_ref.comm.process` initialises the default ``torch.distributed`` group of one rank
per process from the environment (what DeepGEMM's and DeepGEMM-Ascend's ``init_dist`` share, on
gloo) and holds ``dist_print``.

This package is the base layer under every kernel family: it imports nothing of them, so the
families that use it stay peers.
"""

from .local import DEFAULT_TIMEOUT_S, LocalGroup, LocalRank, LocalTransport, PeerFailed, run_emulated
from .torchdist import TorchTransport
from .transport import CollectiveMismatch, Transport, transport

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CollectiveMismatch",
    "LocalGroup",
    "LocalRank",
    "LocalTransport",
    "PeerFailed",
    "TorchTransport",
    "Transport",
    "run_emulated",
    "transport",
]
