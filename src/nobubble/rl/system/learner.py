"""The one learner of both producers: the policy, its Adam optimizer and its version; the
loss is a choice (:class:`~nobubble.rl.system.trainer.GroupLoss`,
:class:`~nobubble.rl.actor_learner.run.VTraceLoss`). After :meth:`Learner.join` it is one
of ``ctx.world_size`` learners, each on its own shard, combined by ``RunConfig.aggregation``
(:mod:`nobubble.rl.algo.aggregation`; ``docs/rl/system.md``): ``sync`` all-reduces the
gradients weighted by each shard's ``num_tokens`` (exactly one learner on the whole batch);
``async`` / ``staleness`` make learner 0 a parameter server; ``local-sgd`` averages the
parameters every H steps.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from nobubble.distributed import DistContext
from nobubble.rl.algo.aggregation import (
    LocalSGD,
    ParameterServer,
    VersionedInbox,
    all_reduce_gradients,
    broadcast_parameters,
    filled_grads,
    send_versioned,
)

__all__ = ["Learner", "Loss", "ShardGradients"]

BatchT = TypeVar("BatchT", contravariant=True)


@dataclass(frozen=True)
class ShardGradients:
    """What one loss evaluation leaves besides the ``.grad`` tensors."""

    staleness: list[int]  # per trained group, learner version - policy version (may be [])
    metrics: dict[str, float]  # loss terms and diagnostics
    num_tokens: int  # loss elements: the token mean's denominator, the ``sync`` weight
    token_staleness: dict[int, int] = field(default_factory=dict)  # lag -> tokens
    # async / staleness on learner 0: (learner, staleness, weight) of each gradient applied
    pushes: list[tuple[int, int, float]] = field(default_factory=list)


class Loss(Protocol[BatchT]):
    """A training objective: ``loss(model, batch, version) -> (scalar, ShardGradients)``
    on the current parameters; ``after_step(model, version)`` runs after every new version
    (e.g. to refresh a KL reference)."""

    def __call__(
        self, model: nn.Module, batch: BatchT, version: int
    ) -> tuple[torch.Tensor, ShardGradients]: ...

    def after_step(self, model: nn.Module, version: int) -> None: ...


LossT = TypeVar("LossT", bound=Loss[Any])


class Learner(Generic[LossT]):
    """Owns ``model`` (from here on), its Adam optimizer and the policy version (from 0).

    Args:
        model: the policy, an ``nn.Module`` (its parameters are trained in place).
        loss: the objective (see :class:`Loss`).
        lr, adam_eps: Adam's learning rate and epsilon.
        max_grad_norm: gradients are clipped to this global norm before every step.
        delay_s: extra seconds per new version (a slower learner for experiments).
    """

    def __init__(
        self,
        model: Any,
        loss: LossT,
        *,
        lr: float,
        max_grad_norm: float,
        adam_eps: float = 1e-8,
        delay_s: float = 0.0,
    ) -> None:
        self.model, self.loss = model, loss
        self.max_grad_norm, self.delay_s = max_grad_norm, delay_s
        self.optimizer: torch.optim.Optimizer = torch.optim.Adam(
            model.parameters(), lr=lr, eps=adam_eps
        )
        self.version = 0
        self.ctx: DistContext | None = None
        self.aggregation = "sync"
        self._server: ParameterServer | None = None
        self._local_sgd: LocalSGD | None = None
        self._params = [p for p in model.parameters() if p.requires_grad]

    def join(self, ctx: DistContext, aggregation: str, local_sgd_every: int = 1) -> None:
        """Become learner ``ctx.rank`` of ``ctx.world_size``: start from learner 0's
        parameters and combine gradients by ``aggregation`` (``RunConfig.aggregation``)."""
        self.ctx, self.aggregation = ctx, aggregation
        broadcast_parameters(self._params, ctx)  # every learner starts from learner 0's
        if aggregation in ("async", "staleness") and ctx.rank == 0:  # serves its own model
            self._server = ParameterServer(
                self._params,
                optimizer=self.optimizer,
                staleness_kind="inverse" if aggregation == "staleness" else "none",
            )
            # published version -> server version then (what a push was computed on)
            self._server_version_at = {self.version: 0}
        elif aggregation == "local-sgd":
            self._local_sgd = LocalSGD(self._params, sync_every=local_sgd_every, ctx=ctx)

    @property
    def pushes_gradients(self) -> bool:
        """A learner other than 0 in ``async`` / ``staleness``: it sends its gradient to
        learner 0 and never steps an optimizer (its version is the one it computed on)."""
        rank = 0 if self.ctx is None else self.ctx.rank
        return rank > 0 and self.aggregation in ("async", "staleness")

    def compute_gradients(self, batch: Any) -> ShardGradients:
        """Forward and backward of the loss on ``batch``: sets every ``.grad``."""
        loss, shard = self.loss(self.model, batch, self.version)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return shard

    def clip_gradients(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)

    def finish_step(self) -> None:
        """After new parameters: the delay, the version, the loss's ``after_step``."""
        if self.delay_s:
            time.sleep(self.delay_s)
        self.version += 1
        self.loss.after_step(self.model, self.version)

    def update(self, minibatches: Iterable[Any]) -> ShardGradients:
        """One optimizer step per minibatch (each aggregated over the learners), then one
        new version (none on a learner that :attr:`pushes_gradients`). Returns the
        minibatch's :class:`ShardGradients` (metrics averaged when there are several)."""
        if self.aggregation in ("async", "staleness"):
            (batch,) = minibatches  # a parameter server applies one batch per version
            if self.pushes_gradients:
                return self._push(batch)
            return self._serve(batch)
        shards = [self._step(batch) for batch in minibatches]
        self.finish_step()
        if self._local_sgd is not None:
            shards[-1].metrics["params_averaged"] = float(self._local_sgd.after_step())
        if len(shards) == 1:
            return shards[0]
        keys = shards[0].metrics
        mean = {k: sum(s.metrics[k] for s in shards) / len(shards) for k in keys}
        return ShardGradients([], mean, sum(s.num_tokens for s in shards))

    def _step(self, batch: Any) -> ShardGradients:
        shard = self.compute_gradients(batch)
        if self.aggregation == "sync" and self.ctx is not None:
            all_reduce_gradients(self._params, self.ctx, op="mean", weight=float(shard.num_tokens))
        self.clip_gradients()
        self.optimizer.step()
        return shard

    def _push(self, batch: Any) -> ShardGradients:
        """A learner other than 0: gradient on the weights it holds, sent to learner 0."""
        assert self.ctx is not None  # joined
        shard = self.compute_gradients(batch)
        self.clip_gradients()
        send_versioned(self.ctx, filled_grads(self._params), self.version, 0)
        return shard

    def _serve(self, batch: Any) -> ShardGradients:
        """Learner 0 in async / staleness: its own gradient and one push from every other
        learner, applied in arrival order; then one new version."""
        server, ctx = self._server, self.ctx
        assert server is not None and ctx is not None  # built by join for learner 0
        inbox = VersionedInbox(ctx, self._params, range(1, ctx.world_size))
        base = server.version
        shard = self.compute_gradients(batch)
        self.clip_gradients()
        own = [g.clone() for g in filled_grads(self._params)]  # a push overwrites .grad
        pushes: list[tuple[int, int, float]] = []  # (learner, staleness, weight) in order
        for item in inbox.arrived():  # what arrived while this learner computed goes first
            self._apply(item, pushes)
        self._apply((0, base, own), pushes)
        while len(pushes) < ctx.world_size:
            self._apply(inbox.get(), pushes)
        inbox.close()
        self.finish_step()
        self._server_version_at[self.version] = server.version
        lags = [s for _, s, _ in pushes]
        shard.metrics.update(
            push_staleness_max=float(max(lags)),
            push_staleness_mean=sum(lags) / len(lags),
            push_weight_mean=sum(w for _, _, w in pushes) / len(pushes),
        )
        return ShardGradients(
            shard.staleness, shard.metrics, shard.num_tokens, shard.token_staleness, pushes
        )

    def _apply(self, item: tuple[int, int, Any], pushes: list[tuple[int, int, float]]) -> None:
        """One push ``(learner, version, gradient)``: learner 0 gives a server version, the
        others the published version they computed on."""
        assert self._server is not None  # learner 0 in async / staleness
        learner, version, grads = item
        base = version if learner == 0 else self._server_version_at[version]
        res = self._server.push(grads, base)
        pushes.append((learner, res.staleness, res.weight))
