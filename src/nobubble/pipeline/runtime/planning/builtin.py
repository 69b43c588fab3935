"""Plan a built-in model (:mod:`~nobubble.pipeline.runtime.models`) through the one planner,
its cut pinned to the one ``pp run`` builds (:func:`builtin_cuts`; a schedule file carries
no cut): every schedule of the registry, with and without recompute, and the exact solver's,
weighed on that cut. The costs come from the model's blocks, each profiled once
(:func:`plan_builtin`, through :func:`~nobubble.pipeline.runtime.planning.plan_model` as a
model of the user's own), or from a stage profile (:func:`plan_from_profile`, ``pp profile
-o``), each stage a block; a two-chunk schedule sees each stage as two equal halves, the
boundary between them as large as the stage's input (the first stage's: its output).
:func:`make_plan` is ``pp plan``'s one call: the plan of whichever source it is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from nobubble.distributed.options import LaunchOptions
from nobubble.pipeline.plan import BlockCosts, Plan, plan_from_costs
from nobubble.pipeline.plan_inputs import chunks_of
from nobubble.pipeline.runtime.models import ModelConfig, build_blocks, partition_blocks
from nobubble.pipeline.runtime.planning.model import plan_model
from nobubble.pipeline.runtime.planning.probe import RuntimeCosts
from nobubble.pipeline.runtime.planning.train import UserModel
from nobubble.pipeline.runtime.profile import Profile
from nobubble.pipeline.schedules import SCHEDULE_NAMES

__all__ = ["builtin_cuts", "plan_builtin", "plan_from_profile"]


def builtin_cuts(model: ModelConfig, num_ranks: int) -> tuple[tuple[int, ...], ...]:
    """The cuts ``pp run`` builds: one stage per rank, and two where the model has the layers
    (each cut: the first block of every stage after the first).

    Raises:
        ValueError: the model has fewer layers than ``num_ranks``.
    """
    cuts = []
    for num_stages in (num_ranks, 2 * num_ranks):
        if num_stages > num_ranks and model.num_layers < num_stages:
            continue  # no two-chunk schedule for this model
        cuts.append(tuple(r.start for r in partition_blocks(model, num_stages)[1:]))
    return tuple(cuts)


def plan_builtin(
    model: ModelConfig,
    *,
    num_ranks: int,
    num_microbatches: int,
    microbatch_size: int,
    recompute: bool = False,
    memory_limit: float | None = None,
    ilp_time_limit_s: float | None = None,
    runtime: RuntimeCosts | None = None,
    device: str = "cpu",
    threads: int | None = None,
    clock: str = "wall",
    timeout_s: float = 120.0,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Every schedule on the cut ``pp run`` builds for ``model``, from its blocks' costs
    measured here on a batch of ``num_microbatches`` microbatches of ``microbatch_size``
    rows: the fastest predicted (no tolerance) whose peak fits ``memory_limit`` (bytes per
    rank). ``recompute``: also weigh each schedule with activation checkpointing. The other
    arguments are :func:`~nobubble.pipeline.runtime.planning.plan_model`'s.

    Raises:
        ValueError: fewer layers than ranks, an impossible ``clock``, or no schedule fits.
    """
    cuts = builtin_cuts(model, num_ranks)
    blocks = list(build_blocks(model, device=device).values())
    batch = model.make_batch(microbatch_size * num_microbatches, seed=1, device=device)
    return plan_model(
        blocks, batch.inputs, batch.targets, model.loss, num_ranks=num_ranks,
        num_microbatches=num_microbatches, memory_limit=memory_limit,
        schedules=_schedules(cuts, num_ranks), recompute="auto" if recompute else False,
        cuts=cuts, tolerance=0.0, ilp_time_limit_s=ilp_time_limit_s, runtime=runtime,
        device=device, threads=threads, clock=clock, timeout_s=timeout_s, progress=progress,
    )  # fmt: skip


def plan_from_profile(
    profile: Profile,
    *,
    num_ranks: int,
    num_microbatches: int,
    recompute: bool = False,
    memory_limit: float | None = None,
    ilp_time_limit_s: float | None = None,
    op_overhead_ms: float = 0.0,
) -> Plan:
    """Every schedule on the profiled stages (one per rank), as :func:`plan_builtin` weighs
    them, from a stage profile: its ``t_comm`` moves one boundary activation, and the first
    stage's input is taken as free to keep under recompute.

    Raises:
        ValueError: the profile has not ``num_ranks`` stages, or no schedule fits.
    """
    stages = profile.stages
    if len(stages) != num_ranks:
        raise ValueError(f"the profile has {len(stages)} stages but num_ranks is {num_ranks}; "
                         f"profile with {num_ranks} stages (pp profile --stages {num_ranks})")  # fmt: skip
    blocks = [half for k, b in enumerate(profile.block_costs())
              for half in _halves(b, stages[max(k - 1, 0)].out_bytes)]  # fmt: skip
    cuts = (tuple(range(2, 2 * num_ranks, 2)), tuple(range(1, 2 * num_ranks)))
    boundary = max((s.out_bytes for s in stages[:-1]), default=0)
    return plan_from_costs(
        blocks, num_ranks=num_ranks, num_microbatches=num_microbatches,
        schedules=SCHEDULE_NAMES, recompute="auto" if recompute else False,
        memory_limit=memory_limit, comm_ms_per_byte=profile.t_comm / boundary if boundary else 0.0,
        op_overhead_ms=op_overhead_ms, cuts=cuts, tolerance=0.0,
        ilp_time_limit_s=ilp_time_limit_s,
    )  # fmt: skip


def make_plan(
    *,
    num_ranks: int,
    num_microbatches: int | None,
    launch: LaunchOptions,
    profile: Profile | None = None,
    model: ModelConfig | None = None,
    user: UserModel | None = None,
    microbatch_size: int = 1,
    recompute: bool = False,
    memory_limit: float | None = None,
    ilp_time_limit_s: float | None = None,
    overhead_ms: float | None = None,
    clock: str = "wall",
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """The plan of the one source given: a stage ``profile`` (:func:`plan_from_profile`),
    a built-in ``model`` (:func:`plan_builtin`, measured on ``launch.local_device``; these two
    read ``recompute``) or the ``user``'s model (:func:`plan_model`: every microbatch count
    unless ``num_microbatches``, and both recompute choices; ``overhead_ms`` the runtime's
    cost per action, None: measured). ``memory_limit`` is bytes of peak activations per rank.
    Raises ValueError when not exactly one source is given or the planners refuse their
    inputs."""
    given = [
        n for n, v in (("profile", profile), ("model", model), ("user", user)) if v is not None
    ]
    if len(given) != 1:
        raise ValueError(f"make_plan: sources {given or 'none'}; give exactly one of profile, "
                         "model (a built-in model's config) or user (a UserModel)")  # fmt: skip
    common: dict[str, Any] = {"num_ranks": num_ranks, "num_microbatches": num_microbatches,
                              "memory_limit": memory_limit, "ilp_time_limit_s": ilp_time_limit_s}  # fmt: skip
    if profile is not None:
        return plan_from_profile(profile, recompute=recompute, **common)
    run: dict[str, Any] = {"threads": launch.threads_per_rank, "timeout_s": launch.timeout_s,
                           "clock": clock, "progress": progress}  # fmt: skip
    if model is not None:
        return plan_builtin(model, microbatch_size=microbatch_size, recompute=recompute,
                            device=launch.local_device, **common, **run)  # fmt: skip
    assert user is not None  # the one source
    runtime = RuntimeCosts(overhead_ms, 0.0) if overhead_ms is not None else None
    return plan_model([b.to(launch.local_device) for b in user.blocks], user.inputs,
                      user.targets, user.loss_fn, runtime=runtime, device=launch.device,
                      **common, **run)  # fmt: skip


def _schedules(cuts: Sequence[tuple[int, ...]], num_ranks: int) -> tuple[str, ...]:
    """The registry's schedules that run on one of ``cuts``."""
    have = {(len(c) + 1) // num_ranks for c in cuts}
    return tuple(n for n in SCHEDULE_NAMES if chunks_of(n) in have)


def _halves(block: BlockCosts, inner_bytes: float) -> tuple[BlockCosts, BlockCosts]:
    """``block`` as two equal halves; ``inner_bytes`` cross between them."""
    half = dataclasses.replace(
        block, forward=block.forward / 2, backward_input=block.backward_input / 2,
        backward_weight=block.backward_weight / 2, activation_bytes=block.activation_bytes / 2,
        backward_fused=None if block.backward_fused is None else block.backward_fused / 2,
        freed_by_backward_input=block.freed_by_backward_input / 2,
    )  # fmt: skip
    return dataclasses.replace(half, boundary_bytes=float(inner_bytes)), half
