"""``fp8_fp4_mega_moe`` and ``bf16_mega_moe``: argument checks, the emulated collective, outputs.

Every call reads check -> (join) -> tasks -> execute:

* a ``_check_*`` step validates one rank's call for the profile the dispatcher hands it and
  returns a :class:`RankRequest` (an :class:`~deepgemm_ref.executor.Request` whose ``d`` is the
  rank's ``y``); nothing is computed or written;
* the call joins the collective (:func:`_join`): a call that only joins returns there; the call
  that completes it (or a ``collective=False`` call) gets the :class:`Layer` that
  :func:`_check_layer` validated (every rank's configuration, outputs apart, tokens read);
* :func:`_launch` computes the layer (the pipeline's stages are executor tasks and fills,
  :mod:`._pipeline`), then writes every out rank's outputs with :func:`_outputs`' fills through
  :func:`~deepgemm_ref.executor.execute` and reports one record per rank with
  :func:`~deepgemm_ref.executor.record`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .. import dryrun, trace
from .. import formats as fm
from ..api import profiled
from ..errors import arg_error
from ..executor import Collected, Fill, Request, active_accumulation, execute, record
from ..profiles import Profile
from ..runtime import runtime_state
from ..toolkit.args import (
    BF16,
    E4M3,
    I8,
    I16,
    I32,
    align,
    as_array,
    as_pair,
    bool_arg,
    ceil_div,
    elem_stride,
    is_contiguous,
    packed_fp4,
)
from ..toolkit.outputs import check_written
from ._buffer import SymmBuffer, _AscendSymmBuffer, _CudaSymmBuffer
from ._group import GroupRegistry, ProcessRegistry, Registry
from ._layout import BLOCK_N
from ._pipeline import ExpertWeights, PipelineConfig, PipelineResult, RankOptions, RankTokens, run, run_rank
from ._weights import AscendWeights, CudaBf16Weights, CudaFp4Weights

__all__ = ["EmulatedGroup", "fp8_fp4_mega_moe", "bf16_mega_moe", "bind_rank", "read_tokens", "RankRequest", "Layer"]

_ASCEND_NUM_CORES = 32
Kind = Literal["fp8", "bf16"]


@dataclass(kw_only=True)
class RankRequest(Request):
    """One rank's validated kernel call (or :meth:`EmulatedGroup.bind` binding): what the
    collective needs from it.  Nothing is computed or written by making it.

    d:          the rank's ``y`` (N, H) bfloat16, written when the collective completes (a
                binding: an empty (0, H) array, ``binding`` True: it writes nothing).
    kind:       ``"fp8"`` or ``"bf16"``; target: the buffer's target.
    registry, rank, buffer: the group, the rank and its symmetric buffer (the tokens are read
                from it when the collective completes).
    num_tokens: N.
    weights, shared: the rank's local experts and (DeepGEMM-Ascend) shared experts.
    stats:      ``cumulative_local_expert_recv_stats`` (flattened) or None.
    options:    the epilogue options of the rank's experts.
    """

    kind: Kind
    target: str
    registry: Registry
    rank: int
    buffer: SymmBuffer
    num_tokens: int
    weights: ExpertWeights
    shared: ExpertWeights | None
    stats: np.ndarray | None
    options: RankOptions
    binding: bool = False

    @property
    def y(self) -> np.ndarray | None:
        """The rank's output (None for a binding)."""
        return None if self.binding else self.d


# ----------------------------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------------------------

def _recipe(func: str, recipe: Any) -> None:
    ok = isinstance(recipe, (tuple, list)) and len(recipe) == 3 and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in recipe)
    if not ok or tuple(int(v) for v in recipe) != (1, 1, 32):
        raise arg_error(func, "recipe", "(1, 1, 32)", repr(recipe))


def _activation(func: str, activation: Any) -> None:
    if activation != "swiglu":
        raise arg_error(func, "activation", "'swiglu'", repr(activation))


def _clamp(func: str, activation_clamp: Any) -> float | None:
    if activation_clamp is None:
        return None
    if isinstance(activation_clamp, bool) or not isinstance(activation_clamp, (int, float, np.integer, np.floating)):
        raise arg_error(func, "activation_clamp", "None or a float >= 0", repr(activation_clamp))
    with np.errstate(over="ignore"):
        c = float(np.float32(activation_clamp))  # the binding takes a C++ float
    if not c >= 0:
        raise arg_error(func, "activation_clamp", "None or a float >= 0", repr(activation_clamp))
    return c


def _buffer(func: str, sym_buffer: Any, cls: type[SymmBuffer], kind: str) -> SymmBuffer:
    if not isinstance(sym_buffer, cls):
        what = "a DeepGEMM-Ascend SymmBuffer" if cls is _AscendSymmBuffer else "a DeepGEMM SymmBuffer"
        raise arg_error(func, "sym_buffer", f"{what} made under the active profile", repr(sym_buffer))
    if sym_buffer.buffer is None or sym_buffer.group is None or sym_buffer.x is None:  # type: ignore[attr-defined]
        raise arg_error(func, "sym_buffer", "a live SymmBuffer", "a destroyed SymmBuffer")
    if sym_buffer._mma != kind:
        # Note: DeepGEMM re-slices the byte buffer with the kernel's own layout and checks only its
        # size; a buffer made for the other MMA type is rejected here instead of being misread.
        raise arg_error(func, "sym_buffer", f"a buffer made with mma_type={kind!r}", f"mma_type={sym_buffer._mma!r}")
    return sym_buffer


def _y(func: str, y: Any, buf: SymmBuffer) -> np.ndarray:
    ya = as_array(y, func, "y")
    t, h = buf.num_max_tokens_per_rank, buf.hidden
    if ya.ndim != 2 or ya.shape[0] > t or ya.shape[1] != h:
        raise arg_error(func, "y", f"a 2-D (N, hidden = {h}) array with N <= num_max_tokens_per_rank = {t}", ya)
    # Note: DeepGEMM does not check y's dtype, width or contiguity (the kernel writes bf16 rows at
    # stride hidden); the emulator requires what the kernel assumes.  DeepGEMM-Ascend checks it.
    if ya.dtype != BF16 or not is_contiguous(ya) or not ya.flags.writeable:
        raise arg_error(func, "y", "a contiguous, writeable bfloat16 array", ya)
    return ya


def _stats(func: str, stats: Any, num_local_experts: int) -> np.ndarray | None:
    s = as_array(stats, func, "cumulative_local_expert_recv_stats", allow_none=True)
    if s is None:
        return None
    if s.dtype != I32 or s.size != num_local_experts or not is_contiguous(s) or not s.flags.writeable:
        raise arg_error(func, "cumulative_local_expert_recv_stats",
                        f"a contiguous, writeable int32 array of {num_local_experts} elements", s)
    return s.reshape(-1)


_STATS = "cumulative_local_expert_recv_stats"


def _reads(call: RankRequest) -> list[tuple[str, np.ndarray | None]]:
    """The arrays a rank's call reads: its weights (routed and shared) and its symmetric buffer."""
    out: list[tuple[str, np.ndarray | None]] = []
    for prefix, w in (("", call.weights), ("shared_", call.shared)):
        if w is None:
            continue
        paired = isinstance(getattr(w, "s1", None), np.ndarray)
        for layer in ("1", "2"):
            name = f"{prefix}l{layer}_weights"
            out.append((f"{name}[0]" if paired else name, getattr(w, "w" + layer)))
            if paired:
                out.append((f"{name}[1]", getattr(w, "s" + layer)))
    out.append(("sym_buffer", call.buffer.buffer))
    return out


def _check_outputs(call: RankRequest, others: Sequence[RankRequest] = ()) -> None:
    """y and the stats: written by the collective, so sharing no memory with anything it reads
    (this call's and ``others``' weights and buffers) or with each other."""
    reads = _reads(call) + [r for o in others for r in _reads(o)]
    outs = [(f"y of rank {o.rank}", o.y) for o in others] + [(f"{_STATS} of rank {o.rank}", o.stats) for o in others]
    if call.y is not None:
        check_written(call.y, call.func, "y", reads + [(_STATS, call.stats)] + outs)
    if call.stats is not None:
        check_written(call.stats, call.func, _STATS, reads + [("y", call.y)] + outs)


def _grouped_weight(func: str, arg: str, w: np.ndarray, dtype: np.dtype, dtype_name: str) -> None:
    if w.ndim != 3:
        raise arg_error(func, arg, "a 3-D (num_local_experts, n, k) weight tensor", w)
    if w.dtype != dtype:
        raise arg_error(func, arg, dtype_name, w)
    if w.size and elem_stride(w, -1) != 1:
        raise arg_error(func, arg, "K-major weights (stride(-1) == 1)", w)


def _layout2(func: str, arg: str, sf: np.ndarray, groups: int, mn: int, k: int) -> None:
    """DeepGEMM's check_sf_layout(sf, mn, k, 1, 32, groups, tma_stride_check) for packed int32 SFs."""
    want = (groups, mn, ceil_div(k, 128))
    if sf.dtype != I32 or sf.shape != want:
        raise arg_error(func, arg, f"int32 packed UE8M0 SFs of shape {want} (layout 2)", sf)
    a4 = align(mn, 4)
    ok = (elem_stride(sf, -2) == 1 or mn == 1) and (want[2] <= 1 or elem_stride(sf, -1) == a4)
    ok = ok and (groups <= 1 or elem_stride(sf, -3) == elem_stride(sf, -1) * want[2])
    if not ok:
        raise arg_error(func, arg, f"the MN-major TMA-aligned layout (strides (.., 1, {a4}); "
                        "transform_sf_into_required_layout, then transform_weights_for_mega_moe)", sf)


def _cuda_common(func: str, kind: Kind, sym_buffer: Any, activation: Any, activation_clamp: Any,
                 fast_math: Any) -> tuple[SymmBuffer, float | None, bool]:
    _activation(func, activation)
    clamp = _clamp(func, activation_clamp)
    fm_ = bool_arg(func, "fast_math", fast_math)
    buf = _buffer(func, sym_buffer, _CudaSymmBuffer, "fp8xfp4" if kind == "fp8" else "bf16xbf16")
    return buf, clamp, fm_


def _check_experts(func: str, buf: SymmBuffer, e_l: int, hidden: int, intermediate: int) -> None:
    r = buf._registry.size()
    if buf.num_experts != e_l * r:
        raise arg_error(func, "l1_weights", f"num_experts / num_ranks = {buf.num_experts} / {r} local experts",
                        f"{e_l} local experts")
    if (hidden, intermediate) != (buf.hidden, buf.intermediate_hidden):
        # Note: DeepGEMM takes hidden and intermediate_hidden from the weights and only checks the
        # buffer's size; weights of another shape than the buffer's are rejected here.
        raise arg_error(func, "l1_weights", f"hidden = {buf.hidden}, intermediate_hidden = {buf.intermediate_hidden} "
                        "(the SymmBuffer's)", f"hidden = {hidden}, intermediate_hidden = {intermediate}")


def _arch_sm100(profile: Profile, func: str) -> None:
    if not profile.rules.mega_moe:
        raise arg_error(func, "arch", "the sm100 profile (the mega-MoE kernels are SM100 only)",
                        f"profile {profile.name!r}")


def _num_sms(profile: Profile) -> int:
    """``get_num_sms()`` under ``profile``: the recorded SM (AI-core) count, else the device's."""
    return runtime_state().num_sms or profile.device_num_sms


def _prepare_cuda_fp8(func: str, l1_weights: Any, l2_weights: Any, buf: SymmBuffer, num_tokens: int,
                      stats: Any) -> tuple[ExpertWeights, np.ndarray | None]:
    w1, s1 = as_pair(l1_weights, func, "l1_weights")
    w2, s2 = as_pair(l2_weights, func, "l2_weights")
    w1, w2 = packed_fp4(w1), packed_fp4(w2)
    for arg, w in (("l1_weights[0]", w1), ("l2_weights[0]", w2)):
        if w.dtype == E4M3:
            # Note: DeepGEMM's host check also accepts e4m3 weights, but the kernel's MMA reads
            # them as packed FP4 (MXFP8FP4); the emulator rejects them.
            raise arg_error(func, arg, "int8 packed FP4 weights (the kernel's MMA is FP8 x FP4)", w)
        _grouped_weight(func, arg, w, I8, "int8 packed FP4 weights")
    e_l, n1, h = int(w1.shape[0]), int(w1.shape[1]), int(w1.shape[2]) * 2
    e_l2, h2, i = int(w2.shape[0]), int(w2.shape[1]), int(w2.shape[2]) * 2
    if num_tokens > buf.num_max_tokens_per_rank:
        raise arg_error(func, "y", f"at most num_max_tokens_per_rank = {buf.num_max_tokens_per_rank} rows",
                        f"{num_tokens} rows")
    if e_l2 != e_l:
        raise arg_error(func, "l2_weights[0]", f"{e_l} local experts (as l1_weights)", w2)
    if h2 != h:
        raise arg_error(func, "l2_weights[0]", f"hidden = {h} rows (from l1_weights)", w2)
    if n1 != 2 * i:
        raise arg_error(func, "l1_weights[0]", f"2 * intermediate_hidden = {2 * i} rows (from l2_weights)", w1)
    if not is_contiguous(w1) or not is_contiguous(w2):
        raise arg_error(func, "l1_weights[0]" if not is_contiguous(w1) else "l2_weights[0]", "contiguous weights",
                        w1 if not is_contiguous(w1) else w2)
    _layout2(func, "l1_weights[1]", s1, e_l, 2 * i, h)
    _layout2(func, "l2_weights[1]", s2, e_l, h, i)
    st = _stats(func, stats, e_l)
    _check_experts(func, buf, e_l, h, i)
    return CudaFp4Weights(w1, s1, w2, s2), st


def _y_rows(func: str, y: Any) -> int:
    """Rows of the output ``y``, which must be 2-D (checked before anything reads its shape)."""
    ya = as_array(y, func, "y")
    if ya is None or ya.ndim != 2:
        raise arg_error(func, "y", "a 2-D (N, hidden) array", ya if ya is not None else "None")
    return int(ya.shape[0])


def _prepare_cuda_bf16(func: str, l1_weights: Any, l2_weights: Any, buf: SymmBuffer, num_tokens: int,
                       stats: Any) -> tuple[ExpertWeights, np.ndarray | None]:
    w1 = as_array(l1_weights, func, "l1_weights")
    w2 = as_array(l2_weights, func, "l2_weights")
    _grouped_weight(func, "l1_weights", w1, BF16, "bfloat16 weights")
    _grouped_weight(func, "l2_weights", w2, BF16, "bfloat16 weights")
    e_l, n1, h = (int(v) for v in w1.shape)
    e_l2, h2, i = (int(v) for v in w2.shape)
    if num_tokens > buf.num_max_tokens_per_rank:
        raise arg_error(func, "y", f"at most num_max_tokens_per_rank = {buf.num_max_tokens_per_rank} rows",
                        f"{num_tokens} rows")
    if e_l2 != e_l or h2 != h or n1 != 2 * i:
        raise arg_error(func, "l2_weights", f"({e_l}, {h}, {n1 // 2}) to match l1_weights {tuple(w1.shape)}", w2)
    if not is_contiguous(w1) or not is_contiguous(w2):
        raise arg_error(func, "l1_weights" if not is_contiguous(w1) else "l2_weights", "contiguous weights",
                        w1 if not is_contiguous(w1) else w2)
    st = _stats(func, stats, e_l)
    _check_experts(func, buf, e_l, h, i)
    return CudaBf16Weights(w1, w2), st


def _ascend_weights(func: str, arg: str, pair: Any, n: int, k: int,
                    num_local_experts: int | None) -> tuple[np.ndarray, np.ndarray]:
    """DeepGEMM-Ascend's check_weights: exact transformed shapes, dtypes and contiguity."""
    w, s = as_pair(pair, func, arg)
    shared = num_local_experts is None
    w = w if shared else packed_fp4(w)
    lead = () if shared else (num_local_experts,)
    want_w = (*lead, n // BLOCK_N, BLOCK_N, k if shared else k // 2)
    want_s = (*lead, n // BLOCK_N, k // 64, BLOCK_N)
    dt = E4M3 if shared else I8
    if w.dtype != dt or tuple(w.shape) != want_w or not is_contiguous(w):
        raise arg_error(func, f"{arg}[0]", f"contiguous {'float8_e4m3fn' if shared else 'int8 (packed FP4)'} "
                        f"weights of shape {want_w} (transform_weights_for_mega_moe's layout)", w)
    if s.dtype != I16 or tuple(s.shape) != want_s or not is_contiguous(s):
        raise arg_error(func, f"{arg}[1]", f"contiguous int16 SFs of shape {want_s}", s)
    return w, s


def _prepare_ascend(profile: Profile, func: str, l1_weights: Any, l2_weights: Any, shared_l1: Any, shared_l2: Any,
                    buf: SymmBuffer, num_tokens: int,
                    stats: Any) -> tuple[ExpertWeights, ExpertWeights | None, np.ndarray | None]:
    num_shared = int(getattr(buf, "num_shared_experts", 0))
    if (shared_l1 is not None) != (num_shared > 0) or (shared_l2 is not None) != (num_shared > 0):
        raise arg_error(func, "shared_l1_weights", f"shared weights exactly when the buffer has shared experts "
                        f"(num_shared_experts = {num_shared})", f"{type(shared_l1).__name__}, "
                        f"{type(shared_l2).__name__}")
    num_sms = _num_sms(profile)
    if num_sms != _ASCEND_NUM_CORES:
        raise arg_error(func, "get_num_sms()", f"{_ASCEND_NUM_CORES} (Mega MoE uses every AI core)", repr(num_sms))
    e_l = buf.num_experts // buf._registry.size()
    h, i = buf.hidden, buf.intermediate_hidden
    st = _stats(func, stats, e_l)
    w1, s1 = _ascend_weights(func, "l1_weights", l1_weights, 2 * i, h, e_l)
    w2, s2 = _ascend_weights(func, "l2_weights", l2_weights, h, i, e_l)
    routed = AscendWeights(w1, s1, w2, s2)
    shared = None
    if num_shared > 0:
        si = num_shared * i
        v1, t1 = _ascend_weights(func, "shared_l1_weights", shared_l1, 2 * si, h, None)
        v2, t2 = _ascend_weights(func, "shared_l2_weights", shared_l2, h, si, None)
        shared = AscendWeights(v1, t1, v2, t2, shared=True)
    del num_tokens
    return routed, shared, st


# ----------------------------------------------------------------------------------------------
# the collective
# ----------------------------------------------------------------------------------------------

def read_tokens(func: str, call: RankRequest) -> RankTokens:
    """One rank's first N tokens from its buffer, with the target's top-k semantics."""
    buf = call.buffer
    n = call.num_tokens
    if buf.buffer is None or buf.x is None:  # type: ignore[attr-defined]
        raise arg_error(func, "sym_buffer", f"rank {call.rank}'s buffer alive", "a destroyed SymmBuffer")
    x = buf.x[:n]  # type: ignore[attr-defined]
    scales = None
    if call.kind == "fp8":
        if call.target == "deepgemm":
            b = fm.unpack_ue8m0_int32(np.ascontiguousarray(buf.x_sf[:n]))  # type: ignore[attr-defined]
        else:
            b = fm.unpack_ue8m0_int16(np.ascontiguousarray(buf.x_sf[:n]))  # type: ignore[attr-defined]
        scales = fm.ue8m0_decode(b[:, : buf.hidden // 32])
    idx = np.asarray(buf.topk_idx[:n])  # type: ignore[attr-defined]
    e = buf.num_experts
    if call.target == "deepgemm":
        idx32 = idx.astype(np.int32)  # the kernel reads int64 ids as int32
        bad = idx32 >= e
        if np.any(bad):
            t, k = (int(v) for v in np.argwhere(bad)[0])
            # Note: DeepGEMM's kernel reads out of bounds for ids >= num_experts; the emulator raises.
            raise arg_error(func, "sym_buffer.topk_idx", f"expert ids < num_experts = {e} (or negative for masked "
                            f"slots) on rank {call.rank}", f"{int(idx[t, k])} at token {t}, slot {k}")
        eff = np.where(idx32 < 0, -1, idx32).astype(np.int64)
    else:
        eff = np.where((idx >= 0) & (idx < e), idx, -1).astype(np.int64)  # outside [0, E): masked
    return RankTokens(x, scales, eff, np.asarray(buf.topk_weights[:n], np.float32))  # type: ignore[attr-defined]


def _config(call: RankRequest) -> tuple[Any, ...]:
    return (call.kind,) + call.buffer._config


@dataclass
class Layer:
    """A complete collective, validated: every rank's call or binding, the ranks whose outputs
    this call writes, and every rank's tokens read from its buffer."""

    func: str
    profile: Profile
    calls: dict[int, RankRequest]
    out_ranks: list[int]
    tokens: list[RankTokens]


def _check_layer(profile: Profile, func: str, calls: dict[int, RankRequest], out_ranks: list[int]) -> Layer:
    """Validate the collective: every rank on one configuration, every written output apart from
    everything the collective reads, every rank's tokens readable (nothing computed or written)."""
    ranks = sorted(calls)
    first = calls[ranks[0]]
    for r in ranks:
        if _config(calls[r]) != _config(first):
            raise arg_error(func, "sym_buffer", f"every rank's call on the same configuration as rank {ranks[0]} "
                            f"{_config(first)}", f"rank {r}: {_config(calls[r])}")
    for r in out_ranks:  # every output apart from everything the collective reads, before any work
        _check_outputs(calls[r], [calls[s] for s in ranks if s != r])
    return Layer(func, profile, calls, out_ranks, [read_tokens(func, calls[r]) for r in ranks])


def _outputs(call: RankRequest, res: PipelineResult) -> list[Fill]:
    """y = bf16(combine of the rank's slots);  stats += routes received per local expert (int32,
    wrapping like the device's atomics);  DeepGEMM-Ascend: expert_recv_count[s, i] = routes from s."""
    r = call.rank
    received = res.counts[r].sum(axis=1)
    fills = [] if call.y is None else [Fill((...,), res.y[r], label=f"rank {r}: combine into y")]
    if call.stats is not None:
        fills.append(Fill((...,), (call.stats.astype(np.int64) + received).astype(np.int32), into=call.stats,
                          label=f"rank {r}: {_STATS} += received"))
    if call.target == "deepgemm-ascend":
        counts = call.buffer.expert_recv_count  # type: ignore[attr-defined]
        assert counts is not None  # the buffer is alive (read_tokens checked it)
        fills.append(Fill((...,), res.counts[r].T.astype(np.int32), into=counts, label=f"rank {r}: expert_recv_count"))
    return fills


def _launch(layer: Layer) -> None:
    """Compute the layer for ``layer.out_ranks`` from every rank's call, then write their outputs
    and report one record per rank (acc: the combine's accumulator, S: sum |slot contributions|,
    extra: every stage's golden; tasks: the executor tasks run for the rank)."""
    calls, ranks = layer.calls, sorted(layer.calls)
    first = calls[ranks[0]]
    cfg = _pipeline_config(layer.profile, first)
    shared = [calls[r].shared for r in ranks] if first.target == "deepgemm-ascend" else None
    # Note: the ring scratch views (l1_acts, l2_acts and their SFs) are not written: their contents
    # on a device depend on the scheduling; every stage's golden is in the record instead.
    res = run(layer.tokens, [calls[r].weights for r in ranks], [calls[r].options for r in ranks], cfg,
              layer.out_ranks, shared)
    _write(layer.func, [calls[r] for r in layer.out_ranks], res)


def _launch_process(call: RankRequest, reg: ProcessRegistry) -> None:
    """This process's rank of a group of processes: agree on the configuration with every rank
    (each raises the same argument error if they differ), then compute this rank's outputs
    through the group's collectives (:func:`._pipeline.run_rank`, the same bytes as :func:`run`)
    and write them."""
    _check_outputs(call)
    _agree(call, reg)
    tokens = read_tokens(call.func, call)
    cfg = _pipeline_config(call.profile, call)
    res = run_rank(tokens, call.weights, call.options, cfg, reg.transport,
                   call.shared if call.target == "deepgemm-ascend" else None)
    _write(call.func, [call], res)


#: What every rank's call must agree on (the buffer's configuration, the kernel), in _config's order.
_CONFIG_FIELDS = ("kernel (fp8 / bf16)", "sym_buffer (target)", "sym_buffer (mma_type)", "group (size)",
                  "sym_buffer (num_experts)", "sym_buffer (num_max_tokens_per_rank)", "sym_buffer (num_topk)",
                  "sym_buffer (hidden)", "sym_buffer (intermediate_hidden)", "sym_buffer (num_shared_experts)")


def _agree(call: RankRequest, reg: ProcessRegistry) -> None:
    """All-gather the call's configuration; if the ranks' differ, every rank raises the same
    argument error naming the first field that differs (before anything is computed or written)."""
    values = [v if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else
              int.from_bytes(hashlib.blake2b(repr(v).encode(), digest_size=7).digest(), "little")
              for v in _config(call)]
    got = np.stack(reg.transport.all_gather(np.asarray(values, np.int64)))
    bad = np.flatnonzero((got != got[0]).any(axis=0))
    if bad.size:
        i = int(bad[0])
        raise arg_error(call.func, "sym_buffer", f"every rank's call on the same configuration ({_CONFIG_FIELDS[i]} "
                        f"equal on every rank)", f"rank {reg.rank_index()}: {_config(call)}; differing ranks: "
                        f"{np.flatnonzero(got[:, i] != got[0, i]).tolist()}")


def _pipeline_config(profile: Profile, call: RankRequest) -> PipelineConfig:
    want_acc, want_S = trace.wants()
    return PipelineConfig(profile, call.kind, accumulation=active_accumulation(profile),
                          want_stages=trace.active() is not None, want_acc=want_acc, want_S=want_S)


def _write(func: str, calls: Sequence[RankRequest], res: PipelineResult) -> None:
    """Write each call's outputs (everything is computed) and report one record per rank."""
    debug = calls[0].target == "deepgemm" and _debug_zero()
    written = {c.rank: execute(c, _outputs(c, res), record_trace=False) for c in calls}
    for c in calls:
        r = c.rank
        st = {"rank": r, "num_tokens": c.num_tokens, "num_received": int(res.counts[r].sum()),
              "fast_math": int(c.options.fast_math), **res.stats}
        col = Collected(tuple(c.d.shape), False, False, acc=res.acc[r], S=res.S.get(r),
                        tasks=res.tasks.get(r, []) + written[r].tasks)
        record(func, col, None, stats=st, extra=res.stages.get(r, {}))
    if debug:
        from ._layout import zero_bytes

        for c in calls:
            buf = c.buffer.buffer
            if buf is not None:
                zero_bytes(buf)


def _debug_zero() -> bool:
    v = os.environ.get("DG_COMM_KERNEL_DEBUG")
    try:
        return bool(v) and int(v) != 0  # type: ignore[arg-type]
    except ValueError:
        return False


def _join(call: RankRequest) -> Layer | None:
    """Join the collective with ``call``: the validated :class:`Layer` this call completes, or None
    (the call only joined; the last rank's call writes every rank's outputs)."""
    # Note: a device call blocks until every rank has joined; here the calls before the last one
    # return at once and every rank's outputs are written by the last call (collective=True), or
    # a call computes its own rank's outputs from the other ranks' bindings (collective=False).
    reg = call.registry
    if isinstance(reg, ProcessRegistry):
        _launch_process(call, reg)
        return None
    reg.set_binding(call.rank, call)
    if not reg.collective:
        missing = reg.unbound_ranks()
        if missing:
            raise arg_error(call.func, "sym_buffer", "every other rank's weights and token count (a previous call "
                            "of that rank, or EmulatedGroup.bind) for a collective=False call",
                            f"nothing for ranks {missing}")
        return _check_layer(call.profile, call.func, {r: reg.binding(r) for r in range(reg.size())}, [call.rank])
    calls = reg.join(call.rank, call)
    return None if calls is None else _check_layer(call.profile, call.func, calls, list(range(reg.size())))


def _submit(call: RankRequest) -> None:
    dryrun.stop()  # validated: a dry run neither joins the collective nor computes
    layer = _join(call)
    if layer is not None:
        _launch(layer)


# ----------------------------------------------------------------------------------------------
# public kernels
# ----------------------------------------------------------------------------------------------

def _rank_request(profile: Profile, func: str, kind: Kind, buf: SymmBuffer, n: int, y: np.ndarray | None,
                  weights: ExpertWeights, shared: ExpertWeights | None, stats: np.ndarray | None,
                  options: RankOptions) -> RankRequest:
    """The request of buffer ``buf``'s rank (y None: a binding)."""
    return RankRequest(func=func, profile=profile, d=np.empty((0, buf.hidden), BF16) if y is None else y, defined=None,
                       kind=kind, target=buf._target, registry=buf._registry, rank=buf._rank, buffer=buf, num_tokens=n,
                       weights=weights, shared=shared, stats=stats, options=options, binding=y is None)


def _check_fp8_fp4_cuda(profile: Profile, func: str, y: Any, l1_weights: Any, l2_weights: Any, sym_buffer: Any,
                        stats: Any, recipe: Any, activation: Any, activation_clamp: Any, fast_math: Any) -> RankRequest:
    """Validate one rank's DeepGEMM fp8_fp4_mega_moe call."""
    _recipe(func, recipe)
    buf, clamp, fast = _cuda_common(func, "fp8", sym_buffer, activation, activation_clamp, fast_math)
    n = _y_rows(func, y)
    weights, st = _prepare_cuda_fp8(func, l1_weights, l2_weights, buf, n, stats)
    ya = _y(func, y, buf)
    _arch_sm100(profile, func)
    call = _rank_request(profile, func, "fp8", buf, n, ya, weights, None, st, RankOptions(clamp, fast))
    _check_outputs(call)
    return call


def _check_bf16_cuda(profile: Profile, func: str, y: Any, l1_weights: Any, l2_weights: Any, sym_buffer: Any,
                     stats: Any, activation: Any, activation_clamp: Any, fast_math: Any) -> RankRequest:
    """Validate one rank's DeepGEMM bf16_mega_moe call."""
    buf, clamp, fast = _cuda_common(func, "bf16", sym_buffer, activation, activation_clamp, fast_math)
    n = _y_rows(func, y)
    weights, st = _prepare_cuda_bf16(func, l1_weights, l2_weights, buf, n, stats)
    ya = _y(func, y, buf)
    _arch_sm100(profile, func)
    call = _rank_request(profile, func, "bf16", buf, n, ya, weights, None, st, RankOptions(clamp, fast))
    _check_outputs(call)
    return call


def _check_fp8_fp4_ascend(profile: Profile, func: str, y: Any, l1_weights: Any, l2_weights: Any, sym_buffer: Any,
                          shared_l1_weights: Any, shared_l2_weights: Any, stats: Any, recipe: Any, activation: Any,
                          activation_clamp: Any, fast_math: Any) -> RankRequest:
    """Validate one rank's DeepGEMM-Ascend fp8_fp4_mega_moe call."""
    _recipe(func, recipe)
    _activation(func, activation)
    if not (isinstance(fast_math, (bool, np.bool_)) and fast_math):
        raise arg_error(func, "fast_math", "True (DeepGEMM-Ascend supports only fast math)", repr(fast_math))
    buf = _buffer(func, sym_buffer, _AscendSymmBuffer, "fp8xfp4")
    ya = _y(func, y, buf)
    n = int(ya.shape[0])
    routed, shared, st = _prepare_ascend(profile, func, l1_weights, l2_weights, shared_l1_weights, shared_l2_weights,
                                         buf, n, stats)
    clamp = _clamp(func, activation_clamp)
    call = _rank_request(profile, func, "fp8", buf, n, ya, routed, shared, st, RankOptions(clamp, True))
    _check_outputs(call)
    return call


def _fp8_fp4_mega_moe_cuda(profile: Profile, /, y: Any, l1_weights: Any, l2_weights: Any, sym_buffer: Any,
                           cumulative_local_expert_recv_stats: Any = None, recipe: Any = (1, 1, 32),
                           activation: str = "swiglu", activation_clamp: float | None = None,
                           fast_math: bool = True) -> None:
    """The fused FP8 x FP4 expert-parallel MoE layer (DeepGEMM, sm100); collective over the group.

    y:          (N, H) bfloat16 output, N <= num_max_tokens_per_rank (written when the collective completes)
    l1_weights: (W1 int8 (E_l, 2I, H/2), S1 int32 (E_l, 2I, H/128) layout 2), as returned by
                ``transform_weights_for_mega_moe`` (gate/up interleaved by 8, SF UTCCP-transposed)
    l2_weights: (W2 int8 (E_l, H, I/2), S2 int32 (E_l, H, I/128) layout 2, UTCCP-transposed)
    sym_buffer: this rank's SymmBuffer; before the call ``x[:N]`` (e4m3), ``x_sf[:N]`` (per-32 UE8M0,
                packed int32), ``topk_idx[:N]`` (int64, negative = masked) and ``topk_weights[:N]``
                (float32) hold this rank's tokens
    cumulative_local_expert_recv_stats: None or int32 (E_l,), += routes received per local expert

    Math, for every token t and valid slot k routed to expert e (rank e // E_l):
    ``y[t] = bf16(sum_k bf16(requant(swiglu(bf16(x_t W1_e^T)) * w_tk) W2_e^T))`` (see deepgemm_ref.mega).
    """
    _submit(_check_fp8_fp4_cuda(profile, "fp8_fp4_mega_moe", y, l1_weights, l2_weights, sym_buffer,
                                cumulative_local_expert_recv_stats, recipe, activation, activation_clamp, fast_math))


def _bf16_mega_moe_cuda(profile: Profile, /, y: Any, l1_weights: Any, l2_weights: Any, sym_buffer: Any,
                        cumulative_local_expert_recv_stats: Any = None, activation: str = "swiglu",
                        activation_clamp: float | None = None, fast_math: bool = True) -> None:
    """The fused BF16 expert-parallel MoE layer (DeepGEMM, sm100); collective over the group.

    y: (N, H) bfloat16; l1_weights: W1 bfloat16 (E_l, 2I, H) interleaved by ``transform_weights_for_mega_moe``;
    l2_weights: W2 bfloat16 (E_l, H, I); sym_buffer.x[:N] bfloat16 tokens, topk_idx, topk_weights as in
    :func:`fp8_fp4_mega_moe`.  The intermediate is ``bf16(swiglu(bf16(x W1^T)) * w)`` instead of FP8.
    """
    _submit(_check_bf16_cuda(profile, "bf16_mega_moe", y, l1_weights, l2_weights, sym_buffer,
                             cumulative_local_expert_recv_stats, activation, activation_clamp, fast_math))


def _fp8_fp4_mega_moe_ascend(profile: Profile, /, y: Any, l1_weights: Any, l2_weights: Any, sym_buffer: Any,
                             shared_l1_weights: Any = None, shared_l2_weights: Any = None,
                             cumulative_local_expert_recv_stats: Any = None, recipe: Any = (1, 1, 32),
                             activation: str = "swiglu", activation_clamp: float | None = None,
                             fast_math: bool = True) -> None:
    """The fused FP8 x FP4 expert-parallel MoE layer (DeepGEMM-Ascend); collective over the group.

    y:          (N, H) bfloat16, contiguous, N <= num_max_tokens_per_rank
    l1_weights: (int8 (E_l, 2I/256, 256, H/2), int16 (E_l, 2I/256, H/64, 256)) from
                ``transform_weights_for_mega_moe`` (128 + 128 gate/up blocks, SF bytes + 6)
    l2_weights: (int8 (E_l, H/256, 256, I/2), int16 (E_l, H/256, I/64, 256))
    shared_l1_weights, shared_l2_weights: the S shared experts as one wide expert (e4m3 NZ
                (2SI/256, 256, H) / (H/256, 256, SI) with int16 SFs), exactly when S > 0
    sym_buffer: x[:N] e4m3, x_sf[:N] int16 UE8M0 pairs, topk_idx[:N] (ids outside [0, E) masked),
                topk_weights[:N] float32
    Re-quantisation floors amax at 1e-4; the shared-expert slot follows the routed slots in the combine.
    """
    _submit(_check_fp8_fp4_ascend(profile, "fp8_fp4_mega_moe", y, l1_weights, l2_weights, sym_buffer,
                                  shared_l1_weights, shared_l2_weights, cumulative_local_expert_recv_stats, recipe,
                                  activation, activation_clamp, fast_math))


def _bind_rank(profile: Profile, /, group: GroupRegistry, rank: int, l1_weights: Any, l2_weights: Any,
               num_tokens: int, shared_l1_weights: Any, shared_l2_weights: Any, activation_clamp: Any,
               fast_math: Any) -> None:
    """EmulatedGroup.bind: validate like a kernel call against rank ``rank``'s registered buffer."""
    func = "EmulatedGroup.bind"
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < group.size():
        raise arg_error(func, "rank", f"an int in [0, {group.size()})", repr(rank))
    buf = group.buffer(rank)
    if buf is None:
        raise arg_error(func, "rank", "a rank with a SymmBuffer", f"rank {rank} has none")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or not \
            0 <= num_tokens <= buf.num_max_tokens_per_rank:
        raise arg_error(func, "num_tokens", f"0 <= num_tokens <= {buf.num_max_tokens_per_rank}", repr(num_tokens))
    n = int(num_tokens)
    clamp = _clamp(func, activation_clamp)
    fast = bool_arg(func, "fast_math", fast_math)
    if isinstance(buf, _AscendSymmBuffer):
        routed, shared, _ = _prepare_ascend(profile, func, l1_weights, l2_weights, shared_l1_weights,
                                            shared_l2_weights, buf, n, None)
        call = _rank_request(profile, func, "fp8", buf, n, None, routed, shared, None, RankOptions(clamp, True))
    else:
        kind: Kind = "fp8" if buf._mma == "fp8xfp4" else "bf16"
        prep = _prepare_cuda_fp8 if kind == "fp8" else _prepare_cuda_bf16
        weights, _ = prep(func, l1_weights, l2_weights, buf, n, None)
        call = _rank_request(profile, func, kind, buf, n, None, weights, None, None, RankOptions(clamp, fast))
    group.set_binding(rank, call)


#: The dispatcher hands bind the active profile (the AI-core count an Ascend binding is checked against).
bind_rank = profiled("EmulatedGroup.bind", None, deepgemm=_bind_rank, deepgemm_ascend=_bind_rank)


_BF16_MISSING = {"deepgemm-ascend": "DeepGEMM-Ascend has no BF16 mega MoE (fp8xfp4 only)"}

fp8_fp4_mega_moe = profiled("fp8_fp4_mega_moe", None, deepgemm=_fp8_fp4_mega_moe_cuda,
                            deepgemm_ascend=_fp8_fp4_mega_moe_ascend)
bf16_mega_moe = profiled("bf16_mega_moe", _BF16_MISSING, deepgemm=_bf16_mega_moe_cuda)


class EmulatedGroup(GroupRegistry):
    """``size`` EP ranks in one process; ``rank(r)`` gives rank r's process-group view.

    Kernel calls are collective, as on the devices: with ``collective=True`` (default) a call
    joins the pending collective and the last rank's call computes and writes every rank's
    outputs; with ``collective=False`` a call computes its own rank's outputs from the other
    ranks' most recent calls or :meth:`bind` bindings (see :mod:`deepgemm_ref.mega._group`).

    >>> group = EmulatedGroup(8)
    >>> buffers = [get_symm_buffer_for_mega_moe(group.rank(r), 32, 384, 6, 512, 512) for r in range(8)]
    """

    def bind(self, rank: int, l1_weights: Any, l2_weights: Any, num_tokens: int, *,
             shared_l1_weights: Any = None, shared_l2_weights: Any = None,
             activation_clamp: float | None = None, fast_math: bool = True) -> None:
        """Record rank ``rank``'s expert weights and token count for ``collective=False`` calls of
        other ranks (validated like a kernel call against the rank's registered buffer, under the
        active profile; weights in the layout the kernels take)."""
        bind_rank(self, rank, l1_weights, l2_weights, num_tokens, shared_l1_weights, shared_l2_weights,
                  activation_clamp, fast_math)
