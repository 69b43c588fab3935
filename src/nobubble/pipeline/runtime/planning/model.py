"""Plan for your own model: profile each block once (:func:`profile_blocks`, by the one
profiler), then let the pure planner (:func:`~nobubble.pipeline.plan.plan_from_costs`) cut
and schedule it (:func:`plan`; :func:`plan_model` also measures the runtime's own costs).
The :class:`~nobubble.pipeline.plan.Plan` keeps its costs, so ``p.schedule()`` rebuilds the
very schedule the planner weighed on every rank::

    p = plan(blocks, inputs, targets, loss_fn, num_ranks=2)
    runner = PipelineRunner(split_model(blocks, p.num_stages, balance=p), p.schedule(),
                            loss_fn, recompute=p.recompute[0])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from nobubble.pipeline.plan import BlockCosts, Plan, plan_from_costs
from nobubble.pipeline.plan_inputs import check_inputs, check_ranks, microbatch_counts
from nobubble.pipeline.runtime.planning.probe import RuntimeCosts, measure_runtime
from nobubble.pipeline.runtime.profile import profile_modules

__all__ = ["plan", "plan_model", "profile_blocks"]

LossFn = Callable[[torch.Tensor, Any], torch.Tensor]


def profile_blocks(
    blocks: Sequence[nn.Module],
    sample_input: torch.Tensor,
    *,
    targets: Any = None,
    loss_fn: LossFn | None = None,
    repeats: int = 3,
    clock: str = "wall",
) -> list[BlockCosts]:
    """Each block's costs for one microbatch, ``sample_input`` (``(rows, ...)``), on the blocks'
    own device: the output of block ``i`` feeds block ``i + 1``.

    Block 0's input needs no gradient (token ids, usually), so its backward is all W, as the
    runner records it. With ``loss_fn``, the last block's costs include ``loss_fn(output,
    targets)``, as :func:`profile_modules` counts it; without, the last block gets a random
    output gradient like the others. ``activation_bytes`` is what F saves for backward
    (parameters excluded), ``boundary_bytes`` the block's output. B frees none of it: the
    runner holds a microbatch's activations until its W (W's store keeps each linear's input
    and output gradient), and counts its peak so (``PipelineRunner.peak_activation_bytes``).

    Raises:
        ValueError: no blocks, or a block whose output is not one tensor (before any timing).
    """
    if len(blocks) == 0:
        raise ValueError("profile_blocks: no blocks; pass the model as a list of modules")
    prof = profile_modules(list(blocks), sample_input, targets, loss_fn, repeats=repeats,
                           clock=clock)  # fmt: skip
    return prof.block_costs()


def plan(
    blocks: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: Any,
    loss_fn: LossFn,
    *,
    num_ranks: int,
    memory_limit: float | None = None,
    num_microbatches: int | Sequence[int] | None = None,
    schedules: str | Sequence[str] = "auto",
    recompute: bool | str = "auto",
    op_overhead_ms: float = 0.0,
    comm_ms_per_byte: float = 0.0,
    cuts: Sequence[Sequence[int]] | None = None,
    tolerance: float = 0.02,
    ilp_time_limit_s: float | None = None,
    clock: str = "wall",
) -> Plan:
    """The cut, schedule, microbatch count and recompute for ``blocks`` on ``num_ranks`` ranks,
    from the blocks' costs measured on this process (see :func:`plan_from_costs` for the
    search and the arguments).

    ``inputs`` (``(batch, ...)``) and ``targets`` are one step's batch. The blocks are profiled
    once on the smallest microbatch weighed (``batch / max(num_microbatches)`` rows), the last
    block with ``loss_fn`` included; the planner scales the costs linearly to the other
    microbatch sizes. The model's input needs no gradient. ``op_overhead_ms`` and
    ``comm_ms_per_byte`` are the runtime's own costs, which a block profile cannot see
    (:func:`~nobubble.pipeline.runtime.planning.measure_runtime` measures them; 0: compute
    only, which predicts short ops optimistically). ``cuts``, ``tolerance`` and
    ``ilp_time_limit_s`` go to the search; ``clock`` to the profiler.

    Raises:
        ValueError: no blocks, ``num_ranks`` outside ``1..len(blocks)``, a batch that no
            allowed microbatch count divides, an unknown schedule (all before profiling); a
            block whose output is not one tensor (before timing); no plan fits
            ``memory_limit``.
    """
    check_ranks(num_ranks, len(blocks))
    batch_size = int(inputs.shape[0])
    counts = microbatch_counts(num_ranks, batch_size, num_microbatches)
    microbatch_size = batch_size // max(counts)
    check_inputs(len(blocks), num_ranks, batch_size, counts, microbatch_size, schedules,
                 recompute, memory_limit, comm_ms_per_byte, 0.0, op_overhead_ms, tolerance,
                 ilp_time_limit_s=ilp_time_limit_s)  # fmt: skip
    sample = inputs[:microbatch_size]
    sample_targets = targets[:microbatch_size] if isinstance(targets, torch.Tensor) else targets
    costs = profile_blocks(blocks, sample, targets=sample_targets, loss_fn=loss_fn, clock=clock)
    input_bytes = float(sample.numel() * sample.element_size())
    return plan_from_costs(
        costs, num_ranks=num_ranks, batch_size=batch_size, num_microbatches=counts,
        microbatch_size=microbatch_size, schedules=schedules, recompute=recompute,
        memory_limit=memory_limit, first_stage_input_grad=False, input_bytes=input_bytes,
        op_overhead_ms=op_overhead_ms, comm_ms_per_byte=comm_ms_per_byte, cuts=cuts,
        tolerance=tolerance, ilp_time_limit_s=ilp_time_limit_s,
    )  # fmt: skip


def plan_model(
    blocks: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: Any,
    loss_fn: LossFn,
    *,
    num_ranks: int,
    num_microbatches: int | Sequence[int] | None = None,
    memory_limit: float | None = None,
    schedules: str | Sequence[str] = "auto",
    recompute: bool | str = "auto",
    cuts: Sequence[Sequence[int]] | None = None,
    tolerance: float = 0.02,
    ilp_time_limit_s: float | None = None,
    runtime: RuntimeCosts | None = None,
    device: str = "cpu",
    threads: int | None = None,
    clock: str = "wall",
    timeout_s: float = 120.0,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Measure, then plan: the runtime's costs on ``num_ranks`` local ranks, then :func:`plan`.

    Args:
        blocks, inputs, targets, loss_fn: as :func:`plan` takes them; the blocks are profiled
            on their own device (place them first).
        num_ranks, num_microbatches, memory_limit, schedules, recompute, cuts, tolerance,
            ilp_time_limit_s, clock: as :func:`plan`.
        runtime: the runtime's own costs; None measures them with :func:`measure_runtime`
            on ``num_ranks`` local ranks (``device``, ``timeout_s``) for a boundary tensor of
            the first block's output on one microbatch (``batch / num_microbatches`` rows,
            ``4 * num_ranks`` microbatches when not given), or takes them as zero on 1 rank.
        threads: intra-op threads while profiling (as each rank will run; restored after);
            None keeps the current count.
        progress: called with a one-line description as each phase starts.

    Returns:
        The :class:`~nobubble.pipeline.plan.Plan`; its ``setting`` keeps the runtime costs
        it was weighed with (``op_overhead_ms``, ``comm_ms_per_byte``).

    Raises:
        ValueError: ``num_ranks`` outside ``1..len(blocks)`` (before measuring), and what
            :func:`plan` and :func:`measure_runtime` raise.
    """
    check_ranks(num_ranks, len(blocks))
    say = progress if progress is not None else (lambda _: None)
    if runtime is None and num_ranks >= 2:
        say(f"measuring the runtime's cost on {num_ranks} ranks")
        if isinstance(num_microbatches, int):
            m = num_microbatches
        else:
            m = max(num_microbatches) if num_microbatches else 4 * num_ranks
        rows = max(1, len(inputs) // m)
        runtime = measure_runtime(num_ranks, _boundary_shape(blocks[0], inputs[:rows]),
                                  device=device, timeout_s=timeout_s)  # fmt: skip
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        say(f"profiling {len(blocks)} blocks, planning {num_ranks} ranks")
        return plan(
            blocks, inputs, targets, loss_fn, num_ranks=num_ranks, memory_limit=memory_limit,
            num_microbatches=num_microbatches, schedules=schedules, recompute=recompute,
            cuts=cuts, tolerance=tolerance, ilp_time_limit_s=ilp_time_limit_s, clock=clock,
            op_overhead_ms=runtime.op_overhead_ms if runtime else 0.0,
            comm_ms_per_byte=runtime.comm_ms_per_byte if runtime else 0.0,
        )  # fmt: skip
    finally:
        torch.set_num_threads(before)


def _boundary_shape(first: nn.Module, inputs: torch.Tensor) -> tuple[int, ...]:
    """The first block's output for one microbatch, ``inputs``: a boundary tensor's shape, for
    the probe (a block that returns no tensor is refused by :func:`plan`, naming it)."""
    device = next((q.device for q in first.parameters()), inputs.device)
    with torch.no_grad():
        out = first(inputs.to(device))
    return tuple(out.shape) if isinstance(out, torch.Tensor) else (len(inputs), 1)
