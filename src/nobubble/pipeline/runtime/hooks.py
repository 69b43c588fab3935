"""What :class:`~nobubble.pipeline.runtime.runner.PipelineRunner` calls besides the stages:
:class:`ActionObserver` (``observer=``) around every action, :class:`StepHook` (``hooks=``)
at the start of every step, before any message.

Order within one action: ``before(action)`` of each observer, the receive (waiting for the
input), the compute, ``after(timing)`` of each observer in the order given, then the send of
what the action produced. An observer's ``after`` is thus part of the op as the other ranks
see it: one that sleeps (:class:`StragglerObserver`) delays the output, and the observers
after it see the later end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from nobubble.pipeline.actions import Action
from nobubble.pipeline.dispatch.perturb import Straggler

if TYPE_CHECKING:
    from nobubble.pipeline.runtime.channel import MessageKey
    from nobubble.pipeline.runtime.runner import PipelineRunner

__all__ = ["ActionTiming", "ActionObserver", "StepHook", "StragglerObserver"]


@dataclass(frozen=True, slots=True)
class ActionTiming:
    """One action as rank ``rank`` ran it in step ``step`` (from 0; ``time.perf_counter``
    seconds): it waited for its input from ``wait_start`` to ``start`` and computed until
    ``end`` (its send is posted after the observers)."""

    action: Action
    wait_start: float
    start: float
    end: float
    message: tuple[MessageKey, int] | None
    """The message the action received and the group rank it came from; None if none."""
    rank: int = 0
    step: int = 0


@runtime_checkable
class ActionObserver(Protocol):
    """Called around every action of :meth:`PipelineRunner.step` (tracing, fault
    injection, straggler emulation). An exception from either method ends the step."""

    def before(self, action: Action) -> None: ...

    def after(self, timing: ActionTiming) -> None: ...


class StepHook(Protocol):
    """Called by :meth:`PipelineRunner.step` on every rank: :meth:`before_step` at the start
    of each step, before the batch is split and before any message (the user's optimizer
    step of the previous step is done: a hook may use collectives over the runner's group
    or :meth:`PipelineRunner.restage` it); :meth:`after_step` at its end, after the loss
    is known on every rank. An exception ends the step. A hook that is also an
    :class:`ActionObserver` is told about every action, after the runner's observers."""

    def before_step(self, runner: PipelineRunner) -> None: ...

    def after_step(self, runner: PipelineRunner) -> None: ...


class StragglerObserver:
    """A really slow rank: on ``straggler.rank``, in its active steps, each op takes
    ``straggler.factor`` times its compute time, as on a slower device.

    The simulator's :class:`~nobubble.pipeline.dispatch.perturb.Straggler` multiplies one
    rank's op durations; here :meth:`after` (which the runner calls before posting the op's
    send, the device synchronised) sleeps ``factor - 1`` times the op's compute time, so
    neighbours see the output as late as a device ``factor`` times slower would deliver it.
    Put it first among the observers, so that those after it (:class:`~.profile.OpTimes`,
    a tracer) measure the slowed op. A factor below 1 cannot speed an op up and sleeps
    nothing. Steps are the runner's (from 0).
    """

    def __init__(self, straggler: Straggler) -> None:
        self.straggler = straggler

    def before(self, action: Action) -> None:
        pass

    def after(self, timing: ActionTiming) -> None:
        slow = self.straggler
        if timing.rank != slow.rank or not slow.active(timing.step):
            return
        time.sleep(max(slow.factor - 1.0, 0.0) * (timing.end - timing.start))
