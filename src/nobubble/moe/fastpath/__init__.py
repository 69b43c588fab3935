"""MoE fast paths: the same dispatch / combine contract as :class:`~nobubble.moe.Buffer`, faster.

- :func:`make_buffer`: the Buffer for a transport kind (``auto`` / ``shm`` / ``dist``).
- :mod:`.shm_transport`, :mod:`.shm_buffer`: shared memory between ranks of one host.
- :mod:`.hierarchical`: rows cross node boundaries once per node.
- :mod:`.low_latency`: fixed-capacity decode mode; :mod:`.fp8`: e4m3 rows, one scale per 128.
- :mod:`.overlap`: chunked communication / compute overlap of a MoE layer.
- :mod:`.microbatch_overlap`: one microbatch's dispatch / combine under another's compute
  (DualPipe's pairing) in a dense + MoE stage.
- :mod:`.cpu_kernels`, :mod:`.cpu_memory`: C kernels compiled at first use, recycled outputs.
"""

from __future__ import annotations

from nobubble.moe.fastpath.fp8 import fp8_dispatch
from nobubble.moe.fastpath.hierarchical import HierarchicalBuffer
from nobubble.moe.fastpath.low_latency import LowLatencyBuffer
from nobubble.moe.fastpath.microbatch_overlap import microbatch_overlapped_forward
from nobubble.moe.fastpath.overlap import overlapped_forward
from nobubble.moe.fastpath.shm_buffer import ShmBuffer, make_buffer
from nobubble.moe.fastpath.shm_transport import ShmTransport, make_transport

__all__ = [
    "make_buffer",
    "make_transport",
    "ShmBuffer",
    "ShmTransport",
    "HierarchicalBuffer",
    "LowLatencyBuffer",
    "fp8_dispatch",
    "overlapped_forward",
    "microbatch_overlapped_forward",
]
