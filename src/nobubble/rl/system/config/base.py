"""The settings every RL run has, whichever producer makes its experience.

:class:`RLConfig` declares them once, with one check each. The task run
(:class:`~nobubble.rl.system.config.run.RunConfig`) and the environment run
(:class:`~nobubble.rl.actor_learner.config.EnvRunConfig`) are RLConfigs that add what only
their producer has, and :func:`nobubble.rl.train` takes either. A producer may give a shared
setting its own default (a task run stops after 400 learner updates, an environment run
after 300 s); None is accepted only where the producer's default is None. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from nobubble.validation import Rule, check_value

__all__ = ["RLConfig", "SHARED_RULES", "describe_value"]

# each shared setting's check: (rule, integer); None (where allowed) is not checked
SHARED_RULES: dict[str, tuple[Rule, bool]] = {
    "seed": (">= 0", True),
    "steps": (">= 1", True),
    "time_budget_s": ("> 0", False),  # NaN, inf and 1e308 s are no budget: refused
    "max_staleness": (">= 0", True),  # 0: on-policy
    "threads": (">= 1", True),
    "stall_timeout_s": ("> 0", False),
}


@dataclass(frozen=True, kw_only=True)
class RLConfig:
    """What both producers of experience read, with the same meaning.

    Attributes:
        seed: seeds the policy init, the prompts or environments, and sampling.
        steps: learner updates; the run stops when it has made this many (None: no bound
            but the others).
        time_budget_s: stop after this many seconds of training (None = no limit).
        max_staleness: policy versions a sample may lag the learner; an older one is dropped
            (ledger: ``stale``). None = the producer's default.
        threads: torch intra-op threads (``torch.set_num_threads``) of each process that runs
            the policy. Measured here: tiny models gain nothing from a second thread and lose a
            lot on a loaded machine (the 64-wide model's ops get slower on a busy 2-core one).
        stall_timeout_s: the longest wait for any worker (a stage, an actor, a queue, a lock)
            before the run fails naming who is silent. A task run's limit on the whole run is
            its own ``timeout_s``; ``time_budget_s`` ends a run normally, this one fails it.
    """

    seed: int = 0
    steps: int | None = None
    time_budget_s: float | None = None
    max_staleness: int | None = None
    threads: int = 1
    stall_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        defaults = {f.name: f.default for f in fields(self)}
        for name, (rule, integer) in SHARED_RULES.items():
            value = getattr(self, name)
            if value is None and defaults[name] is not None:
                raise ValueError(
                    f"{owner}.{name}=None: this run needs a value ({rule}); leave it out "
                    f"for the default {defaults[name]}"
                )
            if value is not None:
                check_value(f"{owner}.{name}", value, rule, integer=integer)

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-ready values (objects by their import name)."""
        return {f.name: describe_value(getattr(self, f.name)) for f in fields(self)}


def describe_value(value: Any) -> Any:
    """``value`` as a JSON value: numbers and strings as they are, containers item by item,
    an object (a factory, a callable) by its ``module:qualname``."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): describe_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [describe_value(v) for v in value]
    target = value if hasattr(value, "__qualname__") else type(value)
    return f"{target.__module__}:{target.__qualname__}"
