"""Profile the user's own stage modules for the simulator: T_F, T_B, T_W and memory per stage.

The stages run one after another in this process on one microbatch, each on the previous
stage's real output (detached), exactly as :class:`~nobubble.pipeline.runtime.runner.
PipelineRunner` runs them: F inside :class:`~nobubble.pipeline.runtime.autosplit.ModuleSplit`
recording, B its ``backward_input``, W its ``backward_weight``, and the fused backward as one
plain autograd walk for comparison. The first stage's input needs no gradient (its B has
nothing to compute) and is recorded unsplit, as the runner records it. Every stage but the
last gets a random output gradient of its output's shape. Times are medians of ``repeats``
rounds after ``warmup`` (ms, by the wall clock or this thread's CPU time); ``mem_f`` counts
the distinct tensors autograd saves in F (parameters excluded; counted in one more, untimed
round, since the hook that counts them slows F), ``mem_w`` what stays held after B (here:
the graph W walks, so ``mem_f`` unless the stage has only linears). The result is the same
:class:`~nobubble.pipeline.runtime.profile.Profile` the built-in models produce, so
``profile.cost_model()`` feeds :func:`~nobubble.pipeline.simulate.simulate` and ``pp plan``.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from nobubble.pipeline.runtime.autosplit import ModuleSplit
from nobubble.pipeline.runtime.profile import Profile, StageProfile, op_clock

__all__ = ["profile_modules"]


def profile_modules(
    stages: Sequence[nn.Module],
    inputs: Any,
    targets: Any,
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
    *,
    repeats: int = 5,
    warmup: int = 1,
    t_comm: float = 0.0,
    clock: str = "wall",
) -> Profile:
    """Per-stage costs of ``stages`` on one microbatch (``inputs`` for stage 0, ``targets``
    for the loss); ``t_comm`` (ms) is taken as given (measure it with :func:`~nobubble.
    pipeline.runtime.profile.measure_comm` on real ranks)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"profile_modules: repeats={repeats} must be >= 1, warmup={warmup} >= 0")
    device = next((p.device for m in stages for p in m.parameters()), torch.device("cpu"))
    now = op_clock(clock, device)
    gen = torch.Generator().manual_seed(2)
    x: Any = inputs
    profiles, act_bytes = [], 0
    for s, module in enumerate(stages):
        last = s == len(stages) - 1
        args = x if isinstance(x, tuple) else (x,)
        with torch.no_grad():
            y = module(*args)
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"stage {s}'s output is a {type(y).__name__}; a stage returns a tensor")
        dy = None if last else torch.randn(y.shape, generator=gen).to(y.device, y.dtype)
        profiles.append(_profile_one(s, module, args, targets if last else None, loss_fn, dy,
                                     now, repeats, warmup))  # fmt: skip
        if not last:
            act_bytes = max(act_bytes, y.numel() * y.element_size())
        x = y
    return Profile("user", _rows(inputs), tuple(profiles), t_comm, act_bytes, clock)


def _rows(inputs: Any) -> int:
    first = inputs[0] if isinstance(inputs, tuple) else inputs
    return int(first.shape[0])


def _profile_one(s, module, args, targets, loss_fn, dy, now, repeats, warmup) -> StageProfile:
    split = ModuleSplit(module)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    times: dict[str, list[float]] = {"f": [], "b": [], "w": [], "fused": []}
    mem_f = 0
    try:
        # pass -1 counts what F saves (a hook per saved tensor: not timed); the rest time
        for rep in range(-1, warmup + repeats):
            mb = rep + 1
            stage_in = _stage_input(args, grad=s > 0)
            saved: dict[int, int] = {}

            def pack(t: torch.Tensor, saved: dict[int, int] = saved) -> torch.Tensor:
                ptr = t.untyped_storage().data_ptr()
                if ptr not in params:
                    saved[ptr] = t.untyped_storage().nbytes()
                return t

            hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            t0 = now()
            with split.recording(mb, split=s > 0), hooks if rep < 0 else contextlib.nullcontext():
                out = _output(module, stage_in, targets, loss_fn)
            t1 = now()
            split.backward_input(mb, out, dy, stage_in[0] if stage_in[0].requires_grad else None)
            t2 = now()
            split.backward_weight(mb)
            t3 = now()
            plain_in = _stage_input(args, grad=s > 0)
            out = _output(module, plain_in, targets, loss_fn)
            t4 = now()
            out.backward(dy)
            t5 = now()
            if rep < 0:
                mem_f = sum(saved.values())
            elif rep >= warmup:
                for key, dt in (("f", t1 - t0), ("b", t2 - t1), ("w", t3 - t2), ("fused", t5 - t4)):
                    times[key].append(dt * 1e3)
    finally:
        split.close()
        module.zero_grad(set_to_none=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [(b + w) / f for b, w, f in zip(times["b"], times["w"], times["fused"], strict=True)]
    rep_ = split.report()
    only_linear = rep_ is not None and rep_.by_linear == rep_.num_params
    return StageProfile(
        stage=s, blocks=(s,), t_f=med["f"], t_b=med["b"], t_w=med["w"],
        t_bw_fused=med["fused"], mem_f=int(mem_f), mem_w=0 if only_linear else int(mem_f),
        bw_ratio=statistics.median(ratios),
    )  # fmt: skip


def _stage_input(args: tuple, *, grad: bool) -> tuple:
    """Fresh leaves for a stage's input; with ``grad`` (every stage but the first, as the
    runner has it) its float tensors need a gradient, as a received activation does."""
    return tuple(
        a.detach().requires_grad_(grad and a.is_floating_point()) if isinstance(a, torch.Tensor)
        else a for a in args
    )  # fmt: skip


def _output(module: nn.Module, args: tuple, targets: Any, loss_fn) -> torch.Tensor:
    y = module(*args)
    return y if targets is None else loss_fn(y, targets)
