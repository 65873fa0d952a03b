"""DeepEP's legacy ``Config``: the chunking of the V1 intranode / internode kernels.

The constructor checks DeepEP's ranges (and rounds the RDMA receive chunk up to a multiple of the
send chunk), the two size hints are DeepEP's formulas.  :class:`~deepgemm_ref.ep.Buffer` takes a
``Config`` in ``dispatch`` / ``combine`` (``num_sms / 2`` channels, the NVLink chunk sizes of its
buffer-size checks); ``Buffer.get_dispatch_config`` / ``get_combine_config`` return DeepEP's
recommended ones.  A config changes no result.
"""

from __future__ import annotations

from ..errors import arg_error
from ..exact import align
from ..toolkit.sizes import size_arg

__all__ = ["Config"]

#: NVLink peers of one host in the legacy kernels.
NUM_MAX_NVL_PEERS = 8
#: Bytes of the legacy kernels' per-token source metadata (two ints).
SOURCE_META_BYTES = 8
_MAX_TOPK = 128
_MAX_SCALES = 128


class Config:
    """Chunk sizes of the legacy kernels (no effect on results).

    num_sms:  SMs of the kernels (>= 0; channels = num_sms / 2; dispatch and combine need an even
              count of at least 2);
    num_max_nvl_chunked_send_tokens < num_max_nvl_chunked_recv_tokens (both > 0);
    num_max_rdma_chunked_recv_tokens is rounded up to a multiple of the send chunk, which must
    then be at most half of it.
    """

    def __init__(self, num_sms: int = 20, num_max_nvl_chunked_send_tokens: int = 6,
                 num_max_nvl_chunked_recv_tokens: int = 256, num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 256) -> None:
        func = "Config"
        sms = size_arg(func, "num_sms", num_sms, 0)
        nvl_send = size_arg(func, "num_max_nvl_chunked_send_tokens", num_max_nvl_chunked_send_tokens, 1)
        nvl_recv = size_arg(func, "num_max_nvl_chunked_recv_tokens", num_max_nvl_chunked_recv_tokens, 1)
        if nvl_send >= nvl_recv:
            raise arg_error(func, "num_max_nvl_chunked_send_tokens",
                            f"less than num_max_nvl_chunked_recv_tokens ({nvl_recv})", str(nvl_send))
        rdma_send = size_arg(func, "num_max_rdma_chunked_send_tokens", num_max_rdma_chunked_send_tokens, 1)
        rdma_recv = align(size_arg(func, "num_max_rdma_chunked_recv_tokens", num_max_rdma_chunked_recv_tokens, 1),
                          rdma_send)
        if rdma_send > rdma_recv // 2:
            raise arg_error(func, "num_max_rdma_chunked_send_tokens",
                            f"at most half of num_max_rdma_chunked_recv_tokens rounded up to a multiple of it "
                            f"({rdma_recv})", str(rdma_send))
        self.num_sms = sms
        self.num_max_nvl_chunked_send_tokens = nvl_send
        self.num_max_nvl_chunked_recv_tokens = nvl_recv
        self.num_max_rdma_chunked_send_tokens = rdma_send
        self.num_max_rdma_chunked_recv_tokens = rdma_recv

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int, /) -> int:
        """NVLink buffer bytes for ``hidden_bytes`` per token and ``num_ranks`` ranks (a multiple of 128):
        ``channels * nvl_ranks * ((2 rdma_ranks + 3) * 4 + recv_tokens * (hidden_bytes + 8 + 128 * 8
        + 128 * 4 + 128 * 4))`` with ``channels = num_sms / 2``."""
        func = "Config.get_nvl_buffer_size_hint"
        hb = size_arg(func, "hidden_bytes", hidden_bytes, 0, None)
        ranks = size_arg(func, "num_ranks", num_ranks, 1)
        if not (ranks < NUM_MAX_NVL_PEERS or ranks % NUM_MAX_NVL_PEERS == 0):
            raise arg_error(func, "num_ranks", f"below {NUM_MAX_NVL_PEERS} or a multiple of it", str(ranks))
        if ranks > NUM_MAX_NVL_PEERS and self.num_sms % 2:
            raise arg_error(func, "num_sms", "an even SM count across hosts", str(self.num_sms))
        rdma_ranks = max(ranks // NUM_MAX_NVL_PEERS, 1)
        nvl_ranks = min(ranks, NUM_MAX_NVL_PEERS)
        per = self.num_sms // 2 * nvl_ranks
        recv = self.num_max_nvl_chunked_recv_tokens
        n = per * (2 * rdma_ranks + 3) * 4
        n += per * recv * (hb + SOURCE_META_BYTES + _MAX_TOPK * 8 + _MAX_TOPK * 4 + _MAX_SCALES * 4)
        return align(n, 128)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int, /) -> int:
        """RDMA buffer bytes (0 on one host, ``num_ranks <= 8``; a multiple of 128 otherwise)."""
        func = "Config.get_rdma_buffer_size_hint"
        hb = size_arg(func, "hidden_bytes", hidden_bytes, 0, None)
        ranks = size_arg(func, "num_ranks", num_ranks, 1)
        if ranks <= NUM_MAX_NVL_PEERS:
            return 0
        if ranks % NUM_MAX_NVL_PEERS:
            raise arg_error(func, "num_ranks", f"a multiple of {NUM_MAX_NVL_PEERS} across hosts", str(ranks))
        if self.num_sms % 2:
            raise arg_error(func, "num_sms", "an even SM count across hosts", str(self.num_sms))
        per = self.num_sms // 2 * (ranks // NUM_MAX_NVL_PEERS)
        recv = self.num_max_rdma_chunked_recv_tokens
        n = per * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
        n += per * recv * 2 * (hb + SOURCE_META_BYTES + _MAX_TOPK * 8 + _MAX_TOPK * 4 + _MAX_SCALES * 4 + 16)
        return align(n, 128)

    def __repr__(self) -> str:
        return (f"Config(num_sms={self.num_sms}, "
                f"num_max_nvl_chunked_send_tokens={self.num_max_nvl_chunked_send_tokens}, "
                f"num_max_nvl_chunked_recv_tokens={self.num_max_nvl_chunked_recv_tokens}, "
                f"num_max_rdma_chunked_send_tokens={self.num_max_rdma_chunked_send_tokens}, "
                f"num_max_rdma_chunked_recv_tokens={self.num_max_rdma_chunked_recv_tokens})")
