"""Train a model of the user's own with a plan on local ranks: each rank builds the model
(``build()``, which seeds torch, so every rank holds the same weights), keeps its stages of
the plan's cut (:func:`~nobubble.pipeline.runtime.runner.split_model`) and runs
``plan.schedule()`` with the plan's recompute for ``steps`` steps."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nobubble.distributed import DistContext, spawn
from nobubble.distributed.options import LaunchOptions
from nobubble.pipeline.plan import Plan
from nobubble.pipeline.runtime.runner import PipelineRunner, split_model

__all__ = ["UserModel", "PlanRun", "train_plan"]


@dataclass(frozen=True)
class UserModel:
    """A model of the user's own, as its factory returns it: ``(blocks, inputs, targets,
    loss_fn)``."""

    blocks: list[nn.Module]
    """The model in pipeline order; each block takes one tensor and returns one."""
    inputs: torch.Tensor
    """One step's input batch ``(batch, ...)``."""
    targets: Any
    """One step's targets (split along dim 0 with the inputs when a tensor)."""
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor]
    """``loss_fn(last block's output, targets) -> scalar``, a mean over the rows."""

    def __post_init__(self) -> None:
        blocks = self.blocks
        sequence = isinstance(blocks, list | tuple | nn.Sequential | nn.ModuleList)
        if not sequence or not len(blocks):
            what = "no blocks" if sequence else f"a {type(blocks).__name__}"
            raise ValueError(f"blocks: {what}; give a non-empty list of nn.Module")
        odd = [i for i, b in enumerate(blocks) if not isinstance(b, nn.Module)]
        if odd:
            raise ValueError(
                f"block {odd[0]} is a {type(blocks[odd[0]]).__name__}; give an nn.Module"
            )
        if not isinstance(self.inputs, torch.Tensor):
            raise ValueError(f"inputs: a {type(self.inputs).__name__}; give the batch as a tensor")
        if not callable(self.loss_fn):
            raise ValueError(f"loss_fn: a {type(self.loss_fn).__name__}; give a function "
                             "loss_fn(output, targets)")  # fmt: skip
        object.__setattr__(self, "blocks", list(blocks))

    @classmethod
    def from_factory(cls, factory: Callable[[], Any], *, seed: int = 0) -> UserModel:
        """Seed torch with ``seed``, call ``factory`` and check its answer: every process
        that builds the model so, with the same ``seed``, holds the same weights.

        Raises:
            ValueError: ``factory`` is no function, raised (its error, in one line), returned
                anything but ``(blocks, inputs, targets, loss_fn)``, or parts the class refuses.
        """
        if not callable(factory):
            raise ValueError(f"the factory is not a function (its type is "
                             f"{type(factory).__name__}); name a factory returning (blocks, "
                             "inputs, targets, loss_fn)")  # fmt: skip
        torch.manual_seed(seed)
        try:
            out = factory()
        except Exception as err:  # the user's factory failed: say so, in one line
            raise ValueError(f"the factory raised {type(err).__name__}: "
                             f"{err}".replace("\n", " ")) from err  # fmt: skip
        if not (isinstance(out, tuple | list) and len(out) == 4):
            size = f" of {len(out)}" if isinstance(out, tuple | list) else ""
            raise ValueError(f"the factory returned a {type(out).__name__}{size}; return "
                             "(blocks, inputs, targets, loss_fn): a list of nn.Module, the "
                             "input batch tensor, the targets and loss_fn(output, targets)")  # fmt: skip
        return cls(*out)

    @property
    def num_parameters(self) -> int:
        """Every block's parameters."""
        return sum(p.numel() for b in self.blocks for p in b.parameters())

    @property
    def batch_tokens(self) -> int:
        """What one step's batch holds, as the time estimates count it
        (:func:`~nobubble.pipeline.runtime.models.train_seconds`): token ids ``(B, T)`` are
        B x T tokens, features ``(B, D)`` are B rows."""
        inputs = self.inputs
        return inputs.numel() if not inputs.is_floating_point() else len(inputs)

    def check_plan(self, plan: Plan) -> None:
        """Raise ValueError when ``plan`` was not made for this model: another block count,
        or a batch that does not split into the plan's microbatches."""
        if len(self.blocks) != plan.num_blocks:
            raise ValueError(f"a plan for {plan.num_blocks} blocks, but the model returns "
                             f"{len(self.blocks)}; plan this model again")  # fmt: skip
        batch = int(self.inputs.shape[0])
        if batch % plan.num_microbatches:
            raise ValueError(f"a batch of {batch} rows does not split into the plan's "
                             f"{plan.num_microbatches} microbatches; plan again for this batch")  # fmt: skip


@dataclass(frozen=True)
class PlanRun:
    """What :func:`train_plan` measured."""

    losses: tuple[float, ...]
    """Each step's mean loss."""
    step_ms: tuple[float, ...]
    """Each step's time on the slowest rank (ms)."""

    @property
    def median_step_ms(self) -> float:
        """The median step time (ms), the first step (which warms up) left out unless alone."""
        return statistics.median(self.step_ms[1:] or self.step_ms)


def train_plan(
    plan: Plan,
    build: Callable[[], UserModel],
    *,
    steps: int,
    optimizer: str = "sgd",
    lr: float = 0.01,
    dispatch: str = "static",
    launch: LaunchOptions | None = None,
) -> PlanRun:
    """``steps`` steps of ``plan`` on ``plan.num_ranks`` local ranks where ``launch`` puts
    them; ``build`` (picklable, e.g. a ``functools.partial`` of a module-level function) runs
    on every rank.

    Raises:
        ValueError: ``steps`` < 1 or an unknown ``optimizer``.
        RankFailure: a rank failed or did not answer within ``launch.timeout_s``.
    """
    launch = launch or LaunchOptions()
    if not (isinstance(steps, int) and steps >= 1) or optimizer not in ("sgd", "adamw"):
        raise ValueError(f"train_plan: steps={steps!r} must be >= 1 and optimizer="
                         f"{optimizer!r} 'sgd' or 'adamw'")  # fmt: skip
    results = spawn(_rank_main, plan.num_ranks, args=(build, plan.to_json(), steps, optimizer,
                    lr, dispatch), backend=launch.backend, device=launch.device,
                    timeout_s=launch.timeout_s, threads_per_rank=launch.threads_per_rank)  # fmt: skip
    step_ms = tuple(max(r[1][i] for r in results) * 1e3 for i in range(steps))
    return PlanRun(losses=tuple(results[0][0]), step_ms=step_ms)


def _rank_main(ctx: DistContext, build: Callable[[], UserModel], plan_json: str, steps: int,
               optimizer: str, lr: float, dispatch: str) -> tuple[list[float], list[float]]:  # fmt: skip
    """One rank: build the model, keep this rank's stages, run ``steps``; (losses, step s)."""
    p = Plan.from_json(plan_json)
    model = build()
    sched = p.schedule()
    stages = [s.to(ctx.device) if sched.rank_of(k) == ctx.rank else s
              for k, s in enumerate(split_model(model.blocks, p.num_stages, balance=p))]  # fmt: skip
    runner = PipelineRunner(stages, sched, model.loss_fn, recompute=p.recompute[0],
                            timeout_s=ctx.timeout_s, dispatch=dispatch)  # fmt: skip
    params = [q for m in runner.stage_modules.values() for q in m.parameters()]
    make = torch.optim.AdamW if optimizer == "adamw" else torch.optim.SGD
    opt = make(params, lr=lr) if params else None
    targets = model.targets
    if isinstance(targets, torch.Tensor):
        targets = targets.to(ctx.device)
    inputs = model.inputs.to(ctx.device)
    losses, step_s = [], []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            loss = runner.step(inputs, targets)
            step_s.append(time.perf_counter() - start)
            losses.append(float(loss))
            if opt is not None:
                opt.step()
                opt.zero_grad()
    finally:
        runner.close()
    return losses, step_s
