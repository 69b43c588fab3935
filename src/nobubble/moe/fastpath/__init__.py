"""MoE fast paths: the same dispatch / combine contract as :class:`~nobubble.moe.Buffer`, faster.

:class:`~nobubble.moe.Buffer` chooses among them from its transport's declared
:class:`~nobubble.moe.transport.Capabilities` and its ``topology``; import them from their
modules (shared memory, hierarchical, low latency, FP8, overlap, CPU kernels and memory).
"""
