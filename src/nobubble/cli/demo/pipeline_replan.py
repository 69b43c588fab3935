"""``nobubble demo`` step for re-planning: rank 1 turns 3x slow mid-run, layers move off it.

Two local gloo ranks train 12 blocks (``nn.Linear(256, 256)`` + GELU) and a head with ZB-H1
through :class:`~nobubble.pipeline.runtime.elastic.Replanner`; from step 3 rank 1
really runs 3 times slower. The step prints each step's time and cut, and draws step time
against step with the re-plan marked (``pipeline/replan_steps.png``).
"""

from __future__ import annotations

from pathlib import Path

from nobubble.cli.util import print_table

_START, _FACTOR = 3, 3.0


def _train(ctx, steps: int) -> list[tuple[int, float, tuple[int, ...], bool]]:
    import torch
    from torch import nn

    from nobubble.pipeline import get_schedule
    from nobubble.pipeline.dispatch.perturb import Straggler
    from nobubble.pipeline.runtime.elastic import Replanner
    from nobubble.pipeline.runtime.hooks import StragglerObserver
    from nobubble.pipeline.runtime.runner import PipelineRunner

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(12)]
    schedule = get_schedule("zb-h1", num_ranks=ctx.world_size, num_microbatches=8)
    replan = Replanner([*layers, nn.Linear(256, 1)], schedule,
                       lambda params: torch.optim.Adam(params, lr=1e-3),
                       layer_costs=[1.0] * 12 + [0.01])  # fmt: skip
    runner = PipelineRunner(replan.stages(), schedule, nn.functional.mse_loss, hooks=[replan],
                            observer=StragglerObserver(Straggler(1, _FACTOR, first_step=_START)))  # fmt: skip
    data = torch.Generator().manual_seed(1)
    try:
        for _ in range(steps):
            x = torch.randn(256, 256, generator=data)
            runner.step(x, x[:, :1])
            replan.optimizer.step()
            replan.optimizer.zero_grad(set_to_none=True)
    finally:
        runner.close()
    return [(r.step, r.step_ms, r.sizes, r.replanned_to is not None) for r in replan.history]


def run(out_dir: Path, quick: bool) -> list[Path]:
    from nobubble.distributed import spawn

    steps = 8 if quick else 12
    history = spawn(_train, 2, args=(steps,), timeout_s=300)[0]
    print_table(
        f"ZB-H1 on 2 ranks, rank 1 {_FACTOR:g}x slow from step {_START}",
        ["step", "step ms", "layers per rank", "re-planned after it"],
        [[s, f"{ms:.0f}", str(sizes), "yes" if moved else ""] for s, ms, sizes, moved in history],
    )
    png = Path(out_dir) / "pipeline" / "replan_steps.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    _plot(history, png)
    return [png]


def _plot(history: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot([h[0] for h in history], [h[1] for h in history], marker="o", color="tab:blue")
    for s, _, _, moved in history:
        if moved:
            ax.axvline(s + 0.5, color="tab:blue", linestyle=":", label="re-planned")
    ax.axvline(_START - 0.5, color="grey", linestyle="--", label="rank 1 turns slow")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"layers per rank: {history[0][2]} -> {history[-1][2]}")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
