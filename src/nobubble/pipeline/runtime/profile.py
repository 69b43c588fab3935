"""Measure what the simulator needs: per-stage T_F, T_B, T_W, T_comm and activation memory.

Each stage of a model split into ``num_stages`` stages is run alone on this process with a
microbatch of the real shape (stage 0 gets real tokens/features, later stages a random
activation of their input shape, every stage but the last a random output gradient):

- ``t_f``, ``t_b``, ``t_w``: medians of ``repeats`` timed F, B (input gradient) and W
  (deferred weight gradient) after ``warmup`` untimed rounds, by the wall clock or (CPU
  only, ``clock="cpu"``) by this thread's CPU time, which other processes on a shared
  machine do not inflate;
- ``t_bw_fused``: the median of plain autograd backward of the same stage (no split), the
  baseline that T_B + T_W is compared with;
- ``mem_f``: bytes autograd saves in F; ``mem_w``: bytes W keeps after B (X and dY of the
  linears); ``mem_b = mem_f - mem_w`` is what B frees (see :mod:`.memory`).

``t_comm`` is the one-way time of one boundary activation between two ranks, measured by
:func:`measure_comm` (ping-pong over the real process group, half the round trip).
Times are in milliseconds, memory in bytes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from nobubble.distributed import DistContext
from nobubble.pipeline.actions import Op, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.runtime.bw_split import attach_store
from nobubble.pipeline.runtime.memory import ActivationMeter
from nobubble.pipeline.runtime.models import ModelConfig, build_blocks, partition_blocks
from nobubble.pipeline.runtime.runner import ActionTiming
from nobubble.pipeline.runtime.stage import PipelineStage

__all__ = [
    "StageProfile", "Profile", "profile_stages", "measure_comm", "comm_probe", "op_clock",
    "OpTimes", "costs_from_op_times",
]  # fmt: skip


@dataclass(frozen=True)
class StageProfile:
    """Measured costs of one stage for one microbatch (ms, bytes)."""

    stage: int
    blocks: tuple[int, ...]
    t_f: float
    t_b: float
    t_w: float
    t_bw_fused: float
    mem_f: int
    mem_w: int
    bw_ratio: float
    """Median over repeats of (T_B + T_W) / fused backward, each pair timed back to back (a
    load burst on a shared machine hits both sides of a pair alike)."""

    @property
    def mem_b(self) -> int:
        return max(self.mem_f - self.mem_w, 0)

    @property
    def split_overhead(self) -> float:
        """(T_B + T_W) / fused backward - 1 (paired median, see ``bw_ratio``)."""
        return self.bw_ratio - 1.0


@dataclass(frozen=True)
class Profile:
    """A model's measured per-stage costs and the inter-rank transfer time."""

    model: str
    microbatch_size: int
    stages: tuple[StageProfile, ...]
    t_comm: float
    activation_bytes: int
    clock: str = "wall"
    """How op times were taken: ``wall`` or ``cpu`` (thread CPU time)."""

    def cost_model(self, schedule: Schedule | None = None, *, recompute: bool = False) -> CostModel:
        """The simulator's per-stage costs (ms, bytes), the fused backward's measured time
        included. ``schedule`` must have as many stages as were profiled (profile with the
        schedule's ``num_stages``). ``recompute``: under activation checkpointing, each F
        keeps one boundary activation (``activation_bytes``) and each B runs F again."""
        if schedule is not None and schedule.num_stages != len(self.stages):
            raise ValueError(
                f"profile has {len(self.stages)} stages but schedule {schedule.name!r} has "
                f"{schedule.num_stages}; profile the model in {schedule.num_stages} stages"
            )
        st = self.stages
        costs = CostModel(
            t_f=tuple(s.t_f for s in st), t_b=tuple(s.t_b for s in st),
            t_w=tuple(s.t_w for s in st), t_comm=self.t_comm,
            mem_f=tuple(float(s.mem_f) for s in st), mem_b=tuple(float(s.mem_b) for s in st),
            mem_w=tuple(float(s.mem_f - s.mem_b) for s in st),
            t_bw=tuple(s.t_bw_fused for s in st),  # what a fused BW really takes
        )  # fmt: skip
        return costs.with_recompute(float(self.activation_bytes)) if recompute else costs

    def to_dict(self) -> dict:
        d = asdict(self)
        for s, st in zip(d["stages"], self.stages, strict=True):
            s["mem_b"] = st.mem_b
            s["split_overhead"] = st.split_overhead
        return d

    @staticmethod
    def from_dict(d: dict) -> Profile:
        skip = ("mem_b", "split_overhead")
        stages = tuple(
            StageProfile(**{
                "bw_ratio": (s["t_b"] + s["t_w"]) / s["t_bw_fused"],  # files without it
                **{k: v for k, v in s.items() if k not in skip},
                "blocks": tuple(s["blocks"]),
            })
            for s in d["stages"]
        )  # fmt: skip
        return Profile(
            model=d["model"],
            microbatch_size=int(d["microbatch_size"]),
            stages=stages,
            t_comm=float(d["t_comm"]),
            activation_bytes=int(d["activation_bytes"]),
            clock=str(d.get("clock", "wall")),
        )


def profile_stage(
    model: ModelConfig,
    blocks_range: range,
    *,
    stage_index: int,
    num_stages: int,
    microbatch_size: int,
    input_shape: torch.Size | None,
    output_shape: torch.Size | None,
    device: torch.device | str = "cpu",
    repeats: int = 5,
    warmup: int = 1,
    clock: str = "wall",
) -> StageProfile:
    """Time F, B, W and the fused backward of one stage; measure its activation memory.

    ``input_shape`` / ``output_shape``: the stage's activation shapes (None for the model
    input of stage 0 / the loss of the last stage).
    """
    device = torch.device(device)
    now = op_clock(clock, device)
    blocks = build_blocks(model, blocks_range, device)
    batch = model.make_batch(microbatch_size, seed=1, device=device)
    gen = torch.Generator().manual_seed(2)
    x = batch.inputs if input_shape is None else torch.randn(input_shape, generator=gen).to(device)
    dy = None if output_shape is None else torch.randn(output_shape, generator=gen).to(device)
    targets = batch.targets if output_shape is None else None
    meter = ActivationMeter(blocks)
    stage = PipelineStage(
        stage_index=stage_index, num_stages=num_stages, blocks=blocks,
        loss_fn=model.loss, num_microbatches=1, meter=meter,
    )  # fmt: skip
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {"f": [], "b": [], "w": [], "fused": []}
    mem_f = mem_w = 0
    for rep in range(warmup + repeats):
        attach_store(blocks, stage.store)
        t0 = now()
        stage.forward(0, x, targets)
        sync()
        t1 = now()
        mem_f = meter.live_bytes
        stage.backward_input(0, dy)
        sync()
        t2 = now()
        mem_w = meter.live_bytes
        stage.backward_weight(0)
        sync()
        t3 = now()
        attach_store(blocks, None)  # plain autograd: the fused baseline
        out = _plain_forward(blocks, x, model, targets)
        sync()
        t4 = now()
        out.backward(dy)
        sync()
        t5 = now()
        if rep >= warmup:
            for key, dt in (("f", t1 - t0), ("b", t2 - t1), ("w", t3 - t2), ("fused", t5 - t4)):
                times[key].append(dt * 1e3)
    attach_store(blocks, stage.store)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [(b + w) / f for b, w, f in zip(times["b"], times["w"], times["fused"], strict=True)]
    return StageProfile(
        stage=stage_index, blocks=tuple(blocks_range), t_f=med["f"], t_b=med["b"],
        t_w=med["w"], t_bw_fused=med["fused"], mem_f=int(mem_f), mem_w=int(mem_w),
        bw_ratio=statistics.median(ratios),
    )  # fmt: skip


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


def _plain_forward(blocks, x, model: ModelConfig, targets) -> torch.Tensor:
    y = x if not x.is_floating_point() else x.detach().requires_grad_(True)
    for b in blocks.values():
        y = b(y)
    return model.loss(y, targets) if targets is not None else y


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
) -> Profile:
    """Profile every stage of ``model`` split into ``num_stages`` stages on this process."""
    from nobubble.pipeline.runtime.executor import boundary_shapes

    ranges = partition_blocks(model, num_stages)
    shapes = boundary_shapes(model, ranges, microbatch_size)
    stages = tuple(
        profile_stage(
            model,
            r,
            stage_index=s,
            num_stages=num_stages,
            microbatch_size=microbatch_size,
            input_shape=shapes.get(s),
            output_shape=shapes.get(s + 1),
            device=device,
            repeats=repeats,
            warmup=warmup,
            clock=clock,
        )  # fmt: skip
        for s, r in enumerate(ranges)
    )
    act = max((torch.Size(v).numel() * 4 for v in shapes.values()), default=0)
    return Profile(model.name, microbatch_size, stages, t_comm, act, clock)


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
