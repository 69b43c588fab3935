"""Budgets checked before any work: a run's processes and memory, and its count of steps;
each refusal is a ValueError naming the flag and ``--force``."""

from __future__ import annotations

import os

__all__ = [
    "PROCESS_BYTES",
    "TIME_BUDGET_S",
    "WALL_BUDGET_S",
    "check_budget",
    "check_steps",
    "check_time",
    "memory_bytes",
]

PROCESS_BYTES = 400 << 20
"""What one spawned rank costs before its own data (torch, the interpreter), measured ~350 MB."""


def memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_budget(what: str, *, processes: int = 1, data_bytes: float = 0.0,
                 force: bool = False) -> None:  # fmt: skip
    """Refuse, before any work, a run that would spawn far more processes than this machine
    has cores, or need more than 80% of its memory (``processes`` ranks plus ``data_bytes``)."""
    if force:
        return
    cores = os.cpu_count() or 1
    if processes > max(8, 4 * cores):
        raise ValueError(
            f"{what}: {processes} processes on {cores} cores is past the budget of "
            f"{max(8, 4 * cores)}; use fewer ranks, or --force"
        )
    need, have = processes * PROCESS_BYTES + data_bytes, 0.8 * memory_bytes()
    if need > have:
        raise ValueError(
            f"{what}: needs about {need / 2**30:.1f} GiB, past 80% of this machine's "
            f"{memory_bytes() / 2**30:.1f} GiB; use smaller sizes, or --force"
        )


WALL_BUDGET_S = 24 * 3600.0
"""The longest run a command starts without ``--force`` (or a time budget that stops it)."""


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365 * 86400.0), ("days", 86400.0), ("h", 3600.0)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.0f} s"


def check_steps(what: str, flag: str, steps: int, seconds_per_step: float, *,
                limit_s: float = WALL_BUDGET_S, limit: str = "the budget of 24 h",
                hint: str = "", bound: str = "at least", unit: str = "step",
                force: bool = False) -> None:  # fmt: skip
    """The one time budget of a count (steps, repeats, iterations): refuse ``steps`` when
    ``steps x seconds_per_step`` is past ``limit_s`` (worded ``limit``), naming the estimate
    and ``--force``. ``bound`` says what the estimate is (``"at least"``: the fastest step
    such a run takes; ``"about"``: a model's estimate); ``hint`` names another way out
    (``", give --time-budget S"``)."""
    seconds = steps * seconds_per_step
    if force or seconds <= limit_s:
        return
    each = (
        f"{seconds_per_step * 1e3:.3g} ms" if seconds_per_step < 1 else f"{seconds_per_step:.3g} s"
    )
    raise ValueError(
        f"{what + ': ' if what else ''}{flag} {steps} takes {bound} {_duration(seconds)} ({each} a {unit}), "
        f"past {limit}; lower {flag}{hint}, or --force"
    )


TIME_BUDGET_S = 3600.0
"""The longest a ``pp profile | run`` may be estimated to take without ``--force``."""


def check_time(flag: str, count: int, total_s: float, unit: str, *, force: bool = False) -> None:
    """Refuse ``flag``'s ``count`` (``--steps`` of ``pp run``, ``--repeats`` of ``pp
    profile``; ``unit``: one of them) whose estimated ``total_s`` passes :data:`TIME_BUDGET_S`."""
    check_steps("", flag, count, total_s / count, limit_s=TIME_BUDGET_S,
                limit=f"the budget of {TIME_BUDGET_S:,.0f} s", hint=", or a smaller model",
                bound="about", unit=unit, force=force)  # fmt: skip
