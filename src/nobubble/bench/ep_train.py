"""Train a small MoE-GPT for real with data x expert parallelism; check it against dense.

``R`` ranks form a ``dp x ep`` grid (:func:`~nobubble.moe.parallel.dp_ep_groups`); each FFN
is a MoE layer (DeepSeek-V3 routing, one shared expert, aux-loss-free bias) whose experts are
split over an expert-parallel row, and every rank trains on its own batch of the standard
library's docstrings. After :func:`~nobubble.moe.parallel.sync_gradients` a step equals one
process running every expert on all ranks' batches, which ``check_dense`` runs step for step
(:func:`dense_losses`). With redundant experts the layers are ``ReplicatedMoELayer`` s;
``rebalance_every = K`` re-places the replicas every ``K`` steps (online EPLB), which changes
where the model runs, never the losses. Imbalance per step, mean over MoE layers:
``rank_imbalance`` (max / mean rows a rank's experts received) and ``expert_imbalance`` (max
/ mean over every physical expert).

Shape legend: ``S`` steps, ``W`` ranks, ``B`` sequences per rank, ``T`` sequence length,
``L`` MoE layers, ``E`` logical experts, ``P`` physical experts per rank.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nobubble.bench.ep_config import STEP_S, TrainConfig
from nobubble.distributed import spawn
from nobubble.files import figure
from nobubble.moe import (
    Buffer,
    MoELayer,
    ReferenceMoE,
    dp_ep_groups,
    init_moe_weights,
    sync_gradients,
)
from nobubble.moe.balance.eplb import load_imbalance, rebalance_experts
from nobubble.moe.balance.load_stats import ExpertLoadStats
from nobubble.moe.balance.online import rebalance_online
from nobubble.moe.balance.replicated_layer import ReplicatedMoELayer
from nobubble.moe.layer import MoEWeights

__all__ = ["TrainConfig", "TrainReport", "MoEGPT", "make_batches", "loss_fn", "run_training",
           "run_with_progress", "dense_losses", "plot_report", "corpus", "DENSE_TOLERANCE",
           "STEP_S"]  # fmt: skip

DENSE_TOLERANCE = 1e-4
"""Largest ``|loss - dense loss|`` at the last step that counts as equal (fp32)."""


# -- the model --------------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-norm causal attention, then a MoE FFN: (B, T, H) -> (B, T, H)."""

    def __init__(self, hidden: int, num_heads: int, moe: nn.Module) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, num_heads, batch_first=True)
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.moe(self.ln2(x))


class MoEGPT(nn.Module):
    """Token + position embedding, ``num_layers`` blocks, a linear head: (B, T) -> (B, T, V).

    ``make_moe(weights)`` builds each block's MoE from its layer's full weights (the same on
    every rank and in the dense model, so all start identical).
    """

    def __init__(
        self, config: TrainConfig, vocab: int, make_moe: Callable[[MoEWeights], nn.Module]
    ) -> None:
        super().__init__()
        torch.manual_seed(config.seed)
        h = config.hidden
        self.tok, self.pos = nn.Embedding(vocab, h), nn.Embedding(config.seq_len, h)
        moes = [make_moe(layer_weights(config, i)) for i in range(config.num_layers)]
        self.blocks = nn.ModuleList(Block(h, config.num_heads, m) for m in moes)
        self.head = nn.Sequential(nn.LayerNorm(h), nn.Linear(h, vocab))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def moe_layers(self) -> list[Any]:
        return [block.moe for block in self.blocks]


def corpus() -> str:
    """Docstrings of a few standard-library modules and their members (about 100 KB)."""
    import collections
    import functools
    import itertools
    import json
    import pathlib
    import re

    parts = []
    for mod in (collections, functools, itertools, json, pathlib, re):
        parts.append(inspect.getdoc(mod) or "")
        parts += [inspect.getdoc(obj) or "" for _, obj in inspect.getmembers(mod)]
    return "\n".join(p for p in parts if p)


def make_batches(config: TrainConfig) -> tuple[int, torch.Tensor]:
    """The vocabulary size and every step's windows, ``(S, W, B, T + 1)`` int64 char ids."""
    text = corpus()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text])
    g = torch.Generator().manual_seed(config.seed + 1)
    c = config
    # one draw per step, so a longer run starts with the same batches as a shorter one
    high, shape = len(data) - c.seq_len - 1, (c.num_ranks, c.batch_size)
    start = torch.stack([torch.randint(0, high, shape, generator=g) for _ in range(c.num_steps)])
    offsets = torch.arange(c.seq_len + 1)
    return len(chars), data[start.unsqueeze(-1) + offsets]  # (S, W, B) -> (S, W, B, T + 1)


def layer_weights(config: TrainConfig, layer: int) -> MoEWeights:
    """Layer ``layer``'s MoE weights, the same in every process for the same seed."""
    return init_moe_weights(config.moe_config(), seed=config.seed * 100 + layer)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-character cross-entropy: logits (B, T, V), targets (B, T)."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- one rank ---------------------------------------------------------------------------------
def initial_phy2log(config: TrainConfig) -> torch.Tensor:
    """(E + redundant,) placement before any statistics: experts in order, or for equal loads."""
    e, ep = config.num_experts, config.expert_parallel
    if config.num_redundant == 0:
        return torch.arange(e)
    uniform = torch.ones(1, e, dtype=torch.float64)
    return rebalance_experts(uniform, e + config.num_redundant, 1, 1, ep).phy2log[0]


def _build_model(config: TrainConfig, vocab: int, buffer: Buffer) -> MoEGPT:
    moe = config.moe_config()
    if config.replicated:
        phy2log = initial_phy2log(config)
        return MoEGPT(config, vocab, lambda w: ReplicatedMoELayer(moe, w, buffer, phy2log))
    return MoEGPT(config, vocab, lambda w: MoELayer(moe, w, buffer))


def _physical_load(layer: Any) -> torch.Tensor:
    """(E or E + redundant,) rows per physical expert of this EP group in the last forward."""
    load = getattr(layer, "last_physical_load", None)  # a ReplicatedMoELayer's (E + redundant,)
    return layer.last_tokens_per_expert if load is None else load


def _global_loads(model: MoEGPT, grid: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's view of the step: ``(L, E)`` logical load summed over all ranks and
    ``(L, dp, P_total)`` physical load of each dp group (one all-gather over the world)."""
    layers = model.moe_layers()
    mine = torch.stack(
        [torch.cat([_physical_load(m).cpu(), m.last_tokens_per_expert.cpu()]) for m in layers]
    ).long()  # (L, P_total + E), the same on every rank of an EP group
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    groups = torch.stack(every[:: grid.ep])  # (dp, L, P_total + E): one row per dp group
    num_physical = mine.shape[1] - layers[0].config.num_experts
    logical = groups[..., num_physical:].sum(0)  # (L, E)
    return logical, groups[..., :num_physical].transpose(0, 1)  # (L, dp, P_total)


def _imbalance(physical: torch.Tensor, ep: int) -> tuple[float, float]:
    """Mean over layers of max / mean rank load and of max / mean physical-expert load."""
    num_layers, dp, total = physical.shape
    ranks = physical.reshape(num_layers, dp * ep, total // ep).sum(-1)  # (L, W)
    experts = physical.reshape(num_layers, -1)  # (L, dp * P_total)
    return float(load_imbalance(ranks).mean()), float(load_imbalance(experts).mean())


def _rank_train(ctx, config: TrainConfig, vocab: int, windows: torch.Tensor, progress: Any):
    """Train on this rank's batches; returns its losses, the imbalances and the rebalances."""
    ep = config.expert_parallel
    grid = dp_ep_groups(ctx.world_size // ep, ep, timeout_s=ctx.timeout_s)
    model = _build_model(config, vocab, Buffer(grid.ep_group, timeout_s=ctx.timeout_s))
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
    window = max(config.rebalance_every, 1)  # the loads since the last rebalance
    stats = ExpertLoadStats(num_logical_experts=config.num_experts,
                            num_layers=config.num_layers, window=window)  # fmt: skip
    names = ("losses", "rank_imbalance", "expert_imbalance", "rebalances")
    out: dict[str, list] = {name: [] for name in names}
    for step in range(config.num_steps):
        x, y = windows[step, ctx.rank, :, :-1], windows[step, ctx.rank, :, 1:]  # (B, T)
        loss = loss_fn(model(x), y)
        loss.backward()
        for layer in model.moe_layers():
            if isinstance(layer, ReplicatedMoELayer):
                layer.sync_replica_grads()  # each replica: its logical expert's gradient
        sync_gradients(model, grid.dp_group, grid.ep_group)
        opt.step()
        opt.zero_grad()
        logical, physical = _global_loads(model, grid)
        for layer, load in zip(model.moe_layers(), logical):
            layer.last_tokens_per_expert = load  # the whole world's load, as the dense model sees
            layer.update_expert_bias()
        for name, value in zip(names, (float(loss.detach()), *_imbalance(physical, ep))):
            out[name].append(value)  # losses, rank_imbalance, expert_imbalance
        stats.record(logical)
        if config.rebalance_every and (step + 1) % config.rebalance_every == 0:
            out["rebalances"] += _rebalance(model, opt, stats, step)
        if ctx.rank == 0 and progress is not None:
            progress.put(("training", step + 1, config.num_steps, out["losses"][-1]))
    return out


def _rebalance(model: MoEGPT, opt: torch.optim.Optimizer, stats: ExpertLoadStats, step: int):
    """Online EPLB on every layer for the window's world-wide loads (the same on every rank,
    so every dp group picks the same placement and expert gradients still sum correctly)."""
    average = stats.moving_average()  # (L, E)
    done = []
    for i, layer in enumerate(model.moe_layers()):
        result = rebalance_online(layer, opt, weight=average[i])
        done.append({"step": step + 1, "layer": i, "moved": result.num_moved,
                     "imbalance_before": result.imbalance_before,
                     "imbalance_after": result.imbalance_after})  # fmt: skip
    return done


# -- the dense reference ----------------------------------------------------------------------
def dense_losses(
    config: TrainConfig, vocab: int, windows: torch.Tensor, progress: Any = None
) -> list[float]:
    """The same training in one process: every expert, all ranks' batches together, fp32;
    each MoE is the token-by-token :class:`~nobubble.moe.reference_layer.ReferenceMoE`."""
    moe = config.moe_config()
    model = MoEGPT(config, vocab, lambda w: ReferenceMoE(moe, w))
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
    out = []
    for step in range(config.num_steps):
        batch = windows[step].reshape(-1, config.seq_len + 1)  # (W * B, T + 1)
        loss = loss_fn(model(batch[:, :-1]), batch[:, 1:])  # the mean over every rank's rows
        loss.backward()
        opt.step()
        opt.zero_grad()
        for layer in model.moe_layers():
            layer.update_expert_bias()
        out.append(float(loss.detach()))
        if progress is not None:
            progress.put(("dense reference", step + 1, config.num_steps, out[-1]))
    return out


# -- the run ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainReport:
    """What a run measured; per-step lists have ``num_steps`` entries."""

    config: TrainConfig
    dp: int
    """Data-parallel groups."""
    ep: int
    """Expert-parallel ranks per group."""
    vocab: int
    """Characters in the vocabulary."""
    losses: list[float]
    """Mean over ranks of each rank's batch loss (= the loss of all ranks' batches)."""
    rank_imbalance: list[float]
    """max / mean rows per rank, mean over MoE layers."""
    expert_imbalance: list[float]
    """max / mean rows per physical expert, mean over MoE layers."""
    rebalances: list[dict[str, Any]]
    """One entry per online rebalance and layer: step, layer, moved, imbalance before / after
    (of the window's loads under the old and the new placement)."""
    seconds: float
    """Wall time of the expert-parallel run (spawn included)."""
    dense_losses: list[float] | None = None
    """The dense single-process model's loss per step (``check_dense``)."""
    dense_abs_diff: list[float] | None = None
    """``|losses - dense_losses|`` per step."""

    @property
    def final_loss(self) -> float:
        return self.losses[-1]

    @property
    def rank_imbalance_second_half(self) -> float:
        """Mean of :attr:`rank_imbalance` over the later half of the steps."""
        late = self.rank_imbalance[len(self.rank_imbalance) // 2 :]
        return sum(late) / len(late)

    @property
    def dense_ok(self) -> bool | None:
        """Last-step loss within :data:`DENSE_TOLERANCE` of dense (None: not checked)."""
        return None if self.dense_abs_diff is None else self.dense_abs_diff[-1] <= DENSE_TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["final_loss"] = self.final_loss
        d["rank_imbalance_second_half"] = self.rank_imbalance_second_half
        if self.dense_abs_diff is not None:
            d["dense_max_abs_diff"] = max(self.dense_abs_diff)
            d["dense_last_abs_diff"] = self.dense_abs_diff[-1]
            d["dense_ok"] = self.dense_ok
        return d


def run_training(config: TrainConfig, *, progress: Any = None) -> TrainReport:
    """Spawn ``config.num_ranks`` gloo ranks, train, and (``check_dense``) train dense too.

    ``progress``: an optional queue from ``nobubble.distributed.worker_context()`` fed with
    ``(phase, done, total, loss)`` tuples by rank 0 and by the dense run.
    Raises :class:`~nobubble.distributed.RankFailure` when a rank fails or times out.
    """
    vocab, windows = make_batches(config)
    start = time.perf_counter()
    per_rank = spawn(_rank_train, config.num_ranks, args=(config, vocab, windows, progress),
                     timeout_s=config.timeout_s)  # fmt: skip
    seconds = time.perf_counter() - start
    steps, ranks = range(config.num_steps), config.num_ranks
    losses = [sum(r["losses"][s] for r in per_rank) / ranks for s in steps]
    first = per_rank[0]
    dense = dense_losses(config, vocab, windows, progress) if config.check_dense else None
    ep = config.expert_parallel
    return TrainReport(
        config=config, dp=ranks // ep, ep=ep, vocab=vocab, losses=losses,
        rank_imbalance=first["rank_imbalance"], expert_imbalance=first["expert_imbalance"],
        rebalances=first["rebalances"], seconds=seconds, dense_losses=dense,
        dense_abs_diff=None if dense is None else [abs(a - b) for a, b in zip(losses, dense)],
    )  # fmt: skip


def run_with_progress(config: TrainConfig, *, quiet: bool = False) -> TrainReport:
    """:func:`run_training` while a progress bar on stderr follows rank 0's steps (then the
    dense run's); ``quiet`` hides the bar."""
    from nobubble.bench.output import run_with_progress_bar

    return run_with_progress_bar(
        lambda updates: run_training(config, progress=updates),
        label=f"starting {config.num_ranks} ranks",
        total=config.num_steps,
        counter="step {task.completed}/{task.total}",
        info=lambda extra: f"loss {extra[0]:.4f}",
        quiet=quiet,
    )


def plot_report(report: TrainReport, path: str | Path) -> Path:
    """Loss (and the dense loss) and rank / expert imbalance against step (PNG or SVG)."""
    from matplotlib.ticker import MaxNLocator

    steps = list(range(1, len(report.losses) + 1))
    c = report.config
    with figure(path, 1, 2, figsize=(10, 3.6)) as (fig, (ax1, ax2)):
        ax1.plot(steps, report.losses, label=f"expert parallel ({report.dp} dp x {report.ep} ep)")
        if report.dense_losses is not None:
            ax1.plot(steps, report.dense_losses, ls="--", label="dense, one process")
        ax1.set_ylabel("loss (cross-entropy)")
        ax2.plot(steps, report.rank_imbalance, label="ranks")
        ax2.plot(steps, report.expert_imbalance, label="physical experts")
        for r in report.rebalances:
            if r["layer"] == 0:
                ax2.axvline(r["step"] + 0.5, color="0.7", lw=1, ls=":")
        ax2.set_ylabel("max / mean load")
        for ax in (ax1, ax2):
            ax.legend(fontsize=8)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.suptitle(
            f"MoE-GPT, {c.num_experts} experts + {c.num_redundant} redundant, top-{c.topk}, "
            f"rebalance every {c.rebalance_every or '-'} steps",
            fontsize=10,
        )
    return Path(path)
