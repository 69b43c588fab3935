"""Re-planning under a straggler that starts mid-run, on real local ranks (the run of
``benchmarks/pp_replan.py`` and ``nobubble demo``'s re-planning step): ``layers`` equal blocks
and a head, ZB-H1 with 8 microbatches; from step ``start`` on rank 1 runs ``factor`` times
slower, and a :class:`~nobubble.pipeline.runtime.elastic.Replanner` moves layers or not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nobubble.files import figure
from nobubble.validation import check_fields

__all__ = ["ReplanSetup", "ReplanHistory", "run_replan", "replan_rank", "plot_replan"]


@dataclass(frozen=True, kw_only=True)
class ReplanSetup:
    """One run (defaults: the demo's; the benchmark passes its own sizes)."""

    num_ranks: int = 2
    """Local gloo ranks, one pipeline stage each."""
    layers: int = 12
    """Equal blocks before the head."""
    width: int = 256
    """Block width."""
    batch: int = 256
    """Rows per step (8 microbatches)."""
    steps: int = 12
    """Optimizer steps."""
    start: int = 3
    """The first step at which rank 1 is slow."""
    factor: float = 3.0
    """Rank 1's slow-down from ``start`` on."""
    head_cost: float = 0.05
    """The head's cost relative to a block (it is a thin layer)."""
    replan: bool = True
    """Whether the :class:`Replanner` moves layers (``False``: the static cut, a baseline)."""
    timeout_s: float = 1800.0
    """Limit for the whole run."""

    def __post_init__(self) -> None:
        check_fields("ReplanSetup", self, ("num_ranks", "layers", "width", "batch", "steps"),
                     ">= 1", integer=True)  # fmt: skip
        check_fields("ReplanSetup", self, ("start",), ">= 0", integer=True)
        check_fields("ReplanSetup", self, ("factor", "head_cost", "timeout_s"), "> 0")


@dataclass(frozen=True)
class ReplanHistory:
    """Rank 0's view of one run, one entry per step: its time (ms) and the cut (blocks per
    rank, head included) it ran with; the steps after which the cut changed and what each
    switch cost (ms)."""

    step_ms: list[float]
    sizes: list[list[int]]
    replanned_at: list[int]
    replan_ms: list[float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def replan_rank(ctx: Any, setup: ReplanSetup) -> ReplanHistory:
    """One rank's run (spawned by :func:`run_replan`)."""
    import torch
    from torch import nn

    from nobubble.pipeline import get_schedule
    from nobubble.pipeline.dispatch.perturb import Straggler
    from nobubble.pipeline.runtime.elastic import Replanner
    from nobubble.pipeline.runtime.hooks import StragglerObserver
    from nobubble.pipeline.runtime.runner import PipelineRunner

    torch.set_num_threads(1)
    torch.manual_seed(0)
    body = [nn.Sequential(nn.Linear(setup.width, setup.width), nn.GELU())
            for _ in range(setup.layers)]  # fmt: skip
    schedule = get_schedule("zb-h1", num_ranks=ctx.world_size, num_microbatches=8)
    planner = Replanner([*body, nn.Linear(setup.width, 1)], schedule,
                        lambda params: torch.optim.Adam(params, lr=1e-3),
                        layer_costs=[1.0] * setup.layers + [setup.head_cost],
                        replan=setup.replan)  # fmt: skip
    straggler = StragglerObserver(Straggler(1, setup.factor, first_step=setup.start))
    runner = PipelineRunner(planner.stages(), schedule, nn.functional.mse_loss,
                            hooks=[planner], observer=straggler)  # fmt: skip
    data = torch.Generator().manual_seed(1)
    try:
        for _ in range(setup.steps):
            x = torch.randn(setup.batch, setup.width, generator=data)  # (batch, width)
            runner.step(x, x[:, :1])
            planner.optimizer.step()
            planner.optimizer.zero_grad(set_to_none=True)
    finally:
        runner.close()
    history = planner.history
    return ReplanHistory(
        step_ms=[r.step_ms for r in history],
        sizes=[list(r.sizes) for r in history],
        replanned_at=[r.step for r in history if r.replanned_to is not None],
        replan_ms=[r.replan_ms for r in history if r.replanned_to is not None],
    )


def run_replan(setup: ReplanSetup) -> ReplanHistory:
    """Spawn ``setup.num_ranks`` ranks, run :func:`replan_rank` on each; rank 0's history."""
    from nobubble.distributed import spawn

    return spawn(replan_rank, setup.num_ranks, args=(setup,), timeout_s=setup.timeout_s)[0]


def plot_replan(history: ReplanHistory, setup: ReplanSetup, path: Path) -> Path:
    """Step time against step, the straggler's start and each re-plan marked (PNG or SVG)."""
    with figure(path, figsize=(7, 3.2)) as (_, ax):
        ax.plot(range(len(history.step_ms)), history.step_ms, marker="o", color="tab:blue")
        for s in history.replanned_at:
            ax.axvline(s + 0.5, color="tab:blue", linestyle=":", label="re-planned")
        ax.axvline(setup.start - 0.5, color="grey", linestyle="--", label="rank 1 turns slow")
        ax.set_xlabel("step")
        ax.set_ylabel("step time (ms)")
        ax.set_title(f"layers per rank: {tuple(history.sizes[0])} -> {tuple(history.sizes[-1])}")
        ax.legend(loc="upper right", fontsize=8)
    return path
