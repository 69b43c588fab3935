"""Tasks: the built-in ones and the character tokenizer (:mod:`.builtin`), any object of the
user's as a :class:`TaskSpec` (:mod:`.spec`), and reasoning-gym's datasets (:mod:`.rg`)."""

from __future__ import annotations

from nobubble.rl.system.tasks.builtin import (
    TASK_NAMES,
    CharTokenizer,
    DigitsTask,
    SumDigitsTask,
    make_task,
)
from nobubble.rl.system.tasks.spec import TaskSpec, resolve_task

__all__ = [
    "TASK_NAMES",
    "CharTokenizer",
    "DigitsTask",
    "SumDigitsTask",
    "make_task",
    "TaskSpec",
    "resolve_task",
]
