"""k-way merge benchmark: kmerge vs heapq.merge vs sorted(chain), merge_k_lists vs both.

For each (k, N): k ascending runs of random floats, N items in all. Every method merges the
same inputs in the same run; the table reports median seconds over repeats and the ratios
the issue asks about (kmerge / heapq.merge must be <= 1.05). Writes
benchmarks/results/merge.json.

    python -m benchmarks.merge [--quick] [--repeats R]
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections import deque
from itertools import chain

from benchmarks._common import time_interleaved, write_json
from benchmarks.records.merge import MergeResult
from nobubble.algorithms.merge import from_list, kmerge, merge_k_lists, merge_k_lists_pairwise
from nobubble.bench.output import print_table

SIZES = [(10, 10**6), (1000, 10**6), (10**5, 10**6)]


def consume(it) -> None:
    deque(it, maxlen=0)


def make_runs(k: int, n: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    runs = [[] for _ in range(k)]
    for i in range(n):
        runs[i % k].append(rng.random())
    for r in runs:
        r.sort()
    return runs


def bench(k: int, n: int, repeats: int) -> dict[str, float]:
    runs = make_runs(k, n, seed=k)
    build = lambda: [from_list(r) for r in runs]  # noqa: E731 - fresh nodes for each run
    res = time_interleaved(
        {
            "kmerge": lambda: consume(kmerge(*runs)),
            "heapq_merge": lambda: consume(heapq.merge(*runs)),
            "sorted_chain": lambda: sorted(chain(*runs)),
            "merge_k_lists": merge_k_lists,
            "merge_k_lists_pairwise": merge_k_lists_pairwise,
        },
        repeats,
        setups={"merge_k_lists": build, "merge_k_lists_pairwise": build},
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 10^5 instead of 10^6")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sizes = [(k, n // 10) for k, n in SIZES] if args.quick else SIZES
    rows, out = [], []
    for k, n in sizes:
        r = bench(k, n, args.repeats)
        ratio_kh = r["kmerge"] / r["heapq_merge"]
        out.append(
            {
                "k": k,
                "n": n,
                "seconds": r,
                "kmerge_over_heapq": ratio_kh,
                "merge_k_lists_over_heapq": r["merge_k_lists"] / r["heapq_merge"],
                "merge_k_lists_over_sorted": r["merge_k_lists"] / r["sorted_chain"],
            }
        )
        rows.append(
            [
                f"{k:,}",
                f"{n:,}",
                r["kmerge"],
                r["heapq_merge"],
                r["sorted_chain"],
                r["merge_k_lists"],
                r["merge_k_lists_pairwise"],
                f"{ratio_kh:.3f}",
                f"{r['merge_k_lists'] / r['heapq_merge']:.2f}",
                f"{r['merge_k_lists'] / r['sorted_chain']:.2f}",
            ]
        )
    print_table(
        f"k-way merge, median seconds of {args.repeats} runs",
        [
            "k",
            "N",
            "kmerge",
            "heapq.merge",
            "sorted(chain)",
            "merge_k_lists",
            "pairwise",
            "kmerge/heapq",
            "lists/heapq",
            "lists/sorted",
        ],
        rows,
    )
    path = write_json("merge", MergeResult, {"repeats": args.repeats, "results": out})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
