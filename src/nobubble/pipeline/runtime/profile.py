"""The one profiler: F, B, W, fused BW and memory of each module, timed on the runner's path.

:func:`profile_modules` runs modules one after another in this process on one microbatch,
each on the previous one's real output (detached), through
:class:`~nobubble.pipeline.runtime.autosplit.ModuleSplit` as the runner does; the first
module's input needs no gradient and is recorded unsplit. Every module but the last gets a
random output gradient; the last one's output goes to ``loss_fn(output, targets)``. Per
module: ``t_f``, ``t_b``, ``t_w`` (medians of ``repeats`` timed rounds after ``warmup``, by
the wall clock or, CPU only, this thread's CPU time), ``t_bw_fused`` (plain autograd
backward), ``mem_f`` (distinct tensors autograd saves in F, parameters excluded),
``mem_w`` (held after B), ``out_bytes`` (the output). :func:`measure_comm` gives ``t_comm``
(half a ping-pong round trip). Times in milliseconds, memory in bytes.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nobubble.distributed import DistContext
from nobubble.pipeline.actions import Op
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.runtime.autosplit import ModuleSplit
from nobubble.pipeline.runtime.hooks import ActionTiming
from nobubble.pipeline.runtime.models import ModelConfig, build_blocks, partition_blocks
from nobubble.pipeline.runtime.profile_data import Profile, StageProfile

__all__ = [
    "StageProfile", "Profile", "profile_modules", "profile_stages",
    "measure_comm", "comm_probe", "op_clock", "OpTimes", "costs_from_op_times",
]  # fmt: skip


CLOCKS = ("wall", "cpu")


def op_clock(name: str, device: torch.device) -> Callable[[], float]:
    """``wall``: time.perf_counter (on CUDA after synchronising the device, so a reading
    follows the kernels queued before it); ``cpu``: this thread's CPU time (CPU device only),
    which a busy shared machine does not inflate by descheduling the process."""
    if name not in CLOCKS:
        raise ValueError(f"clock={name!r}; choose one of {CLOCKS}")
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError(f"clock='cpu' measures CPU work; use clock='wall' on {device}")
        return time.thread_time
    if device.type == "cuda":

        def synced() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()

        return synced
    return time.perf_counter


def profile_modules(
    modules: Sequence[nn.Module],
    inputs: Any,
    targets: Any = None,
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor] | None = None,
    *,
    repeats: int = 5,
    warmup: int = 1,
    t_comm: float = 0.0,
    clock: str = "wall",
) -> Profile:
    """Costs of each of ``modules`` on one microbatch (``inputs``, a tensor or a tuple of
    positional arguments, for module 0; ``targets`` for ``loss_fn`` after the last), on the
    modules' own device. ``t_comm`` (ms) is taken as given (measure it with
    :func:`measure_comm` on real ranks). The modules keep their parameters; their ``.grad``
    is cleared afterwards.

    Raises:
        ValueError: no modules, ``repeats`` < 1 or ``warmup`` < 0, an unknown ``clock``, or a
            module whose output is not one tensor (all before any timing).
    """
    if len(modules) == 0:
        raise ValueError("profile_modules: no modules; pass the model as a list of modules")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"profile_modules: repeats={repeats} must be >= 1, warmup={warmup} >= 0")
    device = next((p.device for m in modules for p in m.parameters()), torch.device("cpu"))
    now = op_clock(clock, device)
    args = _to(inputs if isinstance(inputs, tuple) else (inputs,), device)
    stage_args, outputs = [], []
    with torch.no_grad():  # check every output before timing anything
        x = args
        for i, module in enumerate(modules):
            y = module(*x)
            if not isinstance(y, torch.Tensor):
                raise ValueError(f"profile_modules: block {i} ({type(module).__name__}) returns "
                                 f"a {type(y).__name__}, not one tensor; wrap it so that it "
                                 "returns its output tensor only")  # fmt: skip
            stage_args.append(x)
            outputs.append(y)
            x = (y,)
    gen = torch.Generator().manual_seed(2)
    if loss_fn is None:  # the last module gets a random output gradient: the loss <y, dy>
        targets, loss_fn = torch.randn(y.shape, generator=gen).to(device, y.dtype), _dot
    elif isinstance(targets, torch.Tensor):
        targets = targets.to(device)
    profiles = []
    for s, (module, x, y) in enumerate(zip(modules, stage_args, outputs, strict=True)):
        last = s == len(modules) - 1
        dy = None if last else torch.randn(y.shape, generator=gen).to(y.device, y.dtype)
        timed = _time_module(s, module, x, targets if last else None, loss_fn, dy, now,
                             repeats, warmup)  # fmt: skip
        profiles.append(replace(timed, out_bytes=y.numel() * y.element_size()))
    act = max((p.out_bytes for p in profiles[:-1]), default=0)
    return Profile("user", int(args[0].shape[0]), tuple(profiles), t_comm, act, clock)


def _to(args: tuple, device: torch.device) -> tuple:
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def _dot(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return (y * dy).sum()


def _time_module(s, module, args, targets, loss_fn, dy, now, repeats, warmup) -> StageProfile:
    """Module ``s`` through :class:`ModuleSplit`, as the runner runs stage ``s``."""
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
    report = split.report()
    only_linear = report is not None and report.by_linear == report.num_params
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


def profile_stages(
    model: ModelConfig,
    num_stages: int,
    *,
    microbatch_size: int,
    device: torch.device | str = "cpu",
    repeats: int = 5,
    warmup: int = 1,
    t_comm: float = 0.0,
    clock: str = "wall",
    threads: int | None = None,
    comm: bool = False,
    backend: str | None = None,
    timeout_s: float = 120.0,
) -> Profile:
    """:func:`profile_modules` on the built-in ``model`` split into ``num_stages`` stages,
    each an ``nn.Sequential`` of its blocks as ``pp run`` builds it, on a real microbatch,
    with ``threads`` intra-op threads (as each rank runs; restored after; None keeps the
    count). With ``comm`` and ``num_stages > 1``, ``t_comm`` is measured between 2 local
    ranks (``device``, ``backend``, ``timeout_s``) on stage 1's input for one microbatch;
    otherwise it is taken as given. ``pp profile`` and ``pp run``'s prediction profile here.

    Raises:
        ValueError: an impossible ``clock`` or a bad cut (before anything is built).
        RankFailure: a probe rank failed or did not answer within ``timeout_s``.
    """
    from nobubble.distributed import spawn
    from nobubble.pipeline.runtime.executor import boundary_shapes

    device = torch.device(device)
    op_clock(clock, device)  # an impossible clock fails before anything is built
    ranges = partition_blocks(model, num_stages)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        stages = [nn.Sequential(OrderedDict(build_blocks(model, r, device).items()))
                  for r in ranges]  # fmt: skip
        batch = model.make_batch(microbatch_size, seed=1, device=device)
        prof = profile_modules(stages, batch.inputs, batch.targets, model.loss, repeats=repeats,
                               warmup=warmup, clock=clock)  # fmt: skip
    finally:
        torch.set_num_threads(before)
    if comm and num_stages > 1:  # (microbatch_size, ...) into stage 1
        shape = (microbatch_size, *tuple(boundary_shapes(model, ranges, 1)[1])[1:])
        t_comm = spawn(comm_probe, 2, args=(shape,), backend=backend, device=str(device),
                       timeout_s=timeout_s)[0]  # fmt: skip
    named = tuple(replace(st, blocks=tuple(r)) for st, r in zip(prof.stages, ranges, strict=True))
    return replace(prof, model=model.name, stages=named, t_comm=t_comm)


def measure_comm(ctx: DistContext, shape: torch.Size, *, repeats: int = 10) -> float:
    """One-way time (ms) of one ``shape`` float32 tensor between ranks 0 and 1: half the
    median ping-pong round trip. Ranks >= 2 return at once; every rank gets the result."""
    buf = torch.zeros(shape, device=ctx.device)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        if ctx.rank == 0:
            dist.send(buf, 1, group=ctx.group)
            dist.recv(buf, 1, group=ctx.group)
        elif ctx.rank == 1:
            dist.recv(buf, 0, group=ctx.group)
            dist.send(buf, 0, group=ctx.group)
        if buf.is_cuda:  # NCCL returns once the transfer is queued: wait for it
            torch.cuda.synchronize(buf.device)
        times.append((time.perf_counter() - start) * 1e3 / 2)
    result = torch.tensor([statistics.median(times[1:])], dtype=torch.float64)
    dist.broadcast(result, 0, group=ctx.group)
    return float(result)


def comm_probe(ctx: DistContext, shape: tuple[int, ...], repeats: int = 10) -> float:
    """Module-level spawn target: :func:`measure_comm` for ``shape``."""
    return measure_comm(ctx, torch.Size(shape), repeats=repeats)


class OpTimes:
    """A :class:`~nobubble.pipeline.runtime.runner.PipelineRunner` observer that keeps every
    action's compute time (ms, wait excluded) per ``(op, stage)``: the costs of the run itself,
    for the simulator (:func:`costs_from_op_times`) or for re-planning."""

    def __init__(self) -> None:
        self.times: dict[tuple[str, int], list[float]] = {}

    def before(self, action) -> None:
        pass

    def after(self, timing: ActionTiming) -> None:
        key = (timing.action.op.value, timing.action.stage)
        self.times.setdefault(key, []).append((timing.end - timing.start) * 1e3)

    def medians(self) -> dict[tuple[str, int], float]:
        """``(op, stage) -> median ms`` of what this rank ran (merge ranks' dicts)."""
        return {k: statistics.median(v) for k, v in self.times.items()}

    def clear(self) -> None:
        self.times.clear()


def costs_from_op_times(
    medians: dict[tuple[str, int], float], num_stages: int, *, t_comm: float = 0.0
) -> CostModel:
    """A CostModel (ms; unit memory) from measured ``(op, stage) -> ms`` medians of every
    stage. A stage seen only with fused backwards gets ``t_bw`` and ``t_b = t_w = t_bw / 2``;
    one seen only split gets ``t_b``, ``t_w`` and no ``t_bw`` (a BW then costs T_B + T_W)."""
    t_f, t_b, t_w, t_bw = [], [], [], []
    for s in range(num_stages):
        if (Op.F.value, s) not in medians:
            raise ValueError(f"costs_from_op_times: no F time for stage {s}; merge every rank's")
        bw = medians.get((Op.BW.value, s))
        b, w = medians.get((Op.B.value, s)), medians.get((Op.W.value, s))
        if (b is None) != (w is None):
            raise ValueError(f"costs_from_op_times: stage {s} has a {'B' if w is None else 'W'} "
                             "time but no matching one; merge every rank's medians")  # fmt: skip
        if b is None or w is None:
            if bw is None:
                raise ValueError(f"costs_from_op_times: no backward time for stage {s}")
            b = w = bw / 2
        t_f.append(medians[(Op.F.value, s)])
        t_b.append(b)
        t_w.append(w)
        t_bw.append(bw if bw is not None else b + w)
    return CostModel(
        t_f=tuple(t_f), t_b=tuple(t_b), t_w=tuple(t_w), t_bw=tuple(t_bw), t_comm=t_comm,
        mem_f=(1.0,) * num_stages, mem_b=(0.5,) * num_stages, mem_w=(0.5,) * num_stages,
    )  # fmt: skip
