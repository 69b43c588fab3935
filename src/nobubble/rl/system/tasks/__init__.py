"""Tasks: the built-in ones, any object of the user's, and reasoning-gym's.

- :mod:`.builtin` - digit completion and sum of digits, and the character tokenizer;
- :mod:`.spec` - :class:`TaskSpec`: any task object as the interface the stages use, and
  :func:`resolve_task` (a name, ``rg:<name>``, an import path or an object);
- :mod:`.rg` - reasoning-gym's procedural datasets (the ``rg`` extra).
"""

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
