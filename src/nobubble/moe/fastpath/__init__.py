"""MoE fast paths: the same dispatch / combine contract as :class:`~nobubble.moe.Buffer`, faster.

:class:`~nobubble.moe.Buffer` chooses among them from its transport's declared
:class:`~nobubble.moe.transport.Capabilities` and its ``topology``; import them from their modules.

- :mod:`.shm_transport`, :mod:`.shm_rows`: shared memory between ranks of one host
  (gather-on-write dispatch, reduce-on-read combine).
- :mod:`.hierarchical`: rows cross node boundaries once per node (``Topology``).
- :mod:`.low_latency`: fixed-capacity decode mode; :mod:`.fp8`: e4m3 rows, one scale per 128.
- :mod:`.overlap`: communication under compute, over token chunks or microbatches.
- :mod:`.cpu_kernels`, :mod:`.cpu_memory`: C kernels compiled at first use, recycled outputs.
"""
