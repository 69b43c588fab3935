"""A profile as data: :class:`Profile` (each profiled module's :class:`StageProfile` and the
transfer time) and its JSON file, written and read without torch, so that a file that is no
profile is refused before torch is imported. The profiler that measures one is
:mod:`nobubble.pipeline.runtime.profile`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from nobubble.files import read_input_text, write_text
from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.plan import BlockCosts
from nobubble.validation import MAX_REAL, finite

__all__ = ["StageProfile", "Profile"]


@dataclass(frozen=True)
class StageProfile:
    """Measured costs of one profiled module (a stage or a block) for one microbatch (ms,
    bytes)."""

    stage: int
    blocks: tuple[int, ...]
    t_f: float
    t_b: float
    t_w: float
    t_bw_fused: float
    mem_f: int
    mem_w: int
    bw_ratio: float
    """Median over repeats of (T_B + T_W) / fused backward, each pair timed back to back (a
    load burst on a shared machine hits both sides of a pair alike)."""
    out_bytes: int = 0
    """The module's output (before the loss on the last one): what a cut after it sends."""

    @property
    def mem_b(self) -> int:
        return max(self.mem_f - self.mem_w, 0)

    @property
    def split_overhead(self) -> float:
        """(T_B + T_W) / fused backward - 1 (paired median, see ``bw_ratio``)."""
        return self.bw_ratio - 1.0


@dataclass(frozen=True)
class Profile:
    """A model's measured costs per profiled module and the inter-rank transfer time."""

    model: str
    microbatch_size: int
    stages: tuple[StageProfile, ...]
    t_comm: float
    activation_bytes: int
    clock: str = "wall"
    """How op times were taken: ``wall`` or ``cpu`` (thread CPU time)."""

    def cost_model(self, schedule: Schedule | None = None, *, recompute: bool = False) -> CostModel:
        """The simulator's per-stage costs (ms, bytes), the fused backward's measured time
        included. ``schedule`` must have as many stages as were profiled (profile with the
        schedule's ``num_stages``). ``recompute``: under activation checkpointing, each F
        keeps one boundary activation (``activation_bytes``) and each B runs F again."""
        if schedule is not None and schedule.num_stages != len(self.stages):
            raise ValueError(
                f"profile has {len(self.stages)} stages but schedule {schedule.name!r} has "
                f"{schedule.num_stages}; profile the model in {schedule.num_stages} stages"
            )
        st = self.stages
        costs = CostModel(
            t_f=tuple(s.t_f for s in st), t_b=tuple(s.t_b for s in st),
            t_w=tuple(s.t_w for s in st), t_comm=self.t_comm,
            mem_f=tuple(float(s.mem_f) for s in st), mem_b=tuple(float(s.mem_b) for s in st),
            mem_w=tuple(float(s.mem_f - s.mem_b) for s in st),
            t_bw=tuple(s.t_bw_fused for s in st),  # what a fused BW really takes
        )  # fmt: skip
        return costs.with_recompute(float(self.activation_bytes)) if recompute else costs

    def block_costs(self) -> list[BlockCosts]:
        """The planner's view (:func:`~nobubble.pipeline.plan.plan_from_costs`), one
        :class:`~nobubble.pipeline.plan.BlockCosts` per profiled module. B frees none of F's
        bytes: the runner holds a microbatch's activations until its W (W's store keeps each
        linear's input and output gradient) and counts its peak so."""
        return [
            BlockCosts(
                forward=s.t_f, backward_input=s.t_b, backward_weight=s.t_w,
                activation_bytes=float(s.mem_f), boundary_bytes=float(s.out_bytes),
                backward_fused=s.t_bw_fused, freed_by_backward_input=0.0,
            )
            for s in self.stages
        ]  # fmt: skip

    def to_dict(self) -> dict:
        d = asdict(self)
        for s, st in zip(d["stages"], self.stages, strict=True):
            s["mem_b"] = st.mem_b
            s["split_overhead"] = st.split_overhead
        return d

    @staticmethod
    def from_dict(d: dict) -> Profile:
        skip = ("mem_b", "split_overhead")
        stages = tuple(
            StageProfile(**{
                "bw_ratio": (s["t_b"] + s["t_w"]) / s["t_bw_fused"],  # files without it
                **{k: v for k, v in s.items() if k not in skip},
                "blocks": tuple(s["blocks"]),
            })
            for s in d["stages"]
        )  # fmt: skip
        return Profile(
            model=d["model"],
            microbatch_size=int(d["microbatch_size"]),
            stages=stages,
            t_comm=float(d["t_comm"]),
            activation_bytes=int(d["activation_bytes"]),
            clock=str(d.get("clock", "wall")),
        )

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as indented JSON to ``path`` (atomically); :meth:`read`
        reads it back."""
        return write_text(path, json.dumps(self.to_dict(), indent=2))

    @staticmethod
    def read(path: str | os.PathLike[str]) -> Profile:
        """The profile in the JSON file at ``path`` (:meth:`write`'s, ``pp profile -o``),
        every number of its stages finite and its costs passing the simulator's own checks
        (:meth:`cost_model`).

        Raises:
            ValueError: ``path`` cannot be read, holds no profile JSON, or a number that is
                not finite; the error names the file.
        """
        text = read_input_text(path, "write one with pp profile -o")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as err:  # not JSON, nested past reason
            raise ValueError(f"{path}: not a pp profile JSON ({err}); write one with pp "
                             "profile -o") from None  # fmt: skip
        stages = data.get("stages") if isinstance(data, dict) else None
        for i, stage in enumerate(stages if isinstance(stages, list) else []):
            for key, value in stage.items() if isinstance(stage, dict) else ():
                if isinstance(value, int | float) and not finite(value):
                    raise ValueError(f"{path}: stage {i} {key}={value!r} must be finite "
                                     f"(at most {MAX_REAL:g}); profile again with pp profile -o")  # fmt: skip
        try:
            prof = Profile.from_dict(data)
            prof.cost_model()  # the costs' own checks: finite, >= 0
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as err:
            raise ValueError(f"{path}: not a pp profile JSON ({type(err).__name__}: "
                             f"{err})") from None  # fmt: skip
        return prof
