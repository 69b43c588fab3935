"""Slow, obviously-correct pipeline step that the runtime's tests compare the runner against.

One process runs every stage in order on every microbatch, with no schedule, no messages and
no B/W split: ``loss = mean_i loss_fn(stage_{S-1}(...stage_0(x_i)), y_i)``, then one
``backward``. :class:`~nobubble.pipeline.runtime.runner.PipelineRunner` promises the same
loss on every rank and, over its ranks together (each holds its own stages'), the same
gradients, for any schedule.

It imports only torch (nothing it checks), and works on a deep copy of the user's stages, so
it neither reads nor leaves ``.grad`` on the modules the runner is about to use.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

__all__ = ["reference_step"]


def reference_step(
    stages: Sequence[nn.Module],
    inputs: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of one step of ``stages`` run whole in this process.

    Args:
        stages: the ``S`` stage modules in pipeline order (stage ``s`` feeds stage ``s + 1``),
            with the weights the runner starts from; each must return one tensor. They are
            deep-copied and left untouched; stages that draw random numbers (dropout) match
            the runner only where the caller seeds both alike.
        inputs: ``M`` microbatches for stage 0 (any shape and dtype stage 0 takes; shapes may
            differ between microbatches).
        targets: ``M`` microbatches for ``loss_fn``, in the same order as ``inputs``.
        loss_fn: ``loss_fn(output_i, target_i)`` -> a scalar tensor, the one given to the
            runner.

    Returns:
        ``(loss, grads)``: ``loss`` the mean of the ``M`` microbatch losses (what
        ``PipelineRunner.step`` returns); ``grads`` maps ``"{s}.{name}"`` (stage index,
        ``named_parameters`` name within the stage) to that parameter's gradient of the mean
        loss, for every parameter the loss reaches (one with no gradient has no entry).
    """
    if len(inputs) != len(targets) or not inputs:
        raise ValueError(
            f"reference_step: {len(inputs)} input and {len(targets)} target microbatches; "
            "give one target per input, at least one of each"
        )
    copies = [copy.deepcopy(stage) for stage in stages]
    for stage in copies:
        stage.zero_grad(set_to_none=True)  # a deep copy may carry the user's .grad along
    model = nn.Sequential(*copies)
    losses = [loss_fn(model(x), y) for x, y in zip(inputs, targets, strict=True)]
    loss = sum(losses[1:], losses[0]) / len(losses)  # in microbatch order
    loss.backward()
    grads = {
        f"{s}.{name}": param.grad
        for s, stage in enumerate(copies)
        for name, param in stage.named_parameters()
        if param.grad is not None
    }
    return float(loss.detach()), grads
