"""Cost model of a pipeline: per-stage op times, transfer time, activation memory.

Times in any unit (the paper's ms), memory in any consistent unit. Per (virtual) stage s:
``t_f[s]``, ``t_b[s]``, ``t_w[s]`` (forward, input-gradient B, weight-gradient W; a fused BW
takes ``t_bw[s]`` when measured, else ``t_b + t_w``); ``mem_f[s]`` stored by F, ``mem_b[s]``
and ``mem_w[s]`` freed by B and W (normally summing to ``mem_f``); with
``recompute_mem[s]`` (:meth:`CostModel.with_recompute`) F keeps only that and B runs the
forward again first (``t_f`` longer, holding ``mem_f`` at its start,
:meth:`CostModel.memory_transient`). ``t_comm`` is charged only between ranks. The paper's
memory model per token per layer: F stores ``34h + 5as``, B frees ``2h + 5as``, W frees
``32h`` (:func:`transformer_memory`). :meth:`CostModel.from_rank_costs` splits per-rank costs
(``--tf/--tb/--tw``) evenly over a rank's chunks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from nobubble.pipeline.actions import Action, Op
from nobubble.validation import finite

__all__ = [
    "CostModel",
    "MemoryPerMicrobatch",
    "transformer_memory",
    "PAPER_MODELS",
    "PAPER_TIMES",
]

Number = float | int


@dataclass(frozen=True, slots=True)
class MemoryPerMicrobatch:
    """Activation memory of one microbatch: what F stores, B frees and W frees."""

    mem_f: float
    mem_b: float
    mem_w: float


def transformer_memory(*, hidden: int, heads: int, seq: int) -> MemoryPerMicrobatch:
    """The paper's per-layer, per-token activation memory: M_F = 34h + 5as, M_B = 2h + 5as,
    M_W = 32h (units: bytes per token per layer; multiply by tokens x layers for bytes)."""
    for label, value in (("hidden", hidden), ("heads", heads), ("seq", seq)):
        if not (isinstance(value, int) and value > 0):
            raise ValueError(f"{label}={value!r} must be a positive integer")
    return MemoryPerMicrobatch(
        mem_f=34.0 * hidden + 5.0 * heads * seq,
        mem_b=2.0 * hidden + 5.0 * heads * seq,
        mem_w=32.0 * hidden,
    )


# (hidden, heads, layers, seq) of the paper's four GPT-3-like models
PAPER_MODELS: dict[str, tuple[int, int, int, int]] = {
    "1.5B": (2304, 24, 24, 1024),
    "6.2B": (4096, 32, 32, 1024),
    "14.6B": (5120, 40, 48, 1024),
    "28.3B": (6144, 48, 64, 1024),
}

# measured per-rank times (T_F, T_B, T_W, T_comm in ms) of the same four models at
# p = 8/8/16/32, from the paper's table
PAPER_TIMES: dict[str, tuple[float, float, float, float]] = {
    "1.5B": (18.522, 18.086, 9.337, 0.601),
    "6.2B": (29.718, 29.444, 19.927, 0.527),
    "14.6B": (11.347, 11.248, 8.132, 0.377),
    "28.3B": (10.419, 10.207, 7.715, 0.408),
}


def _per_stage(
    label: str, value: Number | Sequence[Number], num_stages: int, unit: str = "stage"
) -> tuple[float, ...]:
    values = (value,) * num_stages if isinstance(value, int | float) else tuple(value)
    if len(values) == 1 and unit == "rank":  # a one-entry list on the command line
        values = values * num_stages
    if len(values) != num_stages:
        raise ValueError(f"{label} has {len(values)} entries; give one number, or one per "
                         f"{unit} ({num_stages})")  # fmt: skip
    return tuple(float(v) for v in values)


@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel:
    """Per-stage times and memory (see the module docstring); sequences have one entry per
    (virtual) stage. Build with :meth:`uniform`, :meth:`from_rank_costs` or directly."""

    t_f: tuple[float, ...]
    t_b: tuple[float, ...]
    t_w: tuple[float, ...]
    mem_f: tuple[float, ...]
    mem_b: tuple[float, ...]
    mem_w: tuple[float, ...]
    t_comm: float = 0.0
    t_bw: tuple[float, ...] | None = None
    """A fused backward's time per stage; None: ``t_b + t_w``."""
    recompute_mem: tuple[float, ...] | None = None
    """Activation checkpointing: what F keeps per stage (its input); None: F keeps
    ``mem_f`` and B does not recompute."""

    def __post_init__(self) -> None:
        n = len(self.t_f)
        if n < 1:
            raise ValueError("CostModel needs at least one stage (t_f is empty)")
        labels = ("t_f", "t_b", "t_w", "mem_f", "mem_b", "mem_w")
        optional = tuple(k for k in ("t_bw", "recompute_mem") if getattr(self, k) is not None)
        for label in labels + optional:
            values = _per_stage(label, getattr(self, label), n)
            object.__setattr__(self, label, values)
            strict = label.startswith("t_")
            for s, v in enumerate(values):
                if not finite(v) or v < 0 or (strict and v == 0):
                    bound = "> 0" if strict else ">= 0"
                    raise ValueError(f"{label}[{s}]={v} must be finite and {bound}")
        if not (finite(self.t_comm) and self.t_comm >= 0):
            raise ValueError(f"t_comm={self.t_comm} must be finite and >= 0")
        object.__setattr__(self, "t_comm", float(self.t_comm))

    @property
    def num_stages(self) -> int:
        return len(self.t_f)

    @property
    def recomputes(self) -> bool:
        """Whether B recomputes the forward (activation checkpointing)."""
        return self.recompute_mem is not None

    def duration(self, action: Action) -> float:
        """Time of one action (BW takes ``t_bw``, else t_b + t_w; with recompute, B and BW
        run the forward once more first)."""
        s, op = action.stage, action.op
        if op is Op.F:
            return self.t_f[s]
        if op is Op.W:
            return self.t_w[s]
        again = self.t_f[s] if self.recompute_mem is not None else 0.0
        if op is Op.B:
            return again + self.t_b[s]
        fused = self.t_bw[s] if self.t_bw is not None else self.t_b[s] + self.t_w[s]
        return again + fused

    def memory_delta(self, action: Action) -> float:
        """Change of stored activations when the action runs (+ for F, - for B/W/BW; with
        recompute, B ends holding more than before it: what W needs was recomputed)."""
        s, op = action.stage, action.op
        kept = self.recompute_mem[s] if self.recompute_mem is not None else None
        if op is Op.F:
            return self.mem_f[s] if kept is None else kept
        if op is Op.B:
            return -self.mem_b[s] if kept is None else self.mem_f[s] - self.mem_b[s]
        if op is Op.W:
            return -self.mem_w[s] - (kept or 0.0)
        return -(self.mem_b[s] + self.mem_w[s]) if kept is None else -kept

    def memory_transient(self, action: Action) -> float:
        """Memory held during the action above the level before it: with recompute, B and
        BW hold the recomputed ``mem_f`` before their backward frees any; otherwise 0."""
        if self.recompute_mem is None or action.op not in (Op.B, Op.BW):
            return 0.0
        return self.mem_f[action.stage]

    def with_recompute(self, stage_input_mem: Number | Sequence[Number] = 0.0) -> CostModel:
        """These costs under activation checkpointing: F keeps ``stage_input_mem`` (one
        number, or one per stage: the bytes of the stage's input), B recomputes the forward.
        A no-op on a model that already recomputes, except for the kept memory."""
        kept = _per_stage("stage_input_mem", stage_input_mem, self.num_stages)
        return dataclasses.replace(self, recompute_mem=kept)

    @staticmethod
    def uniform(
        num_stages: int,
        *,
        t_f: float = 1.0,
        t_b: float = 1.0,
        t_w: float = 1.0,
        t_comm: float = 0.0,
        mem_f: float = 1.0,
        mem_b: float | None = None,
        mem_w: float | None = None,
    ) -> CostModel:
        """The same costs on every stage. Memory defaults to M_F = 1 split evenly (B frees
        half, W the other half); give ``mem_b``/``mem_w`` for another split."""
        _check_count("num_stages", num_stages)
        return CostModel.from_rank_costs(
            num_stages, t_f=t_f, t_b=t_b, t_w=t_w, t_comm=t_comm, mem_f=mem_f, mem_b=mem_b,
            mem_w=mem_w,
        )  # fmt: skip

    @staticmethod
    def from_rank_costs(
        num_ranks: int,
        *,
        num_chunks: int = 1,
        stage_to_rank: Sequence[int] | None = None,
        t_f: Number | Sequence[Number] = 1.0,
        t_b: Number | Sequence[Number] = 1.0,
        t_w: Number | Sequence[Number] = 1.0,
        t_comm: float = 0.0,
        mem_f: Number | Sequence[Number] = 1.0,
        mem_b: Number | Sequence[Number] | None = None,
        mem_w: Number | Sequence[Number] | None = None,
        t_bw: Number | Sequence[Number] | None = None,
    ) -> CostModel:
        """Costs given per *rank* (a number, or one entry per rank), split evenly over the
        ``num_chunks`` stages each rank holds. ``stage_to_rank`` defaults to the looped
        (interleaved) map ``s -> s % num_ranks``; pass a schedule's map for V shapes."""
        _check_count("num_ranks", num_ranks)
        _check_count("num_chunks", num_chunks)
        num_stages = num_ranks * num_chunks
        if stage_to_rank is None:
            stage_to_rank = [s % num_ranks for s in range(num_stages)]
        if len(stage_to_rank) != num_stages:
            raise ValueError(
                f"stage_to_rank has {len(stage_to_rank)} entries; expected {num_stages} "
                f"({num_ranks} ranks x {num_chunks} chunks)"
            )
        per_rank = {}
        for label, value in (("t_f", t_f), ("t_b", t_b), ("t_w", t_w), ("mem_f", mem_f)):
            per_rank[label] = _per_stage(label, value, num_ranks, "rank")
        if mem_b is None and mem_w is None:
            per_rank["mem_b"] = tuple(v / 2 for v in per_rank["mem_f"])
            per_rank["mem_w"] = per_rank["mem_b"]
        else:
            mb = _per_stage("mem_b", mem_b if mem_b is not None else 0.0, num_ranks, "rank")
            mw = _per_stage("mem_w", mem_w if mem_w is not None else 0.0, num_ranks, "rank")
            if mem_b is None:
                mb = tuple(f - w for f, w in zip(per_rank["mem_f"], mw))
            if mem_w is None:
                mw = tuple(f - b for f, b in zip(per_rank["mem_f"], mb))
            for r, (f, b, w) in enumerate(zip(per_rank["mem_f"], mb, mw)):
                if mem_b is not None and mem_w is not None and b + w > f * (1 + 1e-9):
                    raise ValueError(f"mem_b + mem_w = {b + w:g} on rank {r} frees more than "
                                     f"mem_f = {f:g} stores; give at most mem_f in all")  # fmt: skip
            per_rank["mem_b"], per_rank["mem_w"] = mb, mw
        if t_bw is not None:  # a measured fused backward splits like the other times
            per_rank["t_bw"] = _per_stage("t_bw", t_bw, num_ranks, "rank")
        fields = {
            label: tuple(values[r] / num_chunks for r in stage_to_rank)
            for label, values in per_rank.items()
        }
        return CostModel(t_comm=t_comm, **fields)

    @staticmethod
    def paper(
        num_ranks: int,
        *,
        t_f: float,
        t_b: float,
        t_w: float,
        t_comm: float,
        hidden: int,
        heads: int,
        seq: int,
        num_chunks: int = 1,
        stage_to_rank: Sequence[int] | None = None,
    ) -> CostModel:
        """Rank-level times plus the paper's transformer memory model (per token per layer)."""
        mem = transformer_memory(hidden=hidden, heads=heads, seq=seq)
        return CostModel.from_rank_costs(
            num_ranks, num_chunks=num_chunks, stage_to_rank=stage_to_rank,
            t_f=t_f, t_b=t_b, t_w=t_w, t_comm=t_comm,
            mem_f=mem.mem_f, mem_b=mem.mem_b, mem_w=mem.mem_w,
        )  # fmt: skip

    @staticmethod
    def paper_model(model: str, num_ranks: int) -> CostModel:
        """One of the paper's four models (``PAPER_MODELS``: ``"1.5B"``, ``"6.2B"``,
        ``"14.6B"``, ``"28.3B"``) on ``num_ranks`` ranks: its measured per-rank times
        (``PAPER_TIMES``) and its memory model (:meth:`paper`)."""
        if model not in PAPER_TIMES:
            raise ValueError(
                f"model={model!r} is not one of the paper's models; choose from "
                f"{', '.join(PAPER_TIMES)}"
            )
        t_f, t_b, t_w, t_comm = PAPER_TIMES[model]
        hidden, heads, _, seq = PAPER_MODELS[model]
        return CostModel.paper(
            num_ranks, t_f=t_f, t_b=t_b, t_w=t_w, t_comm=t_comm,
            hidden=hidden, heads=heads, seq=seq,
        )  # fmt: skip

    @staticmethod
    def from_settings(
        num_ranks: int,
        *,
        model: str | None = None,
        t_f: Number | Sequence[Number] | None = None,
        t_b: Number | Sequence[Number] | None = None,
        t_w: Number | Sequence[Number] | None = None,
        t_comm: float | None = None,
        hidden: int | None = None,
        heads: int | None = None,
        seq: int | None = None,
        mem_f: float | None = None,
        mem_b: float | None = None,
        mem_w: float | None = None,
    ) -> CostModel:
        """Per-rank costs from partial settings (what the ``pp`` commands' flags give), each
        None taking its default. Times: ``model``'s measured ones (``PAPER_TIMES``; without
        a model 1, 1, 1 and 0), each one given overriding. Memory: a transformer shape
        (``hidden``, ``heads`` and ``seq`` together, :func:`transformer_memory`), or
        ``mem_f`` with the optional ``mem_b`` / ``mem_w`` it frees (:meth:`from_rank_costs`),
        or neither: ``model``'s shape (the 1.5B's without a model). Raises ValueError for an
        unknown model and for settings that contradict each other."""
        if model is not None and model not in PAPER_TIMES:
            raise ValueError(f"model={model!r} is not one of the paper's models; choose from "
                             f"{', '.join(PAPER_TIMES)}")  # fmt: skip
        d_f, d_b, d_w, d_comm = PAPER_TIMES.get(model or "", (1.0, 1.0, 1.0, 0.0))
        shape = {"hidden": hidden, "heads": heads, "seq": seq}
        if any(v is not None for v in shape.values()):
            if mem_f is not None or mem_b is not None or mem_w is not None:
                raise ValueError("give the memory either as hidden/heads/seq or as "
                                 "mem_f/mem_b/mem_w, not both")  # fmt: skip
            if None in shape.values():
                got = ", ".join(f"{k}={v}" for k, v in shape.items())
                raise ValueError(f"hidden, heads and seq go together; give all three ({got})")
        elif mem_f is None:
            if mem_b is not None or mem_w is not None:
                raise ValueError(f"mem_b={mem_b}/mem_w={mem_w} need mem_f (what they free is "
                                 "part of what F stores); give mem_f too")  # fmt: skip
            hidden, heads, _, seq = PAPER_MODELS[model or "1.5B"]
        if hidden is not None:
            mem = transformer_memory(hidden=hidden, heads=heads, seq=seq)  # type: ignore[arg-type]
            mem_f, mem_b, mem_w = mem.mem_f, mem.mem_b, mem.mem_w
        return CostModel.from_rank_costs(
            num_ranks, t_f=d_f if t_f is None else t_f, t_b=d_b if t_b is None else t_b,
            t_w=d_w if t_w is None else t_w, t_comm=d_comm if t_comm is None else t_comm,
            mem_f=mem_f, mem_b=mem_b, mem_w=mem_w,  # type: ignore[arg-type]
        )  # fmt: skip

    def for_stages(self, stage_to_rank: Sequence[int]) -> CostModel:
        """Re-split these per-rank-sized costs for a schedule with ``len(stage_to_rank)``
        stages (valid when this model has one stage per rank)."""
        p = self.num_stages
        if len(stage_to_rank) == p:
            return self
        if len(stage_to_rank) % p:
            raise ValueError(
                f"cannot split costs of {p} ranks over {len(stage_to_rank)} stages; "
                "give per-stage costs"
            )
        split = CostModel.from_rank_costs(
            p, num_chunks=len(stage_to_rank) // p, stage_to_rank=stage_to_rank,
            t_f=self.t_f, t_b=self.t_b, t_w=self.t_w, t_comm=self.t_comm,
            mem_f=self.mem_f, mem_b=self.mem_b, mem_w=self.mem_w, t_bw=self.t_bw,
        )  # fmt: skip
        if self.recompute_mem is None:
            return split
        # every chunk keeps its own input, a whole boundary tensor: not split over chunks
        return split.with_recompute([self.recompute_mem[r] for r in stage_to_rank])


def _check_count(label: str, value: int) -> None:
    if not (isinstance(value, int) and value >= 1):
        raise ValueError(f"{label}={value!r} must be a positive integer")
