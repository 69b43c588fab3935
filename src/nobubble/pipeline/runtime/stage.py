"""One pipeline stage on one rank: F, B (input gradient), W (weight gradient), BW (both).

A stage owns a contiguous run of model blocks, its :class:`WeightGradStore`, and per
microbatch the tensors between F and B (its input leaf and its output). The last stage
computes the loss, scaled by ``1 / num_microbatches`` so that the gradients accumulated over
the microbatches equal those of the mean loss over the whole batch.

Lifecycle of microbatch m on a stage: ``forward(m)`` -> ``backward_input(m)`` ->
``backward_weight(m)`` (or ``backward_full(m)`` = both). Calling them out of order raises
RuntimeError naming the stage and microbatch.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch import nn

from nobubble.pipeline.runtime.bw_split import WeightGradStore, attach_store
from nobubble.pipeline.runtime.memory import ActivationMeter

__all__ = ["PipelineStage"]


class PipelineStage:
    """A stage's compute. ``blocks`` maps global block index (str) -> module, in order.

    Args:
        stage_index: this stage's index s in 0..num_stages-1.
        num_stages: S, the total number of stages.
        blocks: the stage's blocks; their parameters receive the gradients.
        loss_fn: ``loss_fn(output, targets) -> scalar`` mean loss (used by the last stage).
        num_microbatches: m, for loss scaling.
        meter: optional activation-memory meter shared by the rank's stages.
    """

    def __init__(
        self,
        *,
        stage_index: int,
        num_stages: int,
        blocks: nn.ModuleDict,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        num_microbatches: int,
        meter: ActivationMeter | None = None,
    ) -> None:
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.blocks = blocks
        self.loss_fn = loss_fn
        self.num_microbatches = num_microbatches
        self.meter = meter
        self.store = WeightGradStore()
        attach_store(blocks, self.store)
        self._inputs: dict[int, torch.Tensor] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self.losses: dict[int, float] = {}

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def forward(
        self, microbatch: int, x: torch.Tensor, targets: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run F; returns the output activation (detached), or the loss on the last stage."""
        if microbatch in self._outputs:
            raise RuntimeError(f"stage {self.stage_index}: F of microbatch {microbatch} twice")
        if not self.is_first:
            x = x.detach().requires_grad_(True)
        with self.store.recording(microbatch), self._metered(microbatch):
            y = x
            for block in self.blocks.values():
                y = block(y)
            if self.is_last:
                if targets is None:
                    raise RuntimeError(f"last stage: F of microbatch {microbatch} needs targets")
                loss = self.loss_fn(y, targets)
                self.losses[microbatch] = float(loss.detach())
                y = loss / self.num_microbatches
        self._inputs[microbatch] = x
        self._outputs[microbatch] = y
        return y.detach()

    def backward_input(
        self, microbatch: int, grad_output: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Run B: gradients of the stage input (returned; None on stage 0) and of the non-linear
        parameters; the linear layers' weight gradients wait in the store for W."""
        if microbatch not in self._outputs:
            raise RuntimeError(
                f"stage {self.stage_index}: B of microbatch {microbatch} before its F"
            )
        out = self._outputs.pop(microbatch)
        x = self._inputs.pop(microbatch)
        if self.is_last:
            torch.autograd.backward(out)
        else:
            if grad_output is None:
                raise RuntimeError(f"stage {self.stage_index}: B of {microbatch} needs dY")
            torch.autograd.backward(out, grad_output)
        self.store.close_backward(microbatch)
        if self.meter is not None:
            stash = self.store.pending_bytes(microbatch)
            self.meter.backward_input(self.stage_index, microbatch, stash)
        return None if self.is_first else x.grad

    def backward_weight(self, microbatch: int) -> None:
        """Run W: accumulate the deferred weight gradients of ``microbatch``."""
        try:
            self.store.flush(microbatch)
        except RuntimeError as err:
            raise RuntimeError(f"stage {self.stage_index}: {err}") from None
        if self.meter is not None:
            self.meter.backward_weight(self.stage_index, microbatch)

    def backward_full(
        self, microbatch: int, grad_output: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Run BW: B then W right away (1F1B / GPipe's fused backward)."""
        grad_input = self.backward_input(microbatch, grad_output)
        self.backward_weight(microbatch)
        return grad_input

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Microbatches forwarded but not yet through B."""
        return tuple(sorted(self._outputs))

    def _metered(self, microbatch: int):
        if self.meter is None:
            return nullcontext()
        return self.meter.forward(self.stage_index, microbatch)
