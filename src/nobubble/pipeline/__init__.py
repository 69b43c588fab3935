"""Zero-bubble pipeline parallelism: schedules as data, validation, simulation, pictures.

Public API (see each module's docstring):

- :mod:`~nobubble.pipeline.actions`: ``Op``, ``Action``, ``Schedule`` (torch CSV, text grid)
"""

from __future__ import annotations

from nobubble.pipeline.actions import Action, Op, Schedule, ScheduleFormatError

__all__ = ["Action", "Op", "Schedule", "ScheduleFormatError"]
