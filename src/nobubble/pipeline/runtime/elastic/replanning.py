"""Re-planning while training, as a hook of the runner: live per-rank costs, a new cut of
the layers and a new order between two steps, every rank switching together.

::

    replan = Replanner(layers, schedule, lambda ps: torch.optim.AdamW(ps))
    runner = PipelineRunner(replan.stages(), schedule, loss_fn, hooks=[replan])
    for x, y in data:
        loss = runner.step(x, y)      # before it: maybe a re-plan; after it: the measurement
        replan.optimizer.step()
        replan.optimizer.zero_grad(set_to_none=True)
    runner.close()

After each step the ranks all-reduce their compute times (:meth:`Replanner.after_step`) and
:class:`~.policy.ReplanPolicy` decides; before the next step the moved layers migrate
(:mod:`.migrate`: weights, buffers, optimizer state), the optimizer is rebuilt and the runner
re-staged (:meth:`~nobubble.pipeline.runtime.runner.PipelineRunner.restage`). With ``plan``
the order is re-planned on rank 0 and broadcast. Training stays the single-process model's.
Limits: one stage per rank; every rank holds a replica of every layer; optimizer state and
param-group settings carry over by position; use ``replan.optimizer``, which changes at a
re-plan. Decision rules and timing: docs/pipeline/replan.md.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.runtime.channel import global_rank
from nobubble.pipeline.runtime.elastic.migrate import move_layers, owners
from nobubble.pipeline.runtime.elastic.partition import (
    balanced_sizes,
    held_costs,
    speeds_from_times,
)
from nobubble.pipeline.runtime.elastic.policy import ReplanPolicy
from nobubble.pipeline.runtime.hooks import ActionTiming
from nobubble.pipeline.runtime.runner import PipelineRunner

__all__ = ["Replanner", "StepRecord", "OptimizerFactory"]

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
_FIELDS = 5  # per rank: compute ms, step ms, and per microbatch F, backward (B or BW), W ms


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One training step as every rank saw it."""

    step: int
    step_ms: float
    """Wall time of the slowest rank's runner step (forward and backward; the optimizer
    step is the loop's, between steps)."""
    compute_ms: tuple[float, ...]
    """Per rank: the time its ops computed (waits excluded)."""
    sizes: tuple[int, ...]
    """The layers per rank this step ran with."""
    replanned_to: tuple[int, ...] | None
    """The cut the next step runs with, when this step's measurements changed it."""
    replan_ms: float = 0.0
    """Wall time of the switch after this step (moving layers, re-staging the runner),
    filled in when the next step starts."""


class Replanner:
    """A :class:`~nobubble.pipeline.runtime.hooks.StepHook` (and action observer) that
    re-cuts ``layers`` (in pipeline order, the whole model, on every rank) over the ranks
    when their measured speeds drift (module docstring).

    Args:
        layers: the model's blocks, the same on every rank (same construction and seed).
        schedule: the runner's schedule: one stage per rank; its ranks are the group's.
        optimizer: ``optimizer(params) -> torch.optim.Optimizer`` over this rank's params.
        layer_costs: each layer's nominal cost (equal when None): what a cut balances.
        sizes: the first cut (layers per rank; default: balanced for equal speeds).
        plan: ``plan(costs) -> Schedule`` for the new cut's predicted per-stage costs (ms),
            run on rank 0 at every re-plan; None keeps the runner's schedule.
        threshold, min_gain, patience: re-plan when a rank's speed moved more than
            ``threshold`` (relative) in ``patience`` steps in a row and the new cut is
            predicted at least ``min_gain`` faster.
        replan: False measures and records but never re-plans (the static baseline).
        group: the runner's process group (None: the default group).

    Bad arguments raise ValueError before any process group is touched.
    """

    def __init__(
        self,
        layers: Sequence[nn.Module],
        schedule: Schedule,
        optimizer: OptimizerFactory,
        *,
        layer_costs: Sequence[float] | None = None,
        sizes: Sequence[int] | None = None,
        plan: Callable[[CostModel], Schedule] | None = None,
        threshold: float = 0.2,
        min_gain: float = 0.05,
        patience: int = 2,
        replan: bool = True,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        p = schedule.num_ranks
        if schedule.num_stages != p:
            raise ValueError(
                f"Replanner: schedule {schedule.name!r} has {schedule.num_stages} "
                f"stages on {p} ranks; re-planning cuts one stage per rank: use a 1-chunk "
                "schedule (1f1b, zb-h1, zb-2p, ...)"
            )
        self.layers = list(layers)
        self.costs = tuple(float(c) for c in layer_costs) if layer_costs is not None else (
            (1.0,) * len(self.layers))  # fmt: skip
        if len(self.costs) != len(self.layers):
            raise ValueError(f"Replanner: {len(self.costs)} layer_costs for "
                             f"{len(self.layers)} layers; give one cost per layer")  # fmt: skip
        first = balanced_sizes(self.costs, (1.0,) * p) if sizes is None else tuple(sizes)
        if len(first) != p or sum(first) != len(self.layers) or min(first) < 1:
            raise ValueError(f"Replanner: sizes {list(first)} must be {p} counts "
                             f">= 1 summing to {len(self.layers)} layers")  # fmt: skip
        self.policy = ReplanPolicy(self.costs, threshold=threshold, min_gain=min_gain,
                                   patience=patience, replan=replan)  # fmt: skip
        self.schedule, self.group = schedule, group
        self._factory, self._plan = optimizer, plan
        self.sizes: tuple[int, ...] = first
        self.history: list[StepRecord] = []
        self._ops: dict[Op, list[float]] = {}
        self._steps, self._start = 0, 0.0
        self._pending: tuple[tuple[int, ...], list[list[float]]] | None = None
        self.rank = dist.get_rank(group)
        self.optimizer = self._factory(self._own_params())

    def own_layers(self) -> list[int]:
        """The indices of the layers this rank holds now."""
        return [i for i, r in enumerate(owners(self.sizes)) if r == self.rank]

    def stages(self) -> list[nn.Module | None]:
        """The runner's stages for the current cut: this rank's an ``nn.Sequential`` of its
        layers (the layer objects themselves), the others None."""
        out: list[nn.Module | None] = [None] * len(self.sizes)
        start = 0
        for r, size in enumerate(self.sizes):
            if r == self.rank:
                out[r] = nn.Sequential(*self.layers[start : start + size])
            start += size
        return out

    def before_step(self, runner: PipelineRunner) -> None:
        """The runner's hook at a step's start: the switch the last step decided, if any."""
        if self._pending is not None:
            new, rows = self._pending
            self._pending = None
            switch_start = time.perf_counter()
            self._switch(runner, new, rows)
            self.history[-1] = dataclasses.replace(
                self.history[-1], replan_ms=(time.perf_counter() - switch_start) * 1e3
            )
        self._ops = {}
        self._start = time.perf_counter()

    def after_step(self, runner: PipelineRunner) -> None:
        """The runner's hook at a step's end: every rank's times all-reduced, the policy's
        decision recorded (and carried out at the next step's start)."""
        mine = self._measure((time.perf_counter() - self._start) * 1e3)
        table = torch.zeros(self.schedule.num_ranks, _FIELDS, dtype=torch.float64)
        table[self.rank] = torch.tensor(mine, dtype=torch.float64)
        table = table.to(runner.device)
        dist.all_reduce(table, group=self.group)
        rows = table.cpu().tolist()
        compute = tuple(r[0] for r in rows)
        new = self.policy.observe(self.sizes, speeds_from_times(compute, self.sizes, self.costs))
        self.history.append(StepRecord(self._steps, max(r[1] for r in rows), compute,
                                       self.sizes, new))  # fmt: skip
        self._steps += 1
        if new is not None:
            self._pending = (new, rows)

    def repartition(
        self, runner: PipelineRunner, sizes: Sequence[int], schedule: Schedule | None = None
    ) -> None:
        """Move to the cut ``sizes`` (and ``schedule``) now, between steps (a collective:
        every rank calls it with the same arguments): layers, optimizer state, the runner."""
        new = tuple(sizes)
        if len(new) != len(self.sizes) or sum(new) != len(self.layers) or min(new) < 1:
            raise ValueError(f"repartition: sizes {list(new)} must be {len(self.sizes)} "
                             f"counts >= 1 summing to {len(self.layers)}")  # fmt: skip
        state = {
            p: self.optimizer.state[p] for p in self._own_params() if p in self.optimizer.state
        }
        kept = move_layers(self.layers, self.sizes, new, state, rank=self.rank, group=self.group,
                           device=runner.device)  # fmt: skip
        groups = [
            {k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups
        ]
        self.sizes = new
        if schedule is not None:
            self.schedule = schedule
        runner.restage(self.stages(), self.schedule)
        self.policy.restart()
        self.optimizer = self._factory(self._own_params())
        for p in self._own_params():
            if p in kept:
                self.optimizer.state[p] = kept[p]
        if len(groups) == len(self.optimizer.param_groups):
            for settings, g in zip(groups, self.optimizer.param_groups, strict=True):
                g.update(settings)
        else:
            warnings.warn(f"Replanner: the optimizer factory made "
                          f"{len(self.optimizer.param_groups)} param groups after the re-plan "
                          f"and {len(groups)} before; their settings (learning rate, ...) "
                          "were not carried over: make the groups independent of which "
                          "layers a rank holds", RuntimeWarning, stacklevel=2)  # fmt: skip

    def layer_state(self) -> list[dict[str, torch.Tensor]]:
        """Every layer's ``state_dict`` as its owner holds it, on every rank (a collective:
        each owner broadcasts its layers)."""
        out = []
        for i, owner in enumerate(owners(self.sizes)):
            src = global_rank(self.group, owner)
            state = {k: v.detach().clone() for k, v in self.layers[i].state_dict().items()}
            for v in state.values():
                dist.broadcast(v, src=src, group=self.group)
            out.append(state)
        return out

    # -- internals ----------------------------------------------------------------------

    def _own_params(self) -> list[nn.Parameter]:
        return [p for i in self.own_layers() for p in self.layers[i].parameters()]

    def before(self, action: Action) -> None:  # the runner's observer
        pass

    def after(self, timing: ActionTiming) -> None:
        op = Op.B if timing.action.op is Op.BW else timing.action.op
        self._ops.setdefault(op, []).append((timing.end - timing.start) * 1e3)

    def _measure(self, step_ms: float) -> list[float]:
        """This rank's row: its ops' compute ms, step ms, and per microbatch F, backward,
        W ms. The optimizer step is not counted as compute: it scales with the parameters
        held, not with the layer cost the cut balances, and its noise hid the drift."""
        # each op kind's count x its median: one descheduled op (a GC pause, a noisy
        # neighbour) does not read as a slower rank
        compute = sum(len(v) * statistics.median(v) for v in self._ops.values())
        per = [
            sum(v) / len(v) if v else 0.0
            for v in (self._ops.get(o, []) for o in (Op.F, Op.B, Op.W))
        ]
        return [compute, step_ms, *per]

    def _switch(
        self, runner: PipelineRunner, new: tuple[int, ...], rows: list[list[float]]
    ) -> None:
        schedule = None
        if self._plan is not None:
            box: list[Any] = [None]
            if self.rank == 0:  # its error reaches every rank, not only rank 0
                try:
                    box[0] = self._plan(self._predicted_costs(new, rows))
                except Exception as err:  # noqa: BLE001 - re-raised on every rank below
                    box[0] = f"{type(err).__name__}: {err}"
            dist.broadcast_object_list(box, src=global_rank(self.group, 0), group=self.group,
                                       device=runner.device)  # fmt: skip
            schedule = box[0]
            if not isinstance(schedule, Schedule):
                raise RuntimeError(f"Replanner: plan() failed on rank 0 for the cut "
                                   f"{list(new)}: {schedule}")  # fmt: skip
            if (schedule.num_ranks, schedule.num_stages, schedule.num_microbatches) != (
                    self.schedule.num_ranks, self.schedule.num_stages,
                    self.schedule.num_microbatches):  # fmt: skip
                raise ValueError(f"Replanner: plan returned {schedule.name!r} for "
                                 f"{schedule.num_ranks} ranks / {schedule.num_microbatches} "
                                 "microbatches; return one for the pipeline's own")  # fmt: skip
        self.repartition(runner, new, schedule)

    def _predicted_costs(self, new: tuple[int, ...], rows: list[list[float]]) -> CostModel:
        """Per-stage costs (ms per microbatch) of the cut ``new``: each rank's measured F, B,
        W times scaled by how much layer cost it holds now against before."""

        old, now = held_costs(self.sizes, self.costs), held_costs(new, self.costs)
        scale = [n / o for n, o in zip(now, old, strict=True)]
        t = [[max(rows[r][2 + k] * scale[r], 1e-6) for r in range(len(new))] for k in range(3)]
        return CostModel(t_f=tuple(t[0]), t_b=tuple(t[1]), t_w=tuple(t[2]),
                         mem_f=(1.0,) * len(new), mem_b=(0.5,) * len(new),
                         mem_w=(0.5,) * len(new))  # fmt: skip
