"""Run a schedule on a real model: every rank walks its actions, then steps its optimizer.

Entry points (run on each rank, inside :func:`nobubble.distributed.spawn` or under
``torchrun`` with :func:`nobubble.distributed.context_from_env`):

- :func:`train_rank` ``(ctx, config) -> RankResult``: ``config.num_steps`` training steps.
- :func:`train_rank_many` ``(ctx, configs) -> list[RankResult]``: several configs in one
  process group (tests run every schedule in one spawn).

Per step: every rank builds the same global batch (``make_batch(seed=data_seed + step)``),
splits it into ``num_microbatches`` equal microbatches, runs its actions in order (receives
posted ``lookahead`` actions early, sends posted at once), waits for its sends, then runs the
optimizer on its own parameters. The last stage scales each microbatch loss by
``1 / num_microbatches``, so the accumulated gradients are those of the batch-mean loss: the
same as one process running the whole model with gradient accumulation.

Every op is recorded as a :class:`nobubble.trace.Event` (``start_us`` from a common origin
taken right after a barrier), so per-rank timelines merge into one Chrome trace.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from nobubble.distributed import DistContext
from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.runtime.memory import ActivationMeter
from nobubble.pipeline.runtime.models import (
    Batch,
    GPTConfig,
    MLPConfig,
    ModelConfig,
    build_blocks,
    partition_blocks,
)
from nobubble.pipeline.runtime.p2p import P2PChannel, incoming, outgoing
from nobubble.pipeline.runtime.stage import PipelineStage
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
    lookahead: int = 2
    """Receives are posted this many actions ahead of the action that needs them."""
    collect_grads: bool = False
    """Return every parameter's gradient of step 0 (before the optimizer step)."""
    collect_params: bool = False
    """Return every parameter after the last step."""
    sync_device: bool = True
    """On CUDA, synchronize after each op so recorded times are the op's."""
    fail_at: str | None = None
    """``"RANK:ACTION"`` (e.g. ``"1:1F2"``): that rank raises before that action (tests)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, GPTConfig | MLPConfig):
            raise ValueError(f"model={self.model!r} must be a GPTConfig or MLPConfig")
        check_fields("TrainConfig", self, ("microbatch_size", "num_steps"), ">= 1")
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r}; choose one of {_OPTIMIZERS}")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        if self.lookahead < 0:
            raise ValueError(f"lookahead={self.lookahead} must be >= 0")


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


def activation_dtype(model: ModelConfig) -> torch.dtype:
    """The dtype of the activations between blocks (block 0's output, found on ``meta``)."""
    with torch.device("meta"):
        first = build_blocks(model, range(1), device="meta")["0"]
        return first(model.make_batch(1, seed=0, device="meta").inputs).dtype


class _Rank:
    """A rank's stages, optimizer and meter for one TrainConfig."""

    def __init__(self, ctx: DistContext, config: TrainConfig, ranges: tuple[range, ...]) -> None:
        self.ctx, self.config = ctx, config
        sched = config.schedule
        self.stage_ids = sched.stages_of(ctx.rank)
        self.blocks = {s: build_blocks(config.model, ranges[s], ctx.device) for s in self.stage_ids}
        self.meter = ActivationMeter(list(self.blocks.values()))
        self.stages = {
            s: PipelineStage(
                stage_index=s,
                num_stages=sched.num_stages,
                blocks=self.blocks[s],
                loss_fn=config.model.loss,
                num_microbatches=sched.num_microbatches,
                meter=self.meter,
            )
            for s in self.stage_ids
        }
        params = [p for b in self.blocks.values() for p in b.parameters()]
        self.optimizer: torch.optim.Optimizer
        if config.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum)
        else:
            self.optimizer = torch.optim.AdamW(params, lr=config.lr)
        self.shapes = boundary_shapes(config.model, ranges, config.microbatch_size)
        self.dtype = activation_dtype(config.model)
        self.p2p_groups = _direction_groups(ctx)

    def close(self) -> None:
        for g in self.p2p_groups:
            dist.destroy_process_group(g)

    def named(self, what: str) -> dict[str, torch.Tensor]:
        out = {}
        for b in self.blocks.values():
            for name, p in b.named_parameters():
                t = p.grad if what == "grad" else p
                assert t is not None, f"{name} has no gradient"  # called after a backward
                out[name] = t.detach().to("cpu", copy=True)
        return out

    def run_action(
        self, channel: P2PChannel, action: Action, mbs: list[Batch], received: torch.Tensor | None
    ) -> None:
        """Compute ``action`` with the tensor it ``received`` and post what it produces."""
        sched, stage = self.config.schedule, self.stages[action.stage]
        m = action.microbatch
        produced = None
        if action.op is Op.F:
            x = mbs[m].inputs if stage.is_first else received
            assert x is not None  # a later stage's F always receives an activation
            produced = stage.forward(m, x, mbs[m].targets if stage.is_last else None)
        elif action.op is Op.B:
            produced = stage.backward_input(m, received)
        elif action.op is Op.W:
            stage.backward_weight(m)
        else:
            produced = stage.backward_full(m, received)
        out = outgoing(sched, action)
        if out is not None:
            assert produced is not None  # only stage 0's backward yields None, and sends nothing
            channel.send(out[0], out[1], produced)


def _direction_groups(ctx: DistContext) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Two groups over the job's ranks: one for messages to higher ranks, one to lower ranks
    (collective: every rank creates them in the same order)."""
    ranks = dist.get_process_group_ranks(ctx.group) if ctx.group is not None else None
    timeout = timedelta(seconds=ctx.timeout_s)
    return tuple(
        dist.new_group(ranks=ranks, timeout=timeout, backend=ctx.backend) for _ in range(2)
    )


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


def _run_step(rank: _Rank, step: int, origin: float, events: list[Event]) -> float:
    ctx, config = rank.ctx, rank.config
    sched = config.schedule
    num_mb = sched.num_microbatches
    batch = config.model.make_batch(
        config.microbatch_size * num_mb, seed=config.data_seed + step, device=ctx.device
    )
    mbs = batch.split(num_mb)
    channel = P2PChannel(
        sched, ctx.rank, shapes=rank.shapes, dtype=rank.dtype, device=ctx.device,
        timeout_s=ctx.timeout_s, lookahead=config.lookahead, groups=rank.p2p_groups,
    )  # fmt: skip
    sync = config.sync_device and ctx.device.type == "cuda"
    dist.barrier(group=ctx.group)
    t0 = time.perf_counter()
    for pos, action in enumerate(sched.rank_actions[ctx.rank]):
        if config.fail_at == f"{ctx.rank}:{action}":
            raise RuntimeError(f"injected failure on rank {ctx.rank} before action {action}")
        channel.prefetch(pos)
        need = incoming(sched, action)
        wait_start = time.perf_counter()
        received = channel.receive(*need) if need is not None else None
        start = time.perf_counter()
        if need is not None and need[1] != ctx.rank:
            args = {"step": step, "from_rank": need[1]}
            events.append(_event(f"wait {need[0].kind} {action}", WAIT, ctx.rank, wait_start,
                                 start, origin, args, lane=1))  # fmt: skip
        rank.run_action(channel, action, mbs, received)
        if sync:
            _sync(ctx.device)
        args = {"step": step, "stage": action.stage, "microbatch": action.microbatch}
        events.append(_event(str(action), action.op.value, ctx.rank, start, time.perf_counter(),
                             origin, args))  # fmt: skip
    channel.finish()
    return t0


def train_rank(ctx: DistContext, config: TrainConfig) -> RankResult:
    """Train ``config.num_steps`` steps of ``config.schedule`` on this rank."""
    ranges = check_config(config, ctx.world_size)
    torch.manual_seed(config.data_seed)
    rank = _Rank(ctx, config, ranges)
    last = config.schedule.rank_of(config.schedule.num_stages - 1) == ctx.rank
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    dist.barrier(group=ctx.group)
    origin = time.perf_counter()  # ranks leave the barrier together: a common time origin
    events: list[Event] = []
    step_times, losses, grads = [], [], None
    for step in range(config.num_steps):
        t0 = _run_step(rank, step, origin, events)
        if step == 0 and config.collect_grads:
            grads = rank.named("grad")
        rank.optimizer.step()
        rank.optimizer.zero_grad(set_to_none=True)
        if last:
            stage = rank.stages[config.schedule.num_stages - 1]
            losses.append(sum(stage.losses.values()) / len(stage.losses))
            stage.losses.clear()
        if ctx.device.type == "cuda":
            _sync(ctx.device)
        dist.barrier(group=ctx.group)
        step_times.append(time.perf_counter() - t0)
    rank.close()
    return RankResult(
        rank=ctx.rank,
        schedule=config.schedule.name,
        stages=rank.stage_ids,
        step_times_s=tuple(step_times),
        losses=tuple(losses) if last else None,
        events=tuple(events),
        peak_activation_bytes=rank.meter.peak_bytes,
        device_peak_bytes=(
            torch.cuda.max_memory_allocated(ctx.device) if ctx.device.type == "cuda" else None
        ),
        grads=grads,
        params=rank.named("param") if config.collect_params else None,
    )


def train_rank_many(ctx: DistContext, configs: Sequence[TrainConfig]) -> list[RankResult]:
    """Run several configs one after another in the same process group."""
    return [train_rank(ctx, c) for c in configs]
