"""Any task object as the one interface the stages use: :class:`TaskSpec`, and
:func:`resolve_task` for a run's ``task`` setting.

What a task must have and may have is in ``docs/rl/own-model.md`` (Tasks): ``reward(prompt,
response)``, ``prompts()`` and/or ``eval_prompts()``, ``max_new_tokens``; optionally
``is_correct`` or ``answer``, ``tokenizer`` (or ``tokenizer_alphabet``),
``response_budget(prompt)`` and ``name``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nobubble.rl.system.imports import check_kwargs, is_import_path, load_object
from nobubble.rl.system.tasks.builtin import TASK_NAMES, CharTokenizer, make_task
from nobubble.validation import check_value, finite

__all__ = ["TaskSpec", "resolve_task", "RewardError", "as_reward"]


class RewardError(ValueError):
    """A reward that is not a finite number (a task's, a reward function's, a service's)."""


def as_reward(value: object, what: str) -> float:
    """``value`` as a reward: a finite real (an ``int`` or ``float``, not a ``bool``) as a
    float, else :class:`RewardError` saying that ``what`` returned it - the one rule for a
    task's, a reward function's, a reward service's and a text env's rewards alike."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not finite(value):
        raise RewardError(f"{what} returned {value!r}, not a finite number; return an int or float")
    return float(value)


def _has(obj: Any, name: str) -> bool:
    return callable(getattr(obj, name, None))


class TaskSpec:
    """A task with everything the stages need filled in; ValueError at construction names
    what the task lacks.

    Attributes:
        task: the user's object; name: its name.
        tokenizer: the task's tokenizer (``encode(text) -> ids`` with ``<bos>`` first,
            ``decode_response``, ``vocab_size``, ``pad_id``, ``bos_id``, ``eos_id``), or a
            :class:`CharTokenizer` over ``tokenizer_alphabet`` or the prompts' characters.
        prompts, eval_prompts: the training pool (a sample's ``prompt_id`` indexes it) and
            the evaluation set; each defaults to the other.
        prompt_len: P, the longest encoded prompt; shorter prompts are left padded to it.
        max_new_tokens: N.
    """

    def __init__(self, task: Any, name: str | None = None) -> None:
        self.task = task
        self.name = name or str(getattr(task, "name", type(task).__name__))
        missing = [] if _has(task, "reward") else ["reward"]
        if not (_has(task, "prompts") or _has(task, "eval_prompts")):
            missing.append("prompts() or eval_prompts()")
        if not hasattr(task, "max_new_tokens"):
            missing.append("max_new_tokens")
        if missing:
            raise ValueError(
                f"task {self.name!r} ({type(task).__name__}) lacks {', '.join(missing)}; a task "
                "needs reward(prompt, response), prompts() or eval_prompts(), max_new_tokens"
            )
        pool = list(task.prompts() if _has(task, "prompts") else task.eval_prompts())
        evals = list(task.eval_prompts() if _has(task, "eval_prompts") else pool)
        if not pool or not evals:
            raise ValueError(f"task {self.name!r} has no prompts")
        if not all(isinstance(p, str) for p in (*pool, *evals)):
            raise ValueError(f"task {self.name!r}: prompts must be strings")
        self.prompts: list[str] = pool
        self.eval_prompts: list[str] = evals
        self.max_new_tokens = int(task.max_new_tokens)
        check_value(f"task {self.name!r}: max_new_tokens", self.max_new_tokens, ">= 1")
        tok = getattr(task, "tokenizer", None)
        if tok is None:
            alphabet = getattr(task, "tokenizer_alphabet", None)
            tok = CharTokenizer(
                alphabet or "".join(sorted({c for p in (*pool, *evals) for c in p}))
            )
        self.tokenizer = tok
        self.prompt_len = max(len(tok.encode(p)) for p in (*pool, *evals))

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    @property
    def max_seq_len(self) -> int:
        return self.prompt_len + self.max_new_tokens

    def reward(self, prompt: str, response: str) -> float:
        """The task's reward; :class:`RewardError` for a value that is not a finite real."""
        return as_reward(self.task.reward(prompt, response), f"task {self.name!r}: reward")

    def is_correct(self, prompt: str, response: str) -> bool:
        """The task's ``is_correct``, else an exact ``answer``, else reward >= 1."""
        if _has(self.task, "is_correct"):
            return bool(self.task.is_correct(prompt, response))
        if _has(self.task, "answer"):
            return response == self.task.answer(prompt)
        return self.reward(prompt, response) >= 1.0

    def budgets(self, prompts: Sequence[str]) -> torch.Tensor:
        """(B,) int64 max response tokens of each prompt: its ``response_budget``, at most N."""
        if not _has(self.task, "response_budget"):
            return torch.full((len(prompts),), self.max_new_tokens, dtype=torch.long)
        budgets = [min(int(self.task.response_budget(p)), self.max_new_tokens) for p in prompts]
        return torch.tensor(budgets, dtype=torch.long)

    def encode(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids (B, P) int64 and their attention mask (B, P) int64."""
        p, pad = self.prompt_len, self.tokenizer.pad_id
        ids = torch.full((len(prompts), p), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), p), dtype=torch.long)
        for i, text in enumerate(prompts):
            row = self.tokenizer.encode(text)
            if len(row) > p:
                raise ValueError(f"prompt {text!r} encodes to {len(row)} tokens, more than P={p}")
            ids[i, p - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, p - len(row) :] = 1
        return ids, mask

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode_response(ids)


def resolve_task(task: Any, kwargs: dict[str, Any] | None = None) -> TaskSpec:
    """The :class:`TaskSpec` of a run's ``task``: a :class:`TaskSpec`, a built-in name
    (``digits``, ``sum``), ``rg:<name>`` (a reasoning-gym dataset), an import path to a task
    object, class or factory, or the object itself. ``kwargs`` go to a built-in task, a
    reasoning-gym dataset's config, or a task class or factory; a ready object takes none.
    """
    kw = dict(kwargs or {})
    if isinstance(task, TaskSpec):
        return task
    obj, name = task, None
    if isinstance(task, str):
        if task in TASK_NAMES:
            return TaskSpec(make_task(task, **kw))
        if task.startswith("rg:"):
            from nobubble.rl.system.tasks.rg import ReasoningGymTask

            return TaskSpec(ReasoningGymTask(task[3:], **kw), name=task)
        if not is_import_path(task):
            raise ValueError(
                f"task {task!r} is unknown; choose {', '.join(TASK_NAMES)}, 'rg:<name>' "
                "(reasoning-gym) or an import path 'module:attr' / 'file.py:attr'"
            )
        obj, name = load_object(task, "task"), task.rpartition(":")[2]
    if isinstance(obj, type) or (callable(obj) and not _has(obj, "reward")):
        check_kwargs(obj, kw, "task_kwargs")
        obj = obj(**kw)  # a task class or factory
    elif kw:
        raise ValueError(f"task {task!r} is an object; task_kwargs={kw} apply only to a factory")
    return TaskSpec(obj, name=getattr(obj, "name", None) or name)
