"""The optimizer step without its bubble: step first, check the global condition after.

:meth:`PostValidatedOptimizer.step` starts the all-reduce of (sum of squared gradients,
count of non-finite values) without waiting, keeps a copy of the parameters and optimizer
state, and steps with the unclipped gradients; :meth:`PostValidatedOptimizer.confirm` waits
for the global numbers and, when the step was wrong, restores the copy bit for bit and redoes
it (gradients scaled by ``max_norm / norm``, or no step when a value is not finite). The
result equals :func:`synchronous_step`'s exactly. ``confirm`` must run before the parameters
are used again and before the gradients are zeroed; as a runner hook
(:meth:`PostValidatedOptimizer.before_step`, the result in ``post.last``) the runner does
both at the start of every step. Memory: one parameter set plus one optimizer state.

::

    post = PostValidatedOptimizer(optimizer, params, max_norm=1.0)
    runner = PipelineRunner(stages, schedule, loss_fn, hooks=[post])
    for x, y in data:
        runner.step(x, y)  # first: confirm the last step, zero the gradients
        post.step()        # steps at once; the global check travels meanwhile
    post.confirm()
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from nobubble.validation import finite

__all__ = ["PostValidatedOptimizer", "ValidationResult", "synchronous_step", "gradient_stats"]


@dataclass(frozen=True)
class ValidationResult:
    """What :meth:`PostValidatedOptimizer.confirm` found and did.

    Attributes:
        grad_norm: the global gradient norm (inf when a value was not finite).
        finite: every gradient value on every rank was finite.
        action: ``"kept"`` (the optimistic step stands), ``"clipped"`` (rolled back and
            stepped again with clipped gradients) or ``"skipped"`` (rolled back, no step).
    """

    grad_norm: float
    finite: bool
    action: str


def gradient_stats(params: list[nn.Parameter]) -> torch.Tensor:
    """``[2]`` float64: this rank's sum of squared gradients, and its non-finite count."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:  # on the parameters' device: NCCL all-reduces device tensors only
        device = params[0].device if params else torch.device("cpu")
        return torch.zeros(2, dtype=torch.float64, device=device)
    squares = torch.stack([g.detach().double().square().sum() for g in grads]).sum()
    bad = torch.stack([(~torch.isfinite(g.detach())).sum() for g in grads]).sum().double()
    return torch.stack([squares, bad])


def _decide(stats: torch.Tensor, max_norm: float | None) -> tuple[float, bool, float | None]:
    """(norm, finite, clip coefficient or None) from the all-reduced stats."""
    finite = float(stats[1]) == 0.0
    norm = math.sqrt(float(stats[0])) if finite else math.inf
    if finite and max_norm is not None and norm > max_norm:
        return norm, True, max_norm / (norm + 1e-6)  # torch's clip_grad_norm_ coefficient
    return norm, finite, None


def _scale_grads(params: list[nn.Parameter], coef: float) -> None:
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)


def synchronous_step(
    optimizer: torch.optim.Optimizer,
    params: Iterable[nn.Parameter],
    *,
    max_norm: float | None,
    group: dist.ProcessGroup | None = None,
) -> ValidationResult:
    """The reference: all-reduce the gradient stats, wait, then clip / skip / step."""
    params = list(params)
    stats = gradient_stats(params)
    dist.all_reduce(stats, group=group)
    norm, finite, coef = _decide(stats, max_norm)
    if not finite:
        return ValidationResult(norm, False, "skipped")
    if coef is not None:
        _scale_grads(params, coef)
    optimizer.step()
    return ValidationResult(norm, True, "clipped" if coef is not None else "kept")


class PostValidatedOptimizer:
    """Wrap ``optimizer`` so that its step need not wait for the global gradient check.

    Args:
        optimizer: any ``torch.optim`` optimizer over (a superset of) ``params``.
        params: the parameters whose gradients are checked (this rank's).
        max_norm: clip the global gradient norm to this (None: only the NaN/inf check).
        group: the ranks that share one global norm (None: the default group).
        timeout_s: the longest :meth:`confirm` waits for the all-reduce.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        params: Iterable[nn.Parameter],
        *,
        max_norm: float | None = None,
        group: dist.ProcessGroup | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        if max_norm is not None and not (finite(max_norm) and max_norm > 0):
            raise ValueError(f"PostValidatedOptimizer: max_norm={max_norm} must be > 0 (or None)")
        if not timeout_s > 0:
            raise ValueError(f"PostValidatedOptimizer: timeout_s={timeout_s} must be > 0")
        self.optimizer, self.params = optimizer, list(params)
        self.max_norm, self.group, self.timeout_s = max_norm, group, float(timeout_s)
        self._pending: tuple[dist.Work, torch.Tensor, dict] | None = None
        self.last: ValidationResult | None = None
        """What the runner's :meth:`before_step` confirmed last (None before that)."""

    def before_step(self, runner: object) -> None:
        """The runner hook (:class:`~nobubble.pipeline.runtime.hooks.StepHook`): confirm the
        pending step, if any, into :attr:`last`, then zero the gradients (set to None)."""
        if self._pending is not None:
            self.last = self.confirm()
        self.optimizer.zero_grad(set_to_none=True)

    def after_step(self, runner: object) -> None:
        """The runner hook's end of step: nothing (the loop calls :meth:`step`)."""

    def step(self) -> None:
        """Start the global check, keep a copy, and step with the gradients as they are."""
        if self._pending is not None:
            raise RuntimeError("PostValidatedOptimizer.step: confirm() the previous step first")
        stats = gradient_stats(self.params)
        work = dist.all_reduce(stats, group=self.group, async_op=True)
        assert work is not None
        copy = self._copy()
        self.optimizer.step()
        self._pending = (work, stats, copy)

    def confirm(self) -> ValidationResult:
        """Wait for the global numbers; roll the step back and redo it if they require."""
        if self._pending is None:
            raise RuntimeError("PostValidatedOptimizer.confirm: no step() to confirm")
        work, stats, copy = self._pending
        self._pending = None
        try:
            if not work.wait(timeout=timedelta(seconds=self.timeout_s)):
                raise TimeoutError(f"the gradient check's all-reduce took over {self.timeout_s:g}s")
        except BaseException:  # unchecked: put the step back before the error goes up
            self._restore(copy)
            raise
        norm, finite, coef = _decide(stats, self.max_norm)
        if finite and coef is None:
            return ValidationResult(norm, True, "kept")
        self._restore(copy)
        if not finite:
            return ValidationResult(norm, False, "skipped")
        _scale_grads(self.params, coef)  # type: ignore[arg-type]  # coef is set: clipping
        self.optimizer.step()
        return ValidationResult(norm, True, "clipped")

    def _copy(self) -> dict:
        """The parameters and every optimizer state value, as they are before the step."""
        return {
            "params": [p.detach().clone() for p in self._all_params()],
            "state": {
                id(p): {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in st.items()}
                for p, st in self.optimizer.state.items()
            },
        }

    def _restore(self, copy: dict) -> None:
        with torch.no_grad():
            for p, saved in zip(self._all_params(), copy["params"], strict=True):
                p.copy_(saved)
        by_id = {id(p): p for p in self._all_params()}
        for pid, saved_state in copy["state"].items():
            state = self.optimizer.state[by_id[pid]]
            for k, v in saved_state.items():
                if isinstance(v, torch.Tensor) and isinstance(state.get(k), torch.Tensor):
                    state[k].copy_(v)
                else:
                    state[k] = v
        for p in list(self.optimizer.state):  # state that the optimistic step created
            if id(p) not in copy["state"]:
                del self.optimizer.state[p]

    def _all_params(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]
