"""DeepEP's ``EPHandle``: the routing of one dispatch, reused by cached dispatches and by combine."""

from __future__ import annotations

from typing import Any

__all__ = ["EPHandle"]


class EPHandle:
    """The handle ``dispatch`` returns (contract 5.4); its tensors are in the caller's kind.

    do_expand, num_experts, expert_alignment, num_max_tokens_per_rank, num_sms:
        the dispatch's settings (``num_sms`` resolved; combine reuses it).
    topk_idx:  int64 (T, K), a copy of the routing (``do_handle_copy``) or the caller's tensor.
    psum_num_recv_tokens_per_scaleup_rank:  int32 (R,), inclusive prefix sum of the tokens received
        from each rank (once per token); the last element is N.  DeepEP-Ascend's name,
        ``psum_num_recv_tokens_per_rank``, is the same tensor.
    psum_num_recv_tokens_per_expert:  int32 (E_l,), ``cumsum(align(c_e, A))`` (non-expanded) or
        ``S_e + c_e`` (expanded).
    num_unaligned_recv_tokens_per_expert:  int32 (E_l,), ``c_e``.
    num_recv_tokens_per_expert_list:  ``[align(c_e, A)]`` with CPU sync, ``[]`` without.
    recv_src_metadata:  int32 (rows, K + 2): source index, ``src_rank * K + master`` and the
        expanded slots (DeepEP-Ascend: slots, source index, master slot); rows past N are -1.
    dst_buffer_slot_idx:  int32 (T, K): the row of each selected slot's token in its owner's
        received tokens (-1 for masked slots): device bookkeeping, never compared.
    token_metadata_at_forward, channel_linked_list:  hybrid mode only, so ``None``.
    num_recv_tokens, num_expanded_tokens:  N and M with CPU sync, the allocated worst cases without.
    """

    def __init__(self, do_expand: bool, num_experts: int, expert_alignment: int, num_max_tokens_per_rank: int,
                 num_sms: int, topk_idx: Any, num_recv_tokens: int, num_expanded_tokens: int,
                 num_recv_tokens_per_expert_list: list, psum_num_recv_tokens_per_scaleup_rank: Any,
                 psum_num_recv_tokens_per_expert: Any, num_unaligned_recv_tokens_per_expert: Any,
                 recv_src_metadata: Any, dst_buffer_slot_idx: Any, token_metadata_at_forward: Any | None,
                 channel_linked_list: Any | None) -> None:
        from ..errors import arg_error

        if topk_idx is None:
            raise arg_error("EPHandle", "topk_idx", "the routing tensor", "None", utility=True)
        self.do_expand = do_expand
        self.num_experts = num_experts
        self.expert_alignment = expert_alignment
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_sms = num_sms
        self.topk_idx = topk_idx
        self.psum_num_recv_tokens_per_scaleup_rank = psum_num_recv_tokens_per_scaleup_rank
        self.psum_num_recv_tokens_per_expert = psum_num_recv_tokens_per_expert
        self.num_unaligned_recv_tokens_per_expert = num_unaligned_recv_tokens_per_expert
        self.num_recv_tokens_per_expert_list = num_recv_tokens_per_expert_list
        self.recv_src_metadata = recv_src_metadata
        self.dst_buffer_slot_idx = dst_buffer_slot_idx
        self.token_metadata_at_forward = token_metadata_at_forward
        self.channel_linked_list = channel_linked_list
        self.num_recv_tokens = num_recv_tokens
        self.num_expanded_tokens = num_expanded_tokens
        self.cached_recv_src_metadata_before_sort = None
        # The emulator's own bookkeeping: the buffer that made this handle (a weak reference).
        self._owner: Any = None

    # Note: every handle also answers DeepEP-Ascend's name; dst_buffer_slot_idx (and Ascend's
    # dst_gsge_idx) hold the emulator's own bookkeeping (the token's row at its owner).
    @property
    def psum_num_recv_tokens_per_rank(self) -> Any:
        """DeepEP-Ascend's name of ``psum_num_recv_tokens_per_scaleup_rank`` (the same tensor)."""
        return self.psum_num_recv_tokens_per_scaleup_rank

    def deterministic_sort(self, do_cpu_sync: bool, is_cached_dispatch: bool, recv_x: Any, recv_sf: Any | None,
                           recv_topk_idx: Any, recv_topk_weights: Any, channel_linked_list: Any | None) -> None:
        """DeepEP's deterministic epilogue.  The emulator's outputs are already in the canonical
        order this sort produces, so it changes nothing."""
        # Note: a no-op: dispatch outputs are always canonical (contract 5.6).
        return None

    def __repr__(self) -> str:
        return (f"EPHandle(do_expand={self.do_expand}, num_experts={self.num_experts}, "
                f"expert_alignment={self.expert_alignment}, num_max_tokens_per_rank={self.num_max_tokens_per_rank}, "
                f"num_recv_tokens={self.num_recv_tokens}, num_expanded_tokens={self.num_expanded_tokens})")
