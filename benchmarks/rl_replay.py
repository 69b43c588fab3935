"""Prioritized replay benchmark: sum tree (O(log n)) vs a linear cumsum sampler (O(n)).

One round = draw a batch of 256 with IS weights + write 256 new priorities, the learner's
loop in prioritized replay. The baseline keeps the priorities in a flat array and redoes
``cumsum`` + ``searchsorted`` every round (what ``numpy.random.choice(p=...)`` does). Both are
timed in the same run, round-robin, for growing capacities; the table reports median
microseconds per round and the speed-up. Writes benchmarks/results/rl_replay.json and
docs/img/rl_replay_scaling.png.

    python -m benchmarks.rl_replay [--quick] [--repeats R]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress

from benchmarks._common import time_interleaved, write_json
from benchmarks.records.rl_replay import RlReplay
from nobubble.bench.output import print_table
from nobubble.rl.algo import PrioritizedReplayBuffer

BATCH, ALPHA, BETA, EPS = 256, 0.6, 0.4, 1e-6
CAPACITIES = [10**3, 10**4, 10**5, 10**6]
IMG = Path(__file__).resolve().parent.parent / "docs" / "img" / "rl_replay_scaling.png"


class LinearSampler:
    """The obvious O(n) prioritized sampler over a flat array (the baseline)."""

    def __init__(self, priorities: np.ndarray, seed: int) -> None:
        self.leaves = (priorities + EPS) ** ALPHA
        self.rng = np.random.default_rng(seed)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        cdf = np.cumsum(self.leaves)
        idx = np.searchsorted(cdf, self.rng.random(n) * cdf[-1], side="right")
        probs = self.leaves[idx] / cdf[-1]
        weights = (probs / (self.leaves.min() / cdf[-1])) ** (-BETA)
        return idx, weights

    def update(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        self.leaves[idx] = (priorities + EPS) ** ALPHA


def bench(capacity: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(capacity)
    priorities = rng.exponential(size=capacity)
    tree = PrioritizedReplayBuffer(capacity, alpha=ALPHA, beta=BETA, eps=EPS, seed=0)
    tree.extend(range(capacity), priorities)
    linear = LinearSampler(priorities, seed=0)
    new = rng.exponential(size=BATCH)

    def tree_round() -> None:
        s = tree.sample(BATCH)
        tree.update_priorities(s.indices, new)

    def linear_round() -> None:
        idx, _ = linear.sample(BATCH)
        linear.update(idx, new)

    return time_interleaved({"sum_tree": tree_round, "linear": linear_round}, repeats)


def plot(rows: list[dict[str, float]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = [r["capacity"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.loglog(caps, [r["sum_tree_us"] for r in rows], "o-", label="sum tree (O(log n))")
    ax.loglog(caps, [r["linear_us"] for r in rows], "s--", label="cumsum baseline (O(n))")
    ax.set_xlabel("buffer capacity (samples)")
    ax.set_ylabel(f"µs per round (sample {BATCH} + update {BATCH})")
    ax.set_title("Prioritized replay: time per learner round")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    IMG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG, dpi=120)
    plt.close(fig)
    return IMG


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="capacities up to 10^5, fewer repeats")
    ap.add_argument("--repeats", type=int, default=None, help="rounds per method (default 51)")
    args = ap.parse_args()
    caps = CAPACITIES[:3] if args.quick else CAPACITIES
    repeats = args.repeats or (15 if args.quick else 51)
    rows = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(caps))
        for cap in caps:
            r = bench(cap, repeats)
            rows.append(
                {
                    "capacity": cap,
                    "sum_tree_us": r["sum_tree"] * 1e6,
                    "linear_us": r["linear"] * 1e6,
                    "speedup": r["linear"] / r["sum_tree"],
                }
            )
            progress.advance(task)
    print_table(
        f"prioritized replay, median µs per round (batch {BATCH}) over {repeats} rounds",
        ["capacity", "sum tree µs", "linear µs", "speed-up"],
        [
            [
                f"{r['capacity']:,}",
                f"{r['sum_tree_us']:.0f}",
                f"{r['linear_us']:.0f}",
                f"{r['speedup']:.1f}x",
            ]
            for r in rows
        ],
    )
    path = write_json("rl_replay", RlReplay, {"batch": BATCH, "repeats": repeats, "results": rows})
    print(f"wrote {path} and {plot(rows)}")


if __name__ == "__main__":
    main()
