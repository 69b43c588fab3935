"""``benchmarks/merge.py``: k-way merge against heapq.merge and the textbook merges
(docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, f, md_table, prose


@dataclass(frozen=True, kw_only=True)
class MergeRow(Record):
    """``k`` lists of ``n`` items in all: median seconds per method."""

    k: int
    n: int
    seconds: dict[str, float]
    kmerge_over_heapq: float
    merge_k_lists_over_heapq: float
    merge_k_lists_over_sorted: float


@dataclass(frozen=True, kw_only=True)
class MergeResult(Result):
    repeats: int
    results: list[MergeRow]


FILES = {"merge": MergeResult}

_METHODS = ("kmerge", "heapq_merge", "sorted_chain", "merge_k_lists", "merge_k_lists_pairwise")


def _size(n: int) -> str:
    """An item count: ``10^6`` for a power of ten from 10^6 on, else ``1,000``."""
    if n >= 10**6 and 10 ** (len(str(n)) - 1) == n:
        return f"10^{len(str(n)) - 1}"
    return f"{n:,}"


def merge_benchmark() -> str:
    """Median seconds per method, the two ratios to heapq.merge."""
    data = load_result(MergeResult, "merge")
    res = data.results
    table = md_table(
        ["k", "N", "kmerge", "heapq.merge", "sorted(chain)", "merge_k_lists", "pairwise",
         "kmerge / heapq.merge", "merge_k_lists / heapq.merge"],
        [[_size(r.k), _size(r.n), *(f(r.seconds[m], 3) for m in _METHODS),
          f(r.kmerge_over_heapq, 3), f(r.merge_k_lists_over_heapq, 2)] for r in res],
    )  # fmt: skip
    worst = max(r.kmerge_over_heapq for r in res)
    verdict = "meets" if worst <= 1.05 else "misses"
    note = (
        f"Median seconds of {data.repeats} runs. In this run `kmerge / heapq.merge` is at "
        f"most {f(worst, 3)}, which {verdict} the goal of <= 1.05."
    )
    return f"{table}\n\n{prose(note)}"


TABLES: dict[str, Renderer] = {"merge.benchmark": merge_benchmark}
