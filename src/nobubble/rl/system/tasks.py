"""Tasks: the built-in ones, reasoning-gym's datasets and any object of the user's (what a
task must and may have: ``docs/rl/own-model.md``), each seen by the stages as a
:class:`TaskSpec`; :func:`resolve_task` reads a run's ``task`` setting.
"""

from __future__ import annotations

import os.path
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from nobubble.imports import check_kwargs, import_extra, is_import_path, load_user_object
from nobubble.validation import check_value, finite

__all__ = [
    "CharTokenizer",
    "DigitsTask",
    "SumDigitsTask",
    "ReasoningGymPool",
    "ReasoningGymTask",
    "TaskSpec",
    "resolve_task",
    "RewardError",
    "as_reward",
]


@dataclass(frozen=True)
class CharTokenizer:
    """Characters to ids: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, then the alphabet."""

    alphabet: str
    itos: tuple[str, ...] = field(init=False)
    pad_id: ClassVar[int] = 0
    bos_id: ClassVar[int] = 1
    eos_id: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(f"alphabet {self.alphabet!r} repeats a character")
        object.__setattr__(self, "itos", ("<pad>", "<bos>", "<eos>", *self.alphabet))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """``<bos>`` followed by the characters of ``text``."""
        try:
            return [self.bos_id, *(self.alphabet.index(c) + 3 for c in text)]
        except ValueError:
            bad = sorted(set(text) - set(self.alphabet))
            raise ValueError(f"text {text!r} has characters {bad} outside the alphabet") from None

    def decode_response(self, ids: list[int]) -> str:
        """The characters before the first ``<eos>``; ``<pad>``/``<bos>`` are dropped."""
        end = ids.index(self.eos_id) if self.eos_id in ids else len(ids)
        return "".join(self.itos[i] for i in ids[:end] if i >= 3)


@dataclass(frozen=True, kw_only=True)
class _AnswerTask:
    """A task with one right answer per prompt (:meth:`answer`), rewarded densely."""

    tokenizer: CharTokenizer = field(default=CharTokenizer("0123456789,:="), init=False)

    def answer(self, prompt: str) -> str:
        raise NotImplementedError

    def reward(self, prompt: str, response: str) -> float:
        """Fraction of the answer's characters right before the first wrong one, in [0, 1];
        1 iff exact (a response longer than the answer is wrong past its end)."""
        want = self.answer(prompt)
        right = len(os.path.commonprefix([want, response]))
        if right == len(want) < len(response):
            right -= 1
        return right / len(want)


@dataclass(frozen=True, kw_only=True)
class DigitsTask(_AnswerTask):
    """Digit completion: ``"a,b:m,n"`` -> the next ``n`` terms of ``a, b, ...`` modulo ``m``,
    one digit each: ``t_k = (b + k (b - a)) mod m``."""

    moduli: tuple[int, ...] = (5, 7, 9)  # the values of m, 2..9 (one character each)
    num_terms: tuple[int, ...] = (3,)  # the values of n, 1..9
    # the differences d = b - a the prompts use (mod m); None: every d in 0..m-1 (harder)
    differences: tuple[int, ...] | None = (1,)
    name: str = "digits"

    def __post_init__(self) -> None:
        if not self.moduli or any(not 2 <= m <= 9 for m in self.moduli):
            raise ValueError(f"moduli={self.moduli} must be non-empty values in 2..9 (one digit)")
        if not self.num_terms or any(not 1 <= n <= 9 for n in self.num_terms):
            raise ValueError(f"num_terms={self.num_terms} must be non-empty values in 1..9")
        if self.differences is not None and not self.differences:
            raise ValueError("differences=() is empty; pass None for every difference")

    @property
    def max_new_tokens(self) -> int:
        return max(self.num_terms)

    def response_budget(self, prompt: str) -> int:
        """``n`` tokens: the prompt asks for ``n`` terms (an ``<eos>`` may end it sooner)."""
        return int(prompt[-1])

    def eval_prompts(self) -> list[str]:
        return [
            f"{a},{(a + d) % m}:{m},{n}"
            for m in self.moduli
            for n in self.num_terms
            for a in range(m)
            for d in (
                range(m) if self.differences is None else sorted({x % m for x in self.differences})
            )
        ]

    def answer(self, prompt: str) -> str:
        a, b, m, n = (int(x) for x in prompt.replace(":", ",").split(","))
        return "".join(str((b + k * (b - a)) % m) for k in range(1, n + 1))


@dataclass(frozen=True, kw_only=True)
class SumDigitsTask(_AnswerTask):
    """Sum of digits: ``"d1d2...dL="`` -> ``str(d1 + ... + dL)``; ``num_digits``: L, 1..4 (the
    evaluation set has 10**L prompts)."""

    num_digits: int = 2
    name: str = "sum"

    def __post_init__(self) -> None:
        if not 1 <= self.num_digits <= 4:
            raise ValueError(f"num_digits={self.num_digits} must be in 1..4 (10**L eval prompts)")

    @property
    def max_new_tokens(self) -> int:
        return len(str(9 * self.num_digits)) + 1  # the longest sum and its <eos>

    def eval_prompts(self) -> list[str]:
        return [f"{i:0{self.num_digits}d}=" for i in range(10**self.num_digits)]

    def answer(self, prompt: str) -> str:
        return str(sum(int(c) for c in prompt[:-1]))


TASKS: dict[str, type[_AnswerTask]] = {"digits": DigitsTask, "sum": SumDigitsTask}


def _chars(texts: list[str]) -> str:
    return "".join(sorted(set("".join(texts))))


class ReasoningGymPool:
    """``size`` questions (``entries``: question, answer, metadata) of reasoning-gym's dataset
    ``name``, generated from ``seed`` with the dataset's ``config``; ``answers`` as text and
    the sorted characters of the answers (``answer_chars``) and of everything (``chars``).
    ValueError on an unknown dataset (naming close ones), a bad config or a size < 1;
    ImportError without the ``rg`` extra.
    """

    def __init__(self, name: str, *, size: int = 500, seed: int = 0, **config: Any) -> None:
        reasoning_gym = import_extra("reasoning_gym", "reasoning-gym", "rg")
        datasets = import_extra("reasoning_gym.factory", "reasoning-gym", "rg").DATASETS
        if name not in datasets:
            close = [n for n in sorted(datasets) if name[:3] in n][:5]
            hint = f"; did you mean {close}?" if close else ""
            raise ValueError(f"reasoning-gym has no task {name!r}{hint}")
        check_value("size", size, ">= 1", integer=True)
        try:
            self.dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
        except (TypeError, AssertionError) as err:
            raise ValueError(f"rg:{name}: bad config {config} ({err})") from None
        self.name = f"rg:{name}"
        self.entries: list[dict[str, Any]] = list(self.dataset)
        self.answers = [str(e["answer"]) for e in self.entries]
        self.answer_chars = _chars(self.answers)
        self.chars = _chars([e["question"] for e in self.entries] + self.answers)

    def score(self, entry: dict[str, Any], response: str) -> float:
        """The dataset's verifier on ``response`` to ``entry`` (1.0 when right)."""
        return float(self.dataset.score_answer(response, entry))


class ReasoningGymTask:
    """The reasoning-gym dataset ``name`` as a task: a pool of ``size`` questions (``seed``)
    and a held-out evaluation set of ``eval_size`` (``seed + 1``); ``max_new_tokens``
    defaults to the longest answer + 1 (``<eos>``)."""

    def __init__(
        self,
        name: str,
        *,
        size: int = 500,
        eval_size: int = 100,
        seed: int = 0,
        max_new_tokens: int | None = None,
        **config: Any,
    ) -> None:
        check_value("eval_size", eval_size, ">= 1", integer=True)
        evals = ReasoningGymPool(name, size=eval_size, seed=seed + 1, **config)
        pool = ReasoningGymPool(name, size=size, seed=seed, **config)
        self.name = pool.name
        # question -> (entry, its pool); a question in both is scored as the training pool's
        self._entries = {e["question"]: (e, p) for p in (evals, pool) for e in p.entries}
        self._prompts = [[e["question"] for e in p.entries] for p in (pool, evals)]
        self.max_new_tokens = max_new_tokens or max(map(len, evals.answers + pool.answers)) + 1
        self.tokenizer_alphabet = _chars([evals.chars, pool.chars])

    def prompts(self) -> list[str]:
        return list(self._prompts[0])

    def eval_prompts(self) -> list[str]:
        return list(self._prompts[1])

    def answer(self, prompt: str) -> str:
        return str(self._entries[prompt][0]["answer"])

    def reward(self, prompt: str, response: str) -> float:
        entry, pool = self._entries[prompt]
        return pool.score(entry, response)

    def is_correct(self, prompt: str, response: str) -> bool:
        return self.reward(prompt, response) >= 1.0


class RewardError(ValueError):
    """A reward that is not a finite number (a task's, a reward function's, a service's)."""


def as_reward(value: object, what: str) -> float:
    """``value`` (an ``int`` or ``float``, not a ``bool``) as a finite float, else
    :class:`RewardError` saying that ``what`` returned it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not finite(value):
        raise RewardError(f"{what} returned {value!r}, not a finite number; return an int or float")
    return float(value)


def _has(obj: Any, name: str) -> bool:
    return callable(getattr(obj, name, None))


class TaskSpec:
    """The user's ``task`` with everything the stages need filled in (ValueError names what
    it lacks): its ``tokenizer`` (default a :class:`CharTokenizer` over
    ``tokenizer_alphabet`` or the prompts' characters), ``prompts`` (the pool a sample's
    ``prompt_id`` indexes) and ``eval_prompts`` (each defaults to the other), ``prompt_len``
    P (the longest encoded prompt; shorter ones are left padded) and ``max_new_tokens`` N.
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
        self.prompts, self.eval_prompts = pool, evals
        self.max_new_tokens = int(task.max_new_tokens)
        check_value(f"task {self.name!r}: max_new_tokens", self.max_new_tokens, ">= 1")
        tok = getattr(task, "tokenizer", None)
        if tok is None:
            tok = CharTokenizer(getattr(task, "tokenizer_alphabet", None) or _chars(pool + evals))
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
    if isinstance(task, str) and task in TASKS:
        obj = TASKS[task]
    elif isinstance(task, str):
        if task.startswith("rg:"):
            return TaskSpec(ReasoningGymTask(task[3:], **kw), name=task)
        if not is_import_path(task):
            raise ValueError(
                f"task {task!r} is unknown; choose {', '.join(TASKS)}, 'rg:<name>' "
                "(reasoning-gym) or an import path 'module:attr' / 'file.py:attr'"
            )
        obj, name = load_user_object("--task", task, "task"), task.rpartition(":")[2]
    if isinstance(obj, type) or (callable(obj) and not _has(obj, "reward")):
        check_kwargs(obj, kw, "task_kwargs")
        obj = obj(**kw)  # a task class or factory
    elif kw:
        raise ValueError(f"task {task!r} is an object; task_kwargs={kw} apply only to a factory")
    return TaskSpec(obj, name=getattr(obj, "name", None) or name)
