"""``deepgemm_ref.utils.dist``: DeepGEMM's distributed helpers (``deep_gemm.utils.dist``), on gloo.

One rank per process, as in DeepGEMM's multi-process tests (``torch.multiprocessing.spawn``):

* :func:`init_dist` initialises the default ``torch.distributed`` process group from the
  environment (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` = nodes, ``RANK`` = node rank)
  with the ``gloo`` backend and returns ``(rank, world size, a new group of every rank)``; the
  default device stays the CPU;
* :func:`uneven_all_gather` concatenates every rank's tensor along ``dim`` in rank order, the
  ranks' sizes along ``dim`` may differ (any dtype: the data travels as bytes, since gloo refuses
  float8 and int16);
* :func:`dist_print` prints (everywhere, or once per node) and then waits at a barrier of the
  default group; without a process group it only prints (single-process use).

torch is imported when one of them is called, never by ``import deepgemm_ref``.  The in-process
forms of a group (``deepgemm_ref.mega.EmulatedGroup``, ``deepgemm_ref.ep.run_emulated``) need none
of this.  Bad arguments raise :class:`~deepgemm_ref.errors.DGArgumentError` naming the argument,
before any collective, so a bad argument on every rank cannot leave a peer waiting.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..comm.process import dist_print, process_group_from_env, torch_dist
from ..errors import arg_error

__all__ = ["init_dist", "uneven_all_gather", "dist_print"]


def init_dist(local_rank: int, num_local_ranks: int) -> tuple[int, int, Any]:
    """Initialise ``torch.distributed`` for this process, DeepGEMM's ``init_dist`` on gloo.

    local_rank:       this process's rank on its node, in ``[0, num_local_ranks)``.
    num_local_ranks:  processes per node (> 0).

    The environment gives the rendezvous: ``MASTER_ADDR`` (``127.0.0.1``), ``MASTER_PORT``
    (``8361``), ``WORLD_SIZE`` (nodes, 1) and ``RANK`` (this node, 0).  The world has
    ``W = nodes * num_local_ranks`` ranks; this process is rank ``node * num_local_ranks +
    local_rank``.  Returns ``(rank, W, group)`` where ``group = dist.new_group(range(W))`` (a
    ``ProcessGroup`` over every rank, what DeepGEMM's Mega MoE and DeepEP's buffers take).

    DeepGEMM uses NCCL, passes ``device_id=cuda:local_rank`` and makes CUDA the default device;
    here the backend is gloo and the default device stays the CPU.  A second call in one process
    raises torch's error (the default group exists already).
    """
    dist, world, _ = process_group_from_env("init_dist", local_rank, num_local_ranks)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(world)))


def _describe(t: Any, dim: int) -> str:
    shape = list(t.shape)
    shape[dim] = "*"
    return f"{t.dtype} of shape ({', '.join(map(str, shape))}) gathered along dim {dim}"


def uneven_all_gather(tensor: Any, dim: int = 0, group: Any = None) -> Any:
    """Every rank's ``tensor`` concatenated along ``dim`` in rank order (sizes along ``dim`` may differ).

    tensor:  a torch tensor of at least one dimension, any dtype (bf16, float8, int16, bool, ...);
             every rank's has the same dtype and the same sizes in every other dimension.
    dim:     the dimension to gather along (negative counts from the end).
    group:   a ``torch.distributed`` process group this process belongs to; None: the default
             group (initialised by :func:`init_dist`).

    Returns a new tensor of ``tensor``'s dtype and device whose size along ``dim`` is the sum of
    the ranks' sizes ``n_0 + ... + n_{W-1}``: rows ``[n_0 + ... + n_{r-1}, ... + n_r)`` are rank
    r's ``tensor``, bit for bit.  As DeepGEMM's: the sizes are all-gathered first (int64), each
    rank pads its tensor with zeros along ``dim`` to the largest size, the padded tensors are
    all-gathered and each is cut back to its size.  The padded tensors travel as ``uint8`` byte
    views (gloo refuses float8 and int16), so every dtype arrives bitwise.

    A collective: every rank of ``group`` calls it.  Ranks whose tensors differ in dtype, number
    of dimensions, ``dim`` or the other sizes all raise :class:`~deepgemm_ref.errors.DGArgumentError`
    (naming ``tensor``, the groups of ranks that agree and this rank's tensor) after the size
    exchange, before any data moves.
    """
    func = "uneven_all_gather"
    torch, dist = torch_dist(func)
    if not isinstance(tensor, torch.Tensor):
        raise arg_error(func, "tensor", "a torch.Tensor", f"{type(tensor).__name__}")
    if tensor.dim() == 0:
        raise arg_error(func, "tensor", "a tensor of at least one dimension", "a 0-d tensor")
    if tensor.is_quantized or tensor.is_sparse or tensor.layout != torch.strided:
        raise arg_error(func, "tensor", "a dense strided tensor", f"layout {tensor.layout}")
    ndim = tensor.dim()
    if not isinstance(dim, int) or isinstance(dim, bool) or not -ndim <= dim < ndim:
        raise arg_error(func, "dim", f"an int in [-{ndim}, {ndim}) for a {ndim}-d tensor", repr(dim))
    dim %= ndim
    if not dist.is_initialized():
        raise arg_error(func, "group", "a process group (initialise one first, e.g. with init_dist)",
                        "no default process group initialised")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise arg_error(func, "group", "a torch.distributed ProcessGroup or None", f"{type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise arg_error(func, "group", "a process group this process belongs to", "a group without this rank")
    world = dist.get_world_size(group)

    # 1. sizes along dim, with a digest of everything else that must agree
    label = _describe(tensor, dim)
    digest = int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "little", signed=True)
    header = torch.tensor([tensor.shape[dim], digest], dtype=torch.int64, device=tensor.device)
    headers = [torch.zeros_like(header) for _ in range(world)]
    dist.all_gather(headers, header, group=group)
    sizes = [int(h[0]) for h in headers]
    digests = [int(h[1]) for h in headers]
    # Note: ranks whose tensors disagree (dtype, ndim, dim, other sizes) all raise the argument error
    # here; DeepGEMM's all_gather of unequal tensors fails inside the backend or reads garbage.
    if len(set(digests)) != 1:
        ranks = [[r for r in range(world) if digests[r] == d] for d in dict.fromkeys(digests)]
        raise arg_error(func, "tensor", "the same dtype, number of dimensions, dim and other sizes on every rank",
                        f"ranks disagree (groups of ranks that agree: {ranks}; this rank: {label})")
    max_size = max(sizes)

    # 2. pad with zeros along dim, gather the bytes, cut each rank's back to its size
    if tensor.shape[dim] < max_size:
        pad_shape = list(tensor.shape)
        pad_shape[dim] = max_size - tensor.shape[dim]
        padded = torch.cat([tensor.detach(), torch.zeros(pad_shape, dtype=tensor.dtype, device=tensor.device)],
                           dim=dim)
    else:
        padded = tensor.detach().contiguous()
    flat = padded.reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else torch.zeros(0, dtype=torch.uint8, device=tensor.device)
    if raw.numel():
        gathered = [torch.empty_like(raw) for _ in range(world)]
        dist.all_gather(gathered, raw, group=group)
        parts = [g.view(tensor.dtype).reshape(padded.shape) for g in gathered]
    else:  # nothing to move on any rank (the other dims agree, so every padded tensor is empty)
        parts = [padded.clone() for _ in range(world)]
    return torch.cat([torch.narrow(p, dim, 0, n) for p, n in zip(parts, sizes, strict=True)], dim=dim)
