"""The planner's inputs: the blocks' measured costs (:class:`BlockCosts`) and a stage's sums
of them (:func:`stage_costs`); every argument of :func:`~nobubble.pipeline.plan.plan_from_costs`
(and of :func:`~nobubble.pipeline.runtime.planning.plan`, which runs them before profiling)
refused with a message naming the value and the fix, before any search; and the cuts it
weighs (:func:`candidate_cuts`, or the pinned ones :func:`pinned_cuts` checks)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.partition import balanced_sizes, stage_ranges
from nobubble.pipeline.schedules import SCHEDULE_NAMES, V_SCHEDULES
from nobubble.validation import finite

__all__ = ["BlockCosts", "stage_costs", "check_inputs", "check_ranks", "schedule_names", "microbatch_counts", "pinned_cuts",
           "candidate_cuts", "sizes_from_cuts", "cuts_from_sizes", "chunks_of",
           "AUTO_SCHEDULES", "AUTO_TWO_CHUNK_SCHEDULES", "TWO_CHUNK_SCHEDULES", "BUILTIN_MODELS",
           "is_user_model", "absolute_spec", "MiB"]  # fmt: skip

MiB = 1 << 20
"""Bytes in a mebibyte: the unit in which ``pp``'s tables and ``--memory-limit-mib`` give
the planner's and the profiler's byte counts."""

TINY_MS = 1e-6
"""The simulator needs every op time > 0: the first stage's empty B, a parameterless W."""

AUTO_SCHEDULES = ("1f1b", "zb-h1", "zb-2p")
AUTO_TWO_CHUNK_SCHEDULES = ("interleaved-1f1b", "zb-v")
TWO_CHUNK_SCHEDULES = ("interleaved-1f1b", *V_SCHEDULES)
"""Two stages per rank: interleaved 1F1B (as the planner runs it) and the V schedules."""


@dataclass(frozen=True, slots=True)
class BlockCosts:
    """One block's costs for one microbatch, measured once (times in ms, memory in bytes)."""

    forward: float
    """F: the block's forward."""
    backward_input: float
    """B: the gradient of the block's input."""
    backward_weight: float
    """W: the gradients of the block's parameters."""
    activation_bytes: float
    """What F saves for the backward."""
    boundary_bytes: float
    """The block's output tensor: what crosses a cut placed after it."""
    backward_fused: float | None = None
    """A fused backward (B and W in one walk) as measured; None: ``B + W``."""
    freed_by_backward_input: float = 0.0
    """Of ``activation_bytes``, what B frees (the rest W frees); 0 when W walks the block's
    whole graph, as :func:`~nobubble.pipeline.runtime.profile.profile_modules` finds for most."""

    def __post_init__(self) -> None:
        for name in ("forward", "backward_input", "backward_weight", "activation_bytes",
                     "boundary_bytes", "backward_fused", "freed_by_backward_input"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not (finite(value) and value >= 0):
                raise ValueError(f"BlockCosts.{name}={value!r} must be finite and >= 0; "
                                 "pass the measured time (ms) or size (bytes)")  # fmt: skip
        if self.freed_by_backward_input > self.activation_bytes:
            raise ValueError(f"BlockCosts.freed_by_backward_input={self.freed_by_backward_input}"
                             f" exceeds activation_bytes={self.activation_bytes}; B can free "
                             "at most what F saved")  # fmt: skip

    @property
    def total_ms(self) -> float:
        """F + B + W: the block's weight in the min-bottleneck cut."""
        return self.forward + self.backward_input + self.backward_weight


def stage_costs(
    blocks: Sequence[BlockCosts],
    cuts: Sequence[int],
    *,
    first_stage_input_grad: bool = False,
    comm_ms_per_byte: float = 0.0,
    scale: float = 1.0,
    recompute: bool = False,
    input_bytes: float = 0.0,
    op_overhead_ms: float = 0.0,
) -> CostModel:
    """The simulator's per-stage costs of ``blocks`` cut at ``cuts``: sums of the blocks'.

    Args:
        first_stage_input_grad: False (token ids, the usual case): stage 0 computes no input
            gradient, so its B is empty and its W is its whole backward (B + W of its blocks),
            freeing all its activations.
        comm_ms_per_byte: ms per byte of a boundary transfer; the simulator has one transfer
            time, so the largest boundary tensor of the cut sets it.
        scale: microbatch rows / profiled rows; times and bytes scale linearly with it.
        recompute: every stage keeps only its input (``input_bytes`` for stage 0, the previous
            block's ``boundary_bytes`` otherwise) and B runs F again.
        op_overhead_ms: the runtime's fixed cost per action, added to every F, B, W and BW
            (not scaled: it does not grow with the rows).
    """
    sizes = sizes_from_cuts(cuts, len(blocks))
    assert min(sizes) >= 1, f"cuts {tuple(cuts)} leave a stage empty"
    fields: dict[str, list[float]] = {k: [] for k in ("t_f", "t_b", "t_w", "t_bw", "mem_f",
                                                      "mem_b", "mem_w", "kept")}  # fmt: skip
    for s, r in enumerate(stage_ranges(sizes)):
        held = blocks[r.start : r.stop]
        b = sum(x.backward_input for x in held) * scale
        w = sum(x.backward_weight for x in held) * scale
        fused = sum(x.backward_input + x.backward_weight if x.backward_fused is None
                    else x.backward_fused for x in held) * scale  # fmt: skip
        mem_f = sum(x.activation_bytes for x in held) * scale
        mem_b = sum(x.freed_by_backward_input for x in held) * scale
        if s == 0 and not first_stage_input_grad:  # nothing to B; W walks the whole backward
            b, w, mem_b = 0.0, b + w, 0.0
        o = op_overhead_ms
        fields["t_f"].append(max(sum(x.forward for x in held) * scale, TINY_MS) + o)
        fields["t_b"].append(max(b, TINY_MS) + o)
        fields["t_w"].append(max(w, TINY_MS) + o)
        fields["t_bw"].append(max(fused, TINY_MS) + o)
        fields["mem_f"].append(mem_f)
        fields["mem_b"].append(mem_b)
        fields["mem_w"].append(mem_f - mem_b)
        fields["kept"].append(
            (input_bytes if s == 0 else blocks[r.start - 1].boundary_bytes) * scale
        )
    boundary = max((blocks[c - 1].boundary_bytes for c in cuts), default=0.0) * scale
    kept = tuple(fields.pop("kept"))
    costs = CostModel(
        t_comm=comm_ms_per_byte * boundary, **{k: tuple(v) for k, v in fields.items()}
    )
    return costs.with_recompute(kept) if recompute else costs


def chunks_of(name: str) -> int:
    """Stages per rank of schedule ``name`` as the planner runs it: 2 or 1."""
    return 2 if name in TWO_CHUNK_SCHEDULES else 1


def check_inputs(num_blocks, num_ranks, batch_size, num_microbatches, microbatch_size,
                 schedules, recompute, memory_limit, comm_ms_per_byte, input_bytes,
                 op_overhead_ms, tolerance, *, ilp_time_limit_s=None):  # fmt: skip
    """Every argument of :func:`~nobubble.pipeline.plan.plan_from_costs` but the blocks,
    checked; returns the microbatch counts, schedule names and recompute flags to weigh."""
    check_ranks(num_ranks, num_blocks)
    names = schedule_names(schedules, num_ranks, num_blocks)
    counts = microbatch_counts(num_ranks, batch_size, num_microbatches)
    if len(counts) > 1 and batch_size is not None and microbatch_size is None:
        raise ValueError(f"plan: {len(counts)} microbatch counts {counts} to weigh but no "
                         "microbatch_size; give the rows the block costs were measured at, "
                         "or one num_microbatches")  # fmt: skip
    if len(counts) > 1 and batch_size is None:
        raise ValueError(f"plan: microbatch counts {counts} without batch_size cannot be "
                         "compared (each count would be a different batch); give batch_size "
                         "and microbatch_size, or one num_microbatches")  # fmt: skip
    if microbatch_size is not None and not (isinstance(microbatch_size, int)
                                            and microbatch_size >= 1):  # fmt: skip
        raise ValueError(f"plan: microbatch_size={microbatch_size!r} must be an integer >= 1")
    if recompute not in (True, False, "auto"):
        raise ValueError(f"plan: recompute={recompute!r}; use False, True or 'auto'")
    flags = (False, True) if recompute == "auto" else (bool(recompute),)
    if memory_limit is not None and not (finite(memory_limit) and memory_limit > 0):
        raise ValueError(f"plan: memory_limit={memory_limit!r} must be > 0 bytes per rank; "
                         "pass None for no limit")  # fmt: skip
    for label, value in (("comm_ms_per_byte", comm_ms_per_byte), ("input_bytes", input_bytes),
                         ("op_overhead_ms", op_overhead_ms), ("tolerance", tolerance)):  # fmt: skip
        if not (finite(value) and value >= 0):
            raise ValueError(f"plan: {label}={value!r} must be finite and >= 0")
    if ilp_time_limit_s is not None and not (finite(ilp_time_limit_s) and ilp_time_limit_s > 0):
        raise ValueError(f"plan: ilp_time_limit_s={ilp_time_limit_s!r} must be > 0 seconds; "
                         "pass None to skip the exact solver")  # fmt: skip
    return counts, names, flags


def check_ranks(num_ranks: int, num_blocks: int) -> None:
    """At least one block, and at least one block per rank (before any work)."""
    if num_blocks == 0:
        raise ValueError("plan: no blocks; pass the model as a list of blocks")
    if not (isinstance(num_ranks, int) and 1 <= num_ranks <= num_blocks):
        raise ValueError(f"plan: num_ranks={num_ranks!r} for {num_blocks} blocks; every rank "
                         "needs at least one block: use 1..len(blocks) ranks")  # fmt: skip


def schedule_names(
    schedules: str | Sequence[str], num_ranks: int, num_blocks: int
) -> tuple[str, ...]:
    """The schedule names to weigh (``"auto"`` or the given ones, checked), before any work."""
    if schedules == "auto":  # two stages per rank where each holds a block, on 2+ ranks
        two = AUTO_TWO_CHUNK_SCHEDULES if num_blocks >= 2 * num_ranks and num_ranks > 1 else ()
        return (*AUTO_SCHEDULES, *two)
    names = (schedules,) if isinstance(schedules, str) else tuple(schedules)
    if not names:
        raise ValueError("plan: schedules is empty; name at least one or pass 'auto'")
    for name in names:
        if name not in SCHEDULE_NAMES:
            raise ValueError(f"plan: unknown schedule {name!r}; choose from "
                             f"{', '.join(SCHEDULE_NAMES)} or 'auto'")  # fmt: skip
        if name in TWO_CHUNK_SCHEDULES and num_blocks < 2 * num_ranks:
            raise ValueError(f"plan: {name} holds 2 stages per rank: {2 * num_ranks} blocks "
                             f"needed, {num_blocks} given; drop it or use fewer ranks")  # fmt: skip
    return tuple(dict.fromkeys(names))


def microbatch_counts(num_ranks: int, batch_size: int | None, given) -> tuple[int, ...]:
    """The microbatch counts to weigh: ``given``, or the divisors of ``batch_size`` the
    planner tries (see :func:`plan_from_costs`); checked before any work."""
    if batch_size is not None and not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"plan: batch_size={batch_size!r} must be an integer >= 1")
    if given is None:
        if batch_size is None:
            raise ValueError("plan: give num_microbatches, or batch_size to choose it")
        counts = [m for m in range(num_ranks, 4 * num_ranks + 1) if batch_size % m == 0][-4:]
        if not counts:
            raise ValueError(f"plan: batch_size={batch_size} has no divisor from {num_ranks} "
                             f"to {4 * num_ranks} (num_ranks to 4 * num_ranks) to use as the "
                             "microbatch count; use a batch that one divides, or pass "
                             "num_microbatches")  # fmt: skip
        return tuple(counts)
    counts = [given] if isinstance(given, int) else list(given)
    if not counts or any(not (isinstance(m, int) and m >= 1) for m in counts):
        raise ValueError(f"plan: num_microbatches={given!r} must be integers >= 1")
    bad = [m for m in counts if batch_size is not None and batch_size % m]
    if bad:
        raise ValueError(f"plan: batch_size={batch_size} is not divisible by num_microbatches "
                         f"{bad}; use counts that divide the batch")  # fmt: skip
    return tuple(sorted(set(counts)))


def pinned_cuts(
    cuts: Sequence[Sequence[int]], names: Sequence[str], num_ranks: int, num_blocks: int
) -> dict[int, tuple[tuple[int, ...], ...]]:
    """The given ``cuts`` by stages per rank (1 or 2), checked: increasing block indices in
    ``1..num_blocks-1`` making ``num_ranks`` or ``2 * num_ranks`` stages, a one-stage-per-rank
    cut among them and one for every schedule of ``names``."""
    by_chunks: dict[int, list[tuple[int, ...]]] = {1: [], 2: []}
    for cut in cuts:
        cut = tuple(int(c) for c in cut)
        bounds = (0, *cut, num_blocks)
        chunks, rest = divmod(len(cut) + 1, num_ranks)
        if rest or chunks not in by_chunks or any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"plan: cuts {cut} for {num_blocks} blocks on {num_ranks} ranks; "
                             f"give {num_ranks - 1} (or {2 * num_ranks - 1}) increasing block "
                             f"indices in 1..{num_blocks - 1}")  # fmt: skip
        by_chunks[chunks].append(cut)
    for chunks in {1, *(chunks_of(n) for n in names)}:
        if not by_chunks[chunks]:
            raise ValueError(f"plan: no cut of {chunks * num_ranks} stages among cuts "
                             f"{[tuple(c) for c in cuts]}; give one, or drop the schedules "
                             "that run that many")  # fmt: skip
    return {k: tuple(dict.fromkeys(v)) for k, v in by_chunks.items() if v}


def sizes_from_cuts(cuts: Sequence[int], num_blocks: int) -> tuple[int, ...]:
    """Blocks per stage of the cut ``cuts`` (first block of each stage after the first)."""
    bounds = (0, *cuts, num_blocks)
    return tuple(b - a for a, b in itertools.pairwise(bounds))


def cuts_from_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    return tuple(itertools.accumulate(sizes))[:-1]


def candidate_cuts(
    blocks: Sequence[Any], num_stages: int, *, max_exhaustive_cuts: int = 200
) -> tuple[tuple[int, ...], ...]:
    """The cuts to weigh, the min-bottleneck (F + B + W) cut first: every contiguous cut when
    there are at most ``max_exhaustive_cuts``, else that cut and each single cut point of it
    moved by -2, -1, +1 or +2 (where the stages stay non-empty)."""
    n = len(blocks)
    dp = cuts_from_sizes(balanced_sizes([max(b.total_ms, TINY_MS) for b in blocks],
                                        [1.0] * num_stages))  # fmt: skip
    others: Iterable[tuple[int, ...]]
    if math.comb(n - 1, num_stages - 1) <= max_exhaustive_cuts:
        others = itertools.combinations(range(1, n), num_stages - 1)
    else:
        others = _neighbourhood(dp, n)
    seen = {dp: None}
    for cut in others:
        seen.setdefault(tuple(cut), None)
    return tuple(seen)


def _neighbourhood(cuts: tuple[int, ...], num_blocks: int) -> Iterator[tuple[int, ...]]:
    bounds = (0, *cuts, num_blocks)
    for k in range(len(cuts)):
        for delta in (-2, -1, 1, 2):
            moved = cuts[k] + delta
            if bounds[k] < moved < bounds[k + 2]:  # stages k and k + 1 keep >= 1 block
                yield cuts[:k] + (moved,) + cuts[k + 1 :]


BUILTIN_MODELS = ("gpt", "mlp")
"""The ``--model`` values (``model=``) that name a built-in model; others a user's factory."""


def is_user_model(spec: str | None) -> bool:
    """Whether ``spec`` names the user's factory (``package.module:factory`` or
    ``path/to/file.py:factory``) rather than a built-in model."""
    return spec is not None and spec not in BUILTIN_MODELS


def absolute_spec(spec: str) -> str:
    """``spec`` with a file path made absolute: the ranks may start in another folder."""
    head, _, attr = spec.rpartition(":")
    return f"{Path(head).expanduser().resolve()}:{attr}" if head.endswith(".py") else spec
