"""Run a nobubble schedule on ``torch.distributed.pipelining``'s own runtime.

:func:`to_torch` wraps this rank's stage modules in torch's ``PipelineStage`` and loads the
schedule's per-rank actions into torch's ``_PipelineScheduleRuntime``, which adds the sends
and receives::

    runtime = to_torch(stages, schedule, loss_fn)
    runtime.step(x, target=y, losses=losses)   # x where stage 0 lives, y where the last does
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nobubble.pipeline.actions import Schedule

__all__ = ["to_torch"]


def to_torch(
    stages: Sequence[nn.Module | None],
    schedule: Schedule,
    loss_fn: Any,
    *,
    group: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
) -> Any:
    """torch's pipeline runtime executing ``schedule`` over this rank's ``stages``.

    Args are those of :class:`~nobubble.pipeline.runtime.runner.PipelineRunner`. Returns a
    ``torch.distributed.pipelining.schedules._PipelineScheduleRuntime``; gradients are scaled
    by ``1 / num_microbatches`` (torch's ``scale_grads``), the mean microbatch loss's.
    """
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

    from nobubble.pipeline.runtime.runner import own_stage_modules

    modules = own_stage_modules("to_torch", stages, schedule, group)
    own = tuple(modules)
    if device is None:
        first = next((p for m in modules.values() for p in m.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    torch_stages = [
        PipelineStage(modules[s], s, schedule.num_stages, torch.device(device), group=group)
        for s in own
    ]
    runtime = _PipelineScheduleRuntime(torch_stages, schedule.num_microbatches, loss_fn=loss_fn)
    actions = {
        r: [_Action.from_str(str(a)) for a in acts] for r, acts in enumerate(schedule.rank_actions)
    }
    runtime._prepare_schedule_with_comms(actions)
    return runtime
