"""Import the schedules ``torch.distributed.pipelining`` generates, as our ``Schedule``.

torch builds a schedule's ``pipeline_order`` (rank -> list of ``_Action``) in the schedule
object's constructor, from the stage objects it is given; building it needs no process
group and no model, only each stage's index, the number of stages, the pipeline group size
and the local rank. :class:`_StageInfo` carries exactly those fields (it is not a stage:
nothing runs), so the orders imported here are the ones torch itself would execute.

The orders pass through the same text form torch's ``_dump_csv`` writes (``str(action)``
per cell), read by :meth:`Schedule.from_csv`; DualPipeV's overlapped cells
``(0F7;7B3)OVERLAP_F_B`` are read as their sub-actions in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nobubble.pipeline.actions import Schedule, ScheduleFormatError

__all__ = ["TORCH_SCHEDULES", "torch_schedule", "available_torch_schedules"]

# our name -> (torch class, chunks per rank, stage layout)
TORCH_SCHEDULES: dict[str, tuple[str, int, str]] = {
    "torch-gpipe": ("ScheduleGPipe", 1, "loop"),
    "torch-1f1b": ("Schedule1F1B", 1, "loop"),
    "torch-interleaved-1f1b": ("ScheduleInterleaved1F1B", 2, "loop"),
    "torch-interleaved-zb": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "torch-zbv": ("ScheduleZBVZeroBubble", 2, "v"),
    "torch-dualpipev": ("ScheduleDualPipeV", 2, "v"),
}


@dataclass
class _StageInfo:
    """The fields torch's schedule constructors read from a stage (no module runs)."""

    stage_index: int
    num_stages: int
    group_size: int
    group_rank: int
    submod: object = None
    stage_index_to_group_rank: dict[int, int] = field(default_factory=dict)

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1


def available_torch_schedules() -> list[str]:
    """Our names of the torch schedules this torch version provides."""
    try:
        from torch.distributed.pipelining import schedules
    except ImportError:
        return []
    return [name for name, (cls, _, _) in TORCH_SCHEDULES.items() if hasattr(schedules, cls)]


def torch_schedule(name: str, *, num_stages: int, num_microbatches: int) -> Schedule:
    """torch's schedule ``name`` (a key of :data:`TORCH_SCHEDULES`) for ``num_stages`` ranks.

    Raises ValueError when the name is unknown, this torch lacks the class, or torch
    refuses the sizes (its message is passed on).
    """
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"unknown torch schedule {name!r}; choose one of {list(TORCH_SCHEDULES)}")
    cls_name, chunks, layout = TORCH_SCHEDULES[name]
    import torch.nn
    from torch.distributed.pipelining import schedules

    cls = getattr(schedules, cls_name, None)
    if cls is None:
        raise ValueError(f"this torch has no {cls_name}")
    p, total = num_stages, num_stages * chunks
    # the stages of rank 0 (any rank will do: torch computes every rank's order)
    ranks_stages = [k * p for k in range(chunks)] if layout == "loop" else [0, 2 * p - 1]
    stages = [_StageInfo(s, total, p, 0, submod=torch.nn.Identity()) for s in ranks_stages]
    try:
        if chunks == 1:
            obj = cls(stages[0], num_microbatches)
            order = obj._get_pipeline_order()
        else:
            obj = cls(stages, num_microbatches)
            order = obj.pipeline_order
    except (ValueError, RuntimeError, AssertionError) as err:
        raise ValueError(
            f"torch refuses {cls_name} with p={p}, m={num_microbatches}: {err}"
        ) from None
    try:
        return Schedule.from_torch_order(order, name=name, num_microbatches=num_microbatches)
    except ScheduleFormatError as err:
        raise ScheduleFormatError(f"torch's {cls_name} order is invalid: {err}") from None
