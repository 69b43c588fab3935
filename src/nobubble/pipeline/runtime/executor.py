"""Run a built-in model on :class:`~nobubble.pipeline.runtime.runner.PipelineRunner`, one
config per run, traced: :func:`train_rank` ``(ctx, config) -> RankResult`` runs
``config.num_steps`` steps; :func:`train_rank_many` several configs in one process group.

Every rank builds the same global batch (``make_batch(seed=data_seed + step)``), the runner
splits it into ``num_microbatches``, then each rank steps its optimizer: the gradients are
those of one process with gradient accumulation. Every op is a :class:`nobubble.trace.Event`
from a common origin taken after a barrier, so per-rank timelines merge into one trace.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from nobubble.distributed import DistContext
from nobubble.pipeline.actions import Action, Schedule
from nobubble.pipeline.dispatch.perturb import Straggler
from nobubble.pipeline.runtime.hooks import ActionObserver, ActionTiming, StragglerObserver
from nobubble.pipeline.runtime.models import (
    GPTConfig,
    MLPConfig,
    ModelConfig,
    build_blocks,
    partition_blocks,
)
from nobubble.pipeline.runtime.runner import RUNTIME_DISPATCH, PipelineRunner
from nobubble.pipeline.validate import validate
from nobubble.trace import Event
from nobubble.validation import check_fields

__all__ = ["WAIT", "TrainConfig", "RankResult", "train_rank", "train_rank_many", "check_config"]

_OPTIMIZERS = ("sgd", "adamw")
WAIT = "wait"
"""Event category of the time a rank waits for a receive (lane 1); ops are lane 0."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """What to run: a model, a schedule, and the training loop around it."""

    model: ModelConfig
    """The model (``GPTConfig`` / ``MLPConfig``); its blocks are split over the stages."""
    schedule: Schedule
    """Per-rank actions; its ``num_ranks`` must equal the world size."""
    microbatch_size: int = 2
    """Samples per microbatch; the global batch is ``microbatch_size * num_microbatches``."""
    num_steps: int = 1
    optimizer: str = "sgd"
    """``sgd`` (with momentum) or ``adamw``."""
    lr: float = 0.01
    momentum: float = 0.9
    data_seed: int = 0
    collect_grads: bool = False
    """Return every parameter's gradient of step 0 (before the optimizer step)."""
    collect_params: bool = False
    """Return every parameter after the last step."""
    recompute: bool = False
    """Activation checkpointing (``PipelineRunner(recompute=True)``): F keeps its input only,
    B runs the forward again."""
    fail_at: str | None = None
    """``"RANK:ACTION"`` (e.g. ``"1:1F2"``): that rank raises before that action (tests)."""
    dispatch: str = "static"
    """``static`` (walk the schedule) or ``handshake`` (pick each op from what has arrived,
    the schedule as the plan: ``PipelineRunner(dispatch=...)``)."""
    straggler: Straggler | None = None
    """A rank really slowed: its ops sleep ``factor - 1`` times their compute time
    (:class:`~nobubble.pipeline.runtime.hooks.StragglerObserver`, before the tracer)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, GPTConfig | MLPConfig):
            raise ValueError(f"model={self.model!r} must be a GPTConfig or MLPConfig")
        check_fields("TrainConfig", self, ("microbatch_size", "num_steps"), ">= 1")
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r}; choose one of {_OPTIMIZERS}")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        if self.dispatch not in RUNTIME_DISPATCH:
            raise ValueError(f"dispatch={self.dispatch!r}; choose one of {RUNTIME_DISPATCH}")


def check_config(config: TrainConfig, world_size: int | None = None) -> tuple[range, ...]:
    """Everything that can be checked before a process starts; returns the stage ranges.

    Raises ValueError (ScheduleError) for an invalid schedule, a schedule whose rank count is
    not the world size, or a model that cannot be split into the schedule's stages.
    """
    validate(config.schedule)
    sched = config.schedule
    if world_size is not None and sched.num_ranks != world_size:
        raise ValueError(
            f"schedule {sched.name!r} has {sched.num_ranks} ranks but {world_size} processes "
            f"are launched; launch {sched.num_ranks} or build the schedule for {world_size}"
        )
    slow = config.straggler
    if slow is not None and slow.rank >= sched.num_ranks:
        raise ValueError(f"straggler rank {slow.rank} is outside ranks 0..{sched.num_ranks - 1}; "
                         "give a rank of the pipeline")  # fmt: skip
    return partition_blocks(config.model, sched.num_stages)


@dataclass(frozen=True)
class RankResult:
    """What one rank did. Times in seconds; memory in bytes."""

    rank: int
    schedule: str
    stages: tuple[int, ...]
    step_times_s: tuple[float, ...]
    """Barrier-to-barrier time of each step (schedule, send drain and optimizer step)."""
    losses: tuple[float, ...] | None
    """Mean microbatch loss per step, on the rank holding the last stage; else None."""
    events: tuple[Event, ...]
    peak_activation_bytes: int
    """Peak bytes held for backward (saved activations + W's stash), over all steps."""
    device_peak_bytes: int | None = None
    """``torch.cuda.max_memory_allocated`` on CUDA, else None."""
    grads: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    params: dict[str, torch.Tensor] | None = field(default=None, repr=False)


def boundary_shapes(
    model: ModelConfig, ranges: Sequence[range], microbatch_size: int
) -> dict[int, torch.Size]:
    """Shape of each stage's input activation (stages >= 1), found by a forward on ``meta``."""
    with torch.device("meta"):
        blocks = build_blocks(model, device="meta")
        x = model.make_batch(microbatch_size, seed=0, device="meta").inputs
        shapes = {}
        for s, r in enumerate(ranges):
            if s > 0:
                shapes[s] = x.shape
            for i in r:
                x = blocks[str(i)](x)
    return shapes


class _Rank:
    """A rank's blocks, its :class:`PipelineRunner` and optimizer for one TrainConfig."""

    def __init__(self, ctx: DistContext, config: TrainConfig, ranges: tuple[range, ...]) -> None:
        self.ctx, self.config = ctx, config
        sched = config.schedule
        self.stage_ids = sched.stages_of(ctx.rank)
        self.blocks = {s: build_blocks(config.model, ranges[s], ctx.device) for s in self.stage_ids}
        modules = [
            nn.Sequential(OrderedDict(self.blocks[s].items())) if s in self.blocks else None
            for s in range(sched.num_stages)
        ]
        self.tracer = _Tracer(ctx.rank, config.fail_at)
        observers: list[ActionObserver] = [self.tracer]
        if config.straggler is not None:  # first: the tracer times the slowed op
            observers.insert(0, StragglerObserver(config.straggler))
        self.runner = PipelineRunner(
            modules, sched, config.model.loss, group=ctx.group, device=ctx.device,
            timeout_s=ctx.timeout_s, static_shapes=True, observer=observers,
            recompute=config.recompute, dispatch=config.dispatch,
        )  # fmt: skip
        params = [p for b in self.blocks.values() for p in b.parameters()]
        self.optimizer: torch.optim.Optimizer
        if config.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum)
        else:
            self.optimizer = torch.optim.AdamW(params, lr=config.lr)

    def named(self, what: str) -> dict[str, torch.Tensor]:
        out = {}
        for b in self.blocks.values():
            for name, p in b.named_parameters():
                t = p.grad if what == "grad" else p
                assert t is not None, f"{name} has no gradient"  # called after a backward
                out[name] = t.detach().to("cpu", copy=True)
        return out


class _Tracer:
    """The runner's observer: every action as an Event (lane 0), every wait for another
    rank as a ``wait`` Event (lane 1); ``fail_at`` raises before its action (tests)."""

    def __init__(self, rank: int, fail_at: str | None) -> None:
        self.rank, self.fail_at = rank, fail_at
        self.events: list[Event] = []
        self.step, self.origin = 0, 0.0

    def before(self, action: Action) -> None:
        if self.fail_at == f"{self.rank}:{action}":
            raise RuntimeError(f"injected failure on rank {self.rank} before action {action}")

    def after(self, timing: ActionTiming) -> None:
        action, rank, origin = timing.action, self.rank, self.origin
        if timing.message is not None and timing.message[1] != rank:
            key, src = timing.message
            args = {"step": self.step, "from_rank": src}
            self.events.append(_event(f"wait {key.kind} {action}", WAIT, rank, timing.wait_start,
                                      timing.start, origin, args, lane=1))  # fmt: skip
        args = {"step": self.step, "stage": action.stage, "microbatch": action.microbatch}
        self.events.append(_event(str(action), action.op.value, rank, timing.start, timing.end,
                                  origin, args))  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _event(
    name: str,
    cat: str,
    rank: int,
    start: float,
    end: float,
    origin: float,
    args: dict,
    lane: int = 0,
) -> Event:
    """An Event from perf_counter seconds, in microseconds since ``origin``."""
    return Event(name=name, cat=cat, rank=rank, start_us=(start - origin) * 1e6,
                 dur_us=(end - start) * 1e6, args=args, lane=lane)  # fmt: skip


def _run_step(rank: _Rank, step: int) -> tuple[float, float]:
    """One step's forward and backward; returns (its start time, the mean loss)."""
    ctx, config = rank.ctx, rank.config
    num_mb = config.schedule.num_microbatches
    batch = config.model.make_batch(
        config.microbatch_size * num_mb, seed=config.data_seed + step, device=ctx.device
    )
    mbs = batch.split(num_mb)
    rank.tracer.step = step
    dist.barrier(group=ctx.group)
    t0 = time.perf_counter()
    loss = rank.runner.step([b.inputs for b in mbs], [b.targets for b in mbs])
    return t0, float(loss)


def train_rank(ctx: DistContext, config: TrainConfig) -> RankResult:
    """Train ``config.num_steps`` steps of ``config.schedule`` on this rank."""
    ranges = check_config(config, ctx.world_size)
    torch.manual_seed(config.data_seed)
    rank = _Rank(ctx, config, ranges)
    last = config.schedule.rank_of(config.schedule.num_stages - 1) == ctx.rank
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    dist.barrier(group=ctx.group)
    rank.tracer.origin = time.perf_counter()  # ranks leave the barrier together: one origin
    step_times, losses, grads, peak = [], [], None, 0
    try:
        for step in range(config.num_steps):
            t0, loss = _run_step(rank, step)
            peak = max(peak, rank.runner.peak_activation_bytes)
            if step == 0 and config.collect_grads:
                grads = rank.named("grad")
            rank.optimizer.step()
            rank.optimizer.zero_grad(set_to_none=True)
            losses.append(loss)
            _sync(ctx.device)
            dist.barrier(group=ctx.group)
            step_times.append(time.perf_counter() - t0)
    finally:
        rank.runner.close()
    return RankResult(
        rank=ctx.rank,
        schedule=config.schedule.name,
        stages=rank.stage_ids,
        step_times_s=tuple(step_times),
        losses=tuple(losses) if last else None,
        events=tuple(rank.tracer.events),
        peak_activation_bytes=peak,
        device_peak_bytes=(
            torch.cuda.max_memory_allocated(ctx.device) if ctx.device.type == "cuda" else None
        ),
        grads=grads,
        params=rank.named("param") if config.collect_params else None,
    )


def train_rank_many(ctx: DistContext, configs: Sequence[TrainConfig]) -> list[RankResult]:
    """Run several configs one after another in the same process group."""
    return [train_rank(ctx, c) for c in configs]
