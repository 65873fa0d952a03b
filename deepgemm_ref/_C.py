"""``deepgemm_ref._C``: the public helpers that DeepGEMM and DeepGEMM-Ascend keep in their
compiled extension, with each target's signature (see ``api.profiled``).

JIT and device controls (``init``, ``npu_sleep``, ``get_jit``, class ``Runtime``) are recorded or
do nothing: there is no compiler and no device.  ``set_dry_run`` / ``get_dry_run`` switch
DeepGEMM-Ascend's dry run (:mod:`deepgemm_ref.dryrun`; defined with the other runtime settings in
:mod:`deepgemm_ref.runtime`): kernels validate their arguments and compute and write nothing.
``fp8_bmm`` and ``bf16_bmm`` are the einsum family's batched kernels (:mod:`deepgemm_ref.einsum`),
and the Mega MoE size helpers Mega MoE's (:mod:`deepgemm_ref.mega`); this module gathers them
under DeepGEMM's ``_C`` names.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import namespace
from .api import not_implemented, profiled
from .einsum import bf16_bmm, fp8_bmm
from .errors import arg_error
from .mega import get_ring_limit_for_mega_moe, get_symm_buffer_size_for_mega_moe, get_token_alignment_for_mega_moe
from .mega._buffer import buffer_ptrs, symm_bytes
from .runtime import get_dry_run, set_dry_run
from .toolkit.sizes import check_alloc, size_arg

__all__ = ["init", "set_dry_run", "get_dry_run", "npu_sleep", "get_jit", "Runtime", "fp8_bmm", "bf16_bmm",
           "_mega_moe_block_n", "get_token_alignment_for_mega_moe", "get_ring_limit_for_mega_moe",
           "get_symm_buffer_size_for_mega_moe", "SymmBuffer", "fp8_fp4_mega_moe", "bf16_mega_moe"]

_ASCEND_ONLY = {"deepgemm": "a DeepGEMM-Ascend _C addition that DeepGEMM 2.6.1 does not export"}


def _init_cuda(library_root_path: str, cuda_home_path_by_python: str, /) -> None:
    """DeepGEMM's one-time JIT set-up: nothing to set up here."""
    return None


def _init_ascend(version: str, library_root_path: str, /) -> None:
    """DeepGEMM-Ascend's lazy JIT set-up: nothing to set up here."""
    return None


def _npu_sleep(sleep_cycles: int, *, marker: int = 0) -> None:
    """A device-side sleep used by DeepGEMM-Ascend's benchmarks: nothing to do on the CPU."""
    return None


class _Runtime:
    """DeepGEMM-Ascend's ``_C.Runtime``: DeepJIT's runtime handle, an opaque class that Python
    cannot construct (``_C.get_jit()`` returns the process's one instance)."""

    __slots__ = ()

    def __init__(self) -> None:
        raise TypeError("deep_gemm._C.Runtime: No constructor defined!")

    def __repr__(self) -> str:
        return "<deepgemm_ref._C.Runtime object (no JIT compiler: nothing is compiled)>"


_Runtime.__name__ = _Runtime.__qualname__ = "Runtime"
_Runtime.__module__ = "deepgemm_ref._C"
# Note: the one JIT runtime of the process; no compiler exists behind it.
_JIT = object.__new__(_Runtime)


def _get_jit() -> _Runtime:
    """DeepGEMM-Ascend's lazily created JIT runtime: the process's one ``_C.Runtime`` instance."""
    return _JIT


init = profiled("init", deepgemm=_init_cuda, deepgemm_ascend=_init_ascend)
npu_sleep = profiled("npu_sleep", _ASCEND_ONLY, deepgemm_ascend=_npu_sleep)
get_jit = profiled("get_jit", _ASCEND_ONLY, deepgemm_ascend=_get_jit)
#: DeepJIT's runtime class as DeepGEMM-Ascend's ``_C`` exports it (opaque; see ``get_jit``).
Runtime = _Runtime
#: BLOCK_N of DeepGEMM-Ascend's Mega MoE (256-row weight blocks).
_mega_moe_block_n = 256


# ----------------------------------------------------------------------------------------------
# Mega MoE raw bindings
# ----------------------------------------------------------------------------------------------

_RAW_MEGA_MOE = ("a raw binding over device addresses (sym_buffer_ptrs) that the Python wrapper calls; the "
                 "emulator has no device memory to address: call deepgemm_ref.{name} (the wrapper, emulated "
                 "across every rank in one process) instead")


@not_implemented(_RAW_MEGA_MOE.format(name="fp8_fp4_mega_moe"))
def _raw_fp8_fp4_mega_moe_cuda(y: Any, l1_weights: Any, l2_weights: Any, cumulative_local_expert_recv_stats: Any,
                               sym_buffer: Any, sym_buffer_ptrs: Any, rank_idx: Any, num_max_tokens_per_rank: Any,
                               num_experts: Any, num_topk: Any, recipe: Any, activation: Any, activation_clamp: Any,
                               fast_math: Any, num_ring_tokens: Any, /) -> None:
    """DeepGEMM's ``_C.fp8_fp4_mega_moe`` (not implemented)."""


@not_implemented(_RAW_MEGA_MOE.format(name="bf16_mega_moe"))
def _raw_bf16_mega_moe_cuda(y: Any, l1_weights: Any, l2_weights: Any, cumulative_local_expert_recv_stats: Any,
                            sym_buffer: Any, sym_buffer_ptrs: Any, rank_idx: Any, num_max_tokens_per_rank: Any,
                            num_experts: Any, num_topk: Any, activation: Any, activation_clamp: Any, fast_math: Any,
                            num_ring_tokens: Any, /) -> None:
    """DeepGEMM's ``_C.bf16_mega_moe`` (not implemented)."""


@not_implemented(_RAW_MEGA_MOE.format(name="fp8_fp4_mega_moe"))
def _raw_fp8_fp4_mega_moe_ascend(y: Any, l1_weights_tuple: Any, l2_weights_tuple: Any,
                                 shared_l1_weights_tuple_opt: Any, shared_l2_weights_tuple_opt: Any,
                                 cumulative_local_expert_recv_stats: Any, sym_buffer: Any, sym_buffer_ptrs: Any,
                                 rank_idx: Any, num_max_tokens_per_rank: Any, num_experts: Any, num_topk: Any,
                                 hidden: Any, intermediate_hidden: Any, num_shared_experts: Any, recipe: Any,
                                 activation: Any, activation_clamp_opt: Any, fast_math: Any) -> None:
    """DeepGEMM-Ascend's ``_C.fp8_fp4_mega_moe`` (not implemented)."""


fp8_fp4_mega_moe = profiled("fp8_fp4_mega_moe", None, deepgemm=_raw_fp8_fp4_mega_moe_cuda,
                            deepgemm_ascend=_raw_fp8_fp4_mega_moe_ascend)
bf16_mega_moe = profiled("bf16_mega_moe", {"deepgemm-ascend": "DeepGEMM-Ascend has no BF16 Mega MoE"},
                         deepgemm=_raw_bf16_mega_moe_cuda)

_LEASES: dict[tuple[str, int], np.ndarray] = {}


class _CSymmBuffer:
    """DeepGEMM-Ascend's ``_C.SymmBuffer(rank_idx, num_ranks, hccl_group_name, num_bytes)``: leases a
    zero-filled int8 ``buffer`` of ``num_bytes`` for ``rank_idx`` of the group named
    ``hccl_group_name`` (one lease per (group, rank) for the process lifetime, as the HCCL
    registration; reused and zero-filled again by a later construction); ``buffer_ptrs`` lists
    each rank's buffer address in this process (0 for a rank that has not leased one yet).
    Buffers above 64 MiB are anonymous memory maps.
    """

    def __init__(self, rank_idx: int, num_ranks: int, hccl_group_name: str, num_bytes: int) -> None:
        func = "_C.SymmBuffer"
        size_arg(func, "num_ranks", num_ranks, minimum=1)  # C++ int; num_bytes an int64 byte count
        size_arg(func, "num_bytes", num_bytes, minimum=1, maximum=2**63 - 1)
        check_alloc(func, "num_bytes", int(num_bytes), "the leased buffer (pages mapped on first touch)", lazy=True)
        if isinstance(rank_idx, bool) or not isinstance(rank_idx, (int, np.integer)) or not 0 <= rank_idx < num_ranks:
            raise arg_error(func, "rank_idx", f"an int in [0, {num_ranks})", repr(rank_idx))
        if not isinstance(hccl_group_name, str):
            raise arg_error(func, "hccl_group_name", "a str", type(hccl_group_name).__name__)
        key = (hccl_group_name, int(rank_idx))
        # a lease large enough is reused: the pool zero-fills on reuse too
        lease = _LEASES[key] = symm_bytes(int(num_bytes), _LEASES.get(key))
        # Note: no HCCL and no device memory: the lease is a NumPy int8 array in this process and
        # buffer_ptrs are host addresses.
        self._group, self._num_ranks = hccl_group_name, int(num_ranks)
        self.buffer = lease[: int(num_bytes)].view(np.int8)

    @property
    def buffer_ptrs(self) -> list[int]:
        return buffer_ptrs(_LEASES.get((self._group, r)) for r in range(self._num_ranks))


SymmBuffer = profiled("SymmBuffer", {"deepgemm": "DeepGEMM 2.6.1 builds the symmetric buffer in Python "
                                     "(deep_gemm.SymmBuffer) over torch symmetric memory; _C has no class"},
                      deepgemm_ascend=_CSymmBuffer)

# What DeepGEMM 2.6.1's and DeepGEMM-Ascend's _C export follows the active profile.
namespace.install(__name__, {"Runtime": "deepgemm-ascend", "_mega_moe_block_n": "deepgemm-ascend"})
