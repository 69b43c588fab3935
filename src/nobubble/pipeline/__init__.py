"""Zero-bubble pipeline parallelism: schedules as data (:mod:`~nobubble.pipeline.actions`,
:mod:`~nobubble.pipeline.schedules`), costs, validation, simulation, comparison, pictures,
the exact solver (:mod:`~nobubble.pipeline.ilp`) and the runtime
(:mod:`~nobubble.pipeline.runtime`). The solver and the runtime are loaded on first use
(PEP 562), so importing the schedules does not pull in OR-Tools or torch.distributed.
"""

from __future__ import annotations

from nobubble.pipeline.actions import Action, Op, Schedule, ScheduleFormatError
from nobubble.pipeline.compare import CompareRow, compare_schedules
from nobubble.pipeline.costs import CostModel, transformer_memory
from nobubble.pipeline.schedules import SCHEDULE_NAMES, get_schedule
from nobubble.pipeline.simulate import SimResult, simulate
from nobubble.pipeline.validate import ScheduleError, validate

_LAZY = {
    "solve_optimal": "nobubble.pipeline.ilp.solve",
    "SolveResult": "nobubble.pipeline.ilp.solve",
    "run_local": "nobubble.pipeline.runtime.launch",
    "TrainConfig": "nobubble.pipeline.runtime.executor",
    "LaunchOptions": "nobubble.pipeline.runtime.launch",
    "profile_stages": "nobubble.pipeline.runtime.profile",
    "PipelineRunner": "nobubble.pipeline.runtime.runner",
    "split_model": "nobubble.pipeline.runtime.runner",
    "ModuleSplit": "nobubble.pipeline.runtime.autosplit",
    "SplitReport": "nobubble.pipeline.runtime.autosplit",
    "to_torch": "nobubble.pipeline.runtime.torch_interop",
    "profile_modules": "nobubble.pipeline.runtime.profile",
    "simulate_dispatch": "nobubble.pipeline.dispatch",
    "StragglerObserver": "nobubble.pipeline.runtime.hooks",
    "Replanner": "nobubble.pipeline.runtime.elastic",
    "PostValidatedOptimizer": "nobubble.pipeline.runtime.optim",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nobubble.pipeline' has no attribute {name!r}")


__all__ = [
    "Action",
    "Op",
    "Schedule",
    "ScheduleFormatError",
    "CostModel",
    "transformer_memory",
    "SCHEDULE_NAMES",
    "get_schedule",
    "SimResult",
    "simulate",
    "ScheduleError",
    "validate",
    "CompareRow",
    "compare_schedules",
    *_LAZY,
]
