"""``benchmarks/rl_replay.py``: the prioritized replay's sum tree against a linear sampler
(docs/rl/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, count, md_table, prose, times


@dataclass(frozen=True, kw_only=True)
class ReplayRow(Record):
    """One buffer capacity: median µs per sampling round of each sampler."""

    capacity: int
    sum_tree_us: float
    linear_us: float
    speedup: float


@dataclass(frozen=True, kw_only=True)
class RlReplay(Result):
    batch: int
    repeats: int
    results: list[ReplayRow]


FILES = {"rl_replay": RlReplay}


def _where(res: list[ReplayRow], preset: int) -> str:
    """Where the tree starts to win, and on which side the aggressive preset's buffer lies."""
    # smallest capacity from which the tree is faster at every larger capacity measured
    wins = [i for i in range(len(res)) if all(r.speedup > 1 for r in res[i:])]
    if not wins:
        return "In this run the flat array is faster at every capacity measured."
    if wins[0] == 0:
        return "In this run the tree is faster at every capacity measured."
    below, cross = res[wins[0] - 1].capacity, res[wins[0]].capacity
    if preset <= below:
        side = "where the flat array is faster"
    elif preset >= cross:
        side = "where the tree is faster"
    else:
        side = "between the two"
    hi = res[-1]
    return (
        f"In this run the flat array is faster up to {count(below)} items and the tree from "
        f"{count(cross)} on ({times(hi.speedup, 1)} faster at {count(hi.capacity)}); "
        f"the aggressive preset's {count(preset)}-sample buffer lies {side}."
    )


def replay() -> str:
    """Sum tree vs linear sampler, with the crossover below."""
    from nobubble.rl.system.config import RunConfig
    from nobubble.rl.system.config.presets import aggressive

    data = load_result(RlReplay, "rl_replay")
    res = sorted(data.results, key=lambda r: r.capacity)
    caption = (
        f"Median µs per round over {data.repeats} rounds, batch {data.batch}, "
        "both samplers timed round-robin in the same run:"
    )
    table = md_table(
        ["capacity", "sum tree µs", "linear µs", "speed-up"],
        [[count(r.capacity), count(r.sum_tree_us), count(r.linear_us), times(r.speedup, 1)]
         for r in res],
    )  # fmt: skip
    lo, hi = res[0], res[-1]
    growth = (
        f"From {count(lo.capacity)} to {count(hi.capacity)} items the tree's time grows "
        f"{times(hi.sum_tree_us / lo.sum_tree_us, 1)}, the baseline's "
        f"{times(hi.linear_us / lo.linear_us, 0)}."
    )
    cfg = aggressive(RunConfig(mode="fully-async"))  # its replay, in samples
    where = _where(res, cfg.replay.capacity * cfg.group_size)
    return f"{prose(caption)}\n\n{table}\n\n{prose(growth, where)}"


TABLES: dict[str, Renderer] = {"rl.replay": replay}
