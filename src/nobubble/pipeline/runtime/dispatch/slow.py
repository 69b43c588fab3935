"""A real straggler: one rank's ops take ``factor`` times their time, as on a slower device.

The simulator's :class:`~nobubble.pipeline.dispatch.perturb.Straggler` multiplies the
durations of one rank's ops; here that rank sleeps ``factor - 1`` times each op's own
compute time right after computing it and before posting its send, so its neighbours see
the output as late as a device ``factor`` times slower would deliver it, and the op's
measured time (:class:`~nobubble.pipeline.runtime.profile.OpTimes`) is the slowed one: the
simulation of the run with its own op times has the straggler in it.
"""

from __future__ import annotations

import time

import torch

from nobubble.pipeline.dispatch.perturb import Straggler

__all__ = ["straggle"]


def straggle(
    straggler: Straggler, rank: int, step: int, device: torch.device, start: float
) -> None:
    """On the straggler's rank, in its steps (``step`` from 0): sleep ``factor - 1`` times
    the time since ``start`` (``time.perf_counter``; the device synchronised first). A factor
    below 1 cannot speed an op up and sleeps nothing."""
    if straggler.rank != rank or not straggler.active(step):
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    time.sleep(max(straggler.factor - 1.0, 0.0) * (time.perf_counter() - start))
