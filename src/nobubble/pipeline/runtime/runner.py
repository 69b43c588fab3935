"""Train your own model with any schedule: one :class:`PipelineRunner` per rank, your loop.

::

    runner = PipelineRunner(stages, schedule, loss_fn)   # every rank, same arguments
    for x, y in data:
        loss = runner.step(x, y)          # the whole batch; split into microbatches here
        optimizer.step(); optimizer.zero_grad()
    runner.close()

Stage ``s`` takes stage ``s - 1``'s output (one tensor); stage 0 a microbatch of ``inputs``
(a tensor, or a tuple of positional arguments); the last stage's output goes to
``loss_fn(output, targets)``. After ``step`` every parameter's ``.grad`` is the gradient of
the mean microbatch loss, as one process running the whole model with gradient
accumulation. The checks that need no communication run before any message is sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.partition import stage_ranges, stage_sizes
from nobubble.pipeline.plan import Plan
from nobubble.pipeline.runtime.autosplit import ModuleSplit, SplitReport
from nobubble.pipeline.runtime.channel import Channel, ShapeCache, global_rank, incoming, outgoing
from nobubble.pipeline.runtime.cursor import dispatch_loop
from nobubble.pipeline.runtime.hooks import ActionObserver, ActionTiming, StepHook
from nobubble.pipeline.validate import validate

__all__ = ["PipelineRunner", "LossFn", "split_model", "ActionTiming", "ActionObserver",
           "StepHook", "RUNTIME_DISPATCH"]  # fmt: skip

LossFn = Callable[[torch.Tensor, Any], torch.Tensor]
Batch = torch.Tensor | tuple[torch.Tensor, ...]
RUNTIME_DISPATCH = ("static", "handshake")


def own_stage_modules(
    who: str, stages: Sequence[nn.Module | None], schedule: Schedule,
    group: dist.ProcessGroup | None,
) -> dict[int, nn.Module]:  # fmt: skip
    """This rank's modules of ``stages`` (one entry per stage of ``schedule``, None where
    another rank holds it), after checking the schedule, the count, the group's size and
    that none of this rank's is None (``who`` starts the errors)."""
    validate(schedule)
    if len(stages) != schedule.num_stages:
        raise ValueError(
            f"{who}: {len(stages)} stage modules for schedule {schedule.name!r} "
            f"with {schedule.num_stages} stages ({schedule.num_ranks} ranks x "
            f"{schedule.num_stages // schedule.num_ranks} chunks); pass one module per stage"
        )
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world != schedule.num_ranks:
        raise ValueError(
            f"{who}: schedule {schedule.name!r} has {schedule.num_ranks} ranks but "
            f"the group has {world}; build the schedule for {world} ranks"
        )
    own = schedule.stages_of(rank)
    missing = [s for s in own if stages[s] is None]
    if missing:
        raise ValueError(
            f"{who}: rank {rank} runs stages {list(own)} but stages "
            f"{missing} are None; pass those modules on this rank"
        )
    return {s: m for s in own if (m := stages[s]) is not None}


class PipelineRunner:
    """Run ``schedule`` over ``stages`` on this rank, one training step per :meth:`step`.

    Args:
        stages: one module per stage (``len == schedule.num_stages``); ``None`` where this
            rank holds no such stage.
        schedule: any valid :class:`~nobubble.pipeline.actions.Schedule` (generated, an ILP
            result, or read from torch's CSV) for as many ranks as the group has.
        loss_fn: ``loss_fn(last stage output, targets microbatch) -> scalar`` (a mean).
        group: the pipeline's process group (None: the default group); the schedule's ranks
            are ranks within it, so several pipelines (PP x DP, PP x EP) run side by side.
        device: where received tensors go (default: the device of this rank's parameters).
        timeout_s: limit for every wait on another rank.
        recompute: activation checkpointing: F runs without autograd and keeps only the
            stage input; B runs the forward again (with the RNG state F had) and then the
            backward; W uses what B kept, so each microbatch's forward runs twice, not three
            times.
        static_shapes: every step's boundary tensors have the first step's shapes (per
            microbatch); messages then travel without their shape header, one send per
            tensor as in torch's runtime. A tensor whose shape changed raises ValueError.
            The saved activations are counted in the first step only (the same shapes
            save the same bytes), so later forwards run without saved-tensor hooks.
        observer: one :class:`~.hooks.ActionObserver` or a list, told before and after
            every action, in order (:mod:`.hooks`); on CUDA the device is synchronised
            before each end time, so times are the op's.
        dispatch: ``"static"`` walks this rank's row of ``schedule``; ``"handshake"`` picks
            each next op from what has arrived, the row as its plan (:mod:`.cursor`: the
            rule, its memory limit, why it cannot deadlock).
        hooks: :class:`~.hooks.StepHook` objects called at the start of every step
            (:class:`~.optim.PostValidatedOptimizer`, :class:`~.elastic.Replanner`).

    After each step, :attr:`peak_activation_bytes` is the most memory this rank held for
    backward at once (the distinct tensors autograd saved, parameters excluded, and with
    ``recompute`` the stage inputs), from each forward to the microbatch's W;
    :attr:`last_order` the order it ran (its row under ``static``); :attr:`last_deviations`
    how many of its ops ran before an earlier op of its row.
    """

    def __init__(
        self,
        stages: Sequence[nn.Module | None],
        schedule: Schedule,
        loss_fn: LossFn,
        *,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        timeout_s: float = 300.0,
        recompute: bool = False,
        static_shapes: bool = False,
        observer: ActionObserver | Sequence[ActionObserver] | None = None,
        dispatch: str = "static",
        hooks: Sequence[StepHook] = (),
    ) -> None:
        if dispatch not in RUNTIME_DISPATCH:
            raise ValueError(f"PipelineRunner: dispatch={dispatch!r}; choose one of "
                             f"{', '.join(RUNTIME_DISPATCH)}")  # fmt: skip
        if not dist.is_initialized():
            raise ValueError(
                "PipelineRunner: torch.distributed is not initialised; start the ranks with "
                "torchrun or nobubble.distributed.spawn"
            )
        self.rank, self.group = dist.get_rank(group), group
        self.loss_fn, self.timeout_s, self.recompute = loss_fn, float(timeout_s), recompute
        self.dispatch, self.static_shapes = dispatch, static_shapes
        self._splits: dict[int, ModuleSplit] = {}
        self._set_stages(stages, schedule)
        self.device = torch.device(device) if device is not None else _device(self.stage_modules)
        ranks = dist.get_process_group_ranks(group) if group is not None else None
        timeout = timedelta(seconds=self.timeout_s)
        # one group per direction (to higher ranks, to lower ranks), created on the pipeline's
        # ranks only when it is a subgroup: other pipelines (data or expert parallel
        # neighbours) create theirs at the same time
        local = ranks is not None
        up, down = (
            dist.new_group(ranks=ranks, timeout=timeout, use_local_synchronization=local)
            for _ in range(2)
        )
        self._groups = (up, down)
        self.peak_activation_bytes = 0
        observers = () if observer is None else observer
        self.observers: tuple[ActionObserver, ...] = (
            tuple(observers) if isinstance(observers, Sequence) else (observers,)
        )
        self.hooks = tuple(hooks)
        # a hook that also watches actions (a Replanner) is told after the observers
        self.observers += tuple(h for h in self.hooks if isinstance(h, ActionObserver))
        self.last_order: tuple[Action, ...] = ()
        self.last_deviations = self._step_index = 0
        self._broken = False  # a step failed: no more steps, groups left alone

    def _set_stages(self, stages: Sequence[nn.Module | None], schedule: Schedule) -> None:
        modules = own_stage_modules("PipelineRunner", stages, schedule, self.group)
        for split in self._splits.values():
            split.close()
        self.schedule = schedule
        self.stage_modules: dict[int, nn.Module] = modules
        self._splits = {s: ModuleSplit(m) for s, m in self.stage_modules.items()}
        # (stage, microbatch) whose backward is split into B and W; the others are one BW
        self._split_backward = {
            (a.stage, a.microbatch) for a in schedule.rank_actions[self.rank] if a.op is Op.B
        }
        self._last_rank = schedule.rank_of(schedule.num_stages - 1)
        self._param_storages = {
            p.untyped_storage().data_ptr() for m in self.stage_modules.values()
            for p in m.parameters()
        }  # fmt: skip
        self._shapes = ShapeCache() if self.static_shapes else None
        self._saved_bytes: dict[tuple[int, int], int] = {}  # static shapes: from step one

    def restage(self, stages: Sequence[nn.Module | None], schedule: Schedule | None = None) -> None:
        """Run ``stages`` (and ``schedule``, else the current one) from the next step: a new
        cut of the model over the same ranks (a re-plan, :class:`~.elastic.Replanner`).
        Between steps, on every rank. The process groups, device, observers, hooks and step
        count stay; boundary shapes are learnt anew. Bad stages raise ValueError as in the
        constructor, before anything changes."""
        if self._broken:
            raise RuntimeError("PipelineRunner.restage: a step failed; build a new runner")
        self._set_stages(stages, schedule if schedule is not None else self.schedule)

    @property
    def is_first(self) -> bool:
        """Whether this rank holds stage 0 (it needs ``inputs``)."""
        return 0 in self.stage_modules

    @property
    def is_last(self) -> bool:
        """Whether this rank holds the last stage (it needs ``targets``)."""
        return self.schedule.num_stages - 1 in self.stage_modules

    def step(self, inputs: Batch | list[Any] | None = None, targets: Any = None) -> torch.Tensor:
        """Forward and backward of one batch; returns the mean microbatch loss on every rank.

        ``inputs`` is used where stage 0 lives, ``targets`` where the last stage lives
        (other ranks may pass None); both are split into ``schedule.num_microbatches``
        equal microbatches along dim 0, or given as a list of microbatches (whose shapes may
        differ: variable sequence lengths). Gradients accumulate into ``.grad``; call the
        optimizer afterwards.
        """
        if self._broken:  # its receiver threads may still hold posted receives
            raise RuntimeError("PipelineRunner: a step failed; build a new runner")
        for hook in self.hooks:
            hook.before_step(self)
        m = self.schedule.num_microbatches
        xs = _split("inputs", inputs, m) if self.is_first else None
        ys = _split("targets", targets, m) if self.is_last else None
        state = _StepState(xs, ys)
        fixed = self.dispatch == "static"
        try:
            channel = Channel(self.schedule, self.rank, device=self.device, ordered=fixed,
                              timeout_s=self.timeout_s, groups=self._groups,
                              shapes=self._shapes if fixed else None)  # fmt: skip
            order, deviations = dispatch_loop(self.schedule, self.rank, channel,
                lambda a, free_since: self._action(a, channel, state, free_since), fixed=fixed)  # fmt: skip
            channel.finish()
        except BaseException:
            self._broken = True  # receiver threads may still be waiting on posted receives
            raise
        self.peak_activation_bytes = state.peak
        self.last_order, self.last_deviations = tuple(order), deviations
        self._step_index += 1
        loss = torch.tensor(sum(state.losses) / m if self.is_last else 0.0).to(self.device)
        dist.broadcast(loss, src=global_rank(self.group, self._last_rank), group=self.group)
        for hook in self.hooks:
            hook.after_step(self)
        return loss

    def _action(
        self, action: Action, channel: Channel, state: _StepState, free_since: float
    ) -> None:
        """Take what ``action`` needs from the mailbox, run it, tell the observers, send what
        it produces (``free_since``: when the rank's wait for this op began)."""
        for observer in self.observers:
            observer.before(action)
        need = incoming(self.schedule, action)
        received = channel.receive(*need) if need is not None else None
        start = time.perf_counter()
        produced = self._run(action, received, state)
        if self.observers and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for observer in self.observers:  # each sees the end after those before it
            observer.after(ActionTiming(action, free_since, start, time.perf_counter(), need,
                                        rank=self.rank, step=self._step_index))  # fmt: skip
        out = outgoing(self.schedule, action)
        if out is not None:
            assert produced is not None  # only stage 0's backward yields None
            channel.send(out[0], out[1], produced)

    def _run(self, action: Action, received: torch.Tensor | None, state: _StepState):
        s, mb = action.stage, action.microbatch
        split = self._splits[s]
        if action.op is Op.F:
            return self._forward(s, mb, received, state)
        if action.op is Op.W:
            split.backward_weight(mb)
            state.release((s, mb))
            return None
        if self.recompute:  # F's forward again, with the random numbers F drew
            args, rng = state.saved.pop((s, mb))
            now = _RngState.capture(self.device)
            rng.restore()
            self._compute(s, mb, args, state, record=True)
            now.restore()  # the stream goes on where it was, not from F's point again
        out, x = state.outputs.pop((s, mb)), state.inputs.pop((s, mb))
        if action.op is Op.BW:
            grad = split.backward_full(mb, out, received, x)
            state.release((s, mb))
        else:
            grad = split.backward_input(mb, out, received, x)
        if s > 0 and grad is None:
            raise RuntimeError(f"stage {s}: its input got no gradient; does its output use it?")
        return grad

    def _forward(self, s: int, mb: int, received: torch.Tensor | None, state: _StepState):
        if s == 0:
            assert state.xs is not None
            x: Any = state.xs[mb]
            args = x if isinstance(x, tuple) else (x,)
        else:
            assert received is not None
            args = (received,)
        if not self.recompute:
            return self._compute(s, mb, args, state, record=True)
        rng = _RngState.capture(self.device)
        with torch.no_grad():
            y = self._compute(s, mb, args, state, record=False)
        state.saved[(s, mb)] = (args, rng)
        state.hold((s, mb), sum(a.untyped_storage().nbytes() for a in args))
        return y

    def _compute(self, s: int, mb: int, args: Any, state: _StepState, *, record: bool):
        """The stage's forward (and loss on the last stage); ``record``: with autograd and
        the B/W split recording, keeping what B needs. Returns what F sends (or None)."""
        if not record:
            return self._run_module(s, mb, args, state)
        stage_input = None
        if s > 0:
            stage_input = args[0].detach().requires_grad_(args[0].is_floating_point())
            args = (stage_input,)
        # stage 0's input needs no gradient: its W walks the whole backward, unsplit
        split = self._splits[s].recording(mb, split=s > 0 and (s, mb) in self._split_backward)
        known = self._saved_bytes.get((s, mb)) if self._shapes is not None else None
        if known is not None:  # static shapes: counted in the first step
            with split:
                y = self._run_module(s, mb, args, state, keep=True)
            nbytes = known
        else:
            saved: dict[int, int] = {}

            def pack(t: torch.Tensor) -> torch.Tensor:
                ptr = t.untyped_storage().data_ptr()
                if ptr not in self._param_storages:
                    saved[ptr] = t.untyped_storage().nbytes()
                return t

            with split, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = self._run_module(s, mb, args, state, keep=True)
            nbytes = self._saved_bytes[(s, mb)] = sum(saved.values())
        state.inputs[(s, mb)] = stage_input
        state.hold((s, mb), nbytes)
        return None if y is None else y.detach()

    def _run_module(self, s: int, mb: int, args: tuple, state: _StepState, keep: bool = False):
        """``module(*args)``, then the scaled loss on the last stage (recorded once)."""
        y = self.stage_modules[s](*args)
        if s < self.schedule.num_stages - 1:
            _check_tensor(s, y, "output")
            if keep:
                state.outputs[(s, mb)] = y
            return y
        assert state.ys is not None
        loss = self.loss_fn(y, state.ys[mb])
        _check_tensor(s, loss, "loss_fn's result")
        if not keep or not self.recompute:  # the recomputed forward's loss is the same one
            state.losses.append(float(loss.detach()))
        if keep:
            state.outputs[(s, mb)] = loss / self.schedule.num_microbatches
        return None

    def split_report(self) -> dict[int, SplitReport | None]:
        """Per stage of this rank: how its weight gradients were computed in the last W."""
        return {s: split.report() for s, split in self._splits.items()}

    def close(self) -> None:
        """Give the modules back and free the process groups (not after a failed step)."""
        for split in self._splits.values():
            split.close()
        for g in self._groups if not self._broken else ():
            dist.destroy_process_group(g)


class _StepState:
    """Per step: the microbatches, what F keeps for B, the last stage's losses."""

    def __init__(self, xs: list | None, ys: list | None) -> None:
        self.xs, self.ys = xs, ys
        self.inputs: dict[tuple[int, int], torch.Tensor | None] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.saved: dict[tuple[int, int], tuple[tuple, _RngState]] = {}  # recompute: F's args
        self.losses: list[float] = []
        self._held: dict[tuple[int, int], int] = {}
        self.live = self.peak = 0

    def hold(self, key: tuple[int, int], nbytes: int) -> None:
        """(stage, microbatch) now holds ``nbytes`` for backward (replacing what it held)."""
        self.live += nbytes - self._held.get(key, 0)
        self._held[key] = nbytes
        self.peak = max(self.peak, self.live)

    def release(self, key: tuple[int, int]) -> None:
        self.live -= self._held.pop(key, 0)


class _RngState:
    """The CPU (and current CUDA device's) RNG state, so a recomputed forward draws the same
    dropout masks as the first one."""

    def __init__(self, cpu: torch.Tensor, cuda: torch.Tensor | None, device: torch.device):
        self.cpu, self.cuda, self.device = cpu, cuda, device

    @classmethod
    def capture(cls, device: torch.device) -> _RngState:
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return cls(torch.get_rng_state(), cuda, device)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def _split(name: str, batch: Any, num_microbatches: int) -> list:
    """``batch`` (a tensor or a tuple of tensors) as ``num_microbatches`` pieces along dim 0;
    a list is taken as the microbatches themselves (they may differ in shape)."""
    if batch is None:
        raise ValueError(
            f"PipelineRunner.step: {name} is None on a rank that needs it; pass the batch's "
            f"{name} on the rank holding the {'first' if name == 'inputs' else 'last'} stage"
        )
    if isinstance(batch, list):
        if len(batch) != num_microbatches:
            raise ValueError(
                f"PipelineRunner.step: {name} is a list of {len(batch)} microbatches for a "
                f"schedule of num_microbatches={num_microbatches}; pass one per microbatch"
            )
        return batch
    if isinstance(batch, tuple):
        parts = [_split(name, t, num_microbatches) for t in batch]
        return [tuple(p[i] for p in parts) for i in range(num_microbatches)]
    if not isinstance(batch, torch.Tensor):
        raise ValueError(f"PipelineRunner.step: {name} is a {type(batch).__name__}; pass a "
                         "tensor or a tuple of tensors")  # fmt: skip
    if batch.shape[0] % num_microbatches:
        raise ValueError(f"PipelineRunner.step: {name} has {batch.shape[0]} rows, not divisible "
                         f"by num_microbatches={num_microbatches}; pad or resize the batch")  # fmt: skip
    return list(batch.chunk(num_microbatches))


def _check_tensor(stage: int, value: object, what: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"stage {stage}'s {what} is a {type(value).__name__}; a stage must "
                        "return one tensor (wrap it so that it does)")  # fmt: skip


def _device(modules: dict[int, nn.Module]) -> torch.device:
    for m in modules.values():
        for p in m.parameters():
            return p.device
    return torch.device("cpu")


def split_model(
    model: nn.Sequential | Sequence[nn.Module],
    num_stages: int,
    *,
    balance: str | Plan | Sequence[float] | None = None,
) -> list[nn.Module]:
    """Cut the blocks of ``model`` (in pipeline order) into ``num_stages`` contiguous stages,
    an ``nn.Sequential`` each of the model's own modules (no copy); the one way nobubble cuts.

    ``balance``: ``None``: equal block counts (the first stages one more when it does not
    divide); ``"params"``: the cut whose stage with the most parameters has the fewest (exact
    min-max over every contiguous cut); one cost per block (floats >= 0, e.g. measured ms):
    the least-bottleneck cut for those costs (both by
    :func:`~nobubble.pipeline.partition.stage_sizes`); a
    :class:`~nobubble.pipeline.plan.Plan` of these blocks: its ``stage_sizes()``
    (``num_stages`` must be their count). Bad input raises ValueError before any cut.
    """
    blocks = list(model)
    if not 1 <= num_stages <= len(blocks):
        raise ValueError(
            f"split_model: num_stages={num_stages} for {len(blocks)} blocks; use 1..{len(blocks)}"
        )
    if isinstance(balance, Plan):
        sizes = balance.stage_sizes()
        if (len(sizes), sum(sizes)) != (num_stages, len(blocks)):
            raise ValueError(f"split_model: the plan cuts {sum(sizes)} blocks into {len(sizes)} "
                             f"stages, not {len(blocks)} into num_stages={num_stages}; pass the "
                             f"blocks it planned and num_stages={len(sizes)}")  # fmt: skip
        return _cut(blocks, sizes)
    costs: list[float] | None = None
    if isinstance(balance, str) and balance == "params":  # a block's cost: its parameters
        costs = [float(sum(p.numel() for p in b.parameters())) for b in blocks]
    elif isinstance(balance, Iterable) and not isinstance(balance, str):
        costs = [float(c) for c in balance]
    elif balance is not None:
        raise ValueError(f"split_model: balance={balance!r}; use None, 'params', a Plan or "
                         "one cost per block")  # fmt: skip
    return _cut(blocks, stage_sizes(len(blocks), num_stages, costs))


def _cut(blocks: list[nn.Module], sizes: Sequence[int]) -> list[nn.Module]:
    return [nn.Sequential(*blocks[r.start : r.stop]) for r in stage_ranges(sizes)]
