"""The configuration of one RL run: mode, staleness bound, algorithm, engine, sizes.

:class:`RunConfig` is keyword-only, frozen and validated when built, so a bad value fails in
the driver with a message naming it, never later inside a worker process or actor. It is
picklable: both engines build their stage workers from it alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nobubble.rl.system.policy import PolicyConfig
from nobubble.rl.system.reward import RewardConfig
from nobubble.rl.system.rollout import RolloutConfig
from nobubble.rl.system.tasks import make_task
from nobubble.rl.system.trainer import ALGOS, TrainerConfig
from nobubble.validation import check_fields

__all__ = ["MODES", "ENGINES", "DEFAULT_STALENESS", "RunConfig"]

MODES = ("sync", "one-step-off", "fully-async")
ENGINES = ("local", "ray")
DEFAULT_STALENESS = {"sync": 0, "one-step-off": 1, "fully-async": 4}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything one RL run needs.

    Attributes:
        task: ``digits`` or ``sum``; ``task_kwargs`` are the task's settings.
        mode: ``sync``, ``one-step-off`` or ``fully-async``.
        max_staleness: versions a sample may lag the trainer; None = the mode's default (0, 1,
            4); :attr:`effective_max_staleness` is the bound in force.
            ``sync`` requires 0.
        algo: ``grpo``, ``ppo``, ``decoupled-ppo`` or ``vtrace``.
        engine: ``local`` (processes on this machine) or ``ray``.
        steps: trainer steps (stop when reached).
        time_budget_s: stop after this many seconds of training (None = no limit).
        target_accuracy: stop once an evaluation reaches it (None = never).
        seed: seeds the policy init, prompts and sampling.
        batch_groups: B, groups per trainer step; group_size: responses per group.
        eval_every: evaluate the trainer's policy every this many steps (and at the end).
        groups_per_rollout: groups per generation call (None = B, or B/4 in fully-async).
        num_rollout_workers, num_reward_workers: processes / actors per stage.
        threads: torch threads per worker (None = 1; see the local engine for why).
        ray_address: Ray cluster to join (None = start a local instance).
        timeout_s: the whole run's limit; stall_timeout_s: the longest wait for any stage.
        fault: tests only - ``"<worker>:<call>:<raise|exit>"`` makes that worker fail.
    """

    task: str = "digits"
    task_kwargs: dict = field(default_factory=dict)
    mode: str = "sync"
    max_staleness: int | None = None
    algo: str = "grpo"
    engine: str = "local"
    steps: int = 400
    time_budget_s: float | None = None
    target_accuracy: float | None = None
    seed: int = 0
    batch_groups: int = 8
    group_size: int = 32
    eval_every: int = 10
    groups_per_rollout: int | None = None
    num_rollout_workers: int = 1
    num_reward_workers: int = 1
    threads: int | None = None
    policy: dict = field(default_factory=dict)
    trainer: dict = field(default_factory=lambda: {"lr": 2e-3, "uniform_kl_coef": 0.05})
    rollout: dict = field(default_factory=dict)
    reward: dict = field(default_factory=dict)
    ray_address: str | None = None
    timeout_s: float = 900.0
    stall_timeout_s: float = 120.0
    fault: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is unknown; choose one of {', '.join(MODES)}")
        if self.engine not in ENGINES:
            raise ValueError(
                f"engine={self.engine!r} is unknown; choose one of {', '.join(ENGINES)}"
            )
        if self.algo not in ALGOS:
            raise ValueError(f"algo={self.algo!r} is unknown; choose one of {', '.join(ALGOS)}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness={self.max_staleness} must be >= 0")
        if self.mode == "sync" and self.max_staleness not in (None, 0):
            raise ValueError(
                f"mode='sync' means max_staleness=0 (got {self.max_staleness}); "
                "use one-step-off or fully-async for a lag"
            )
        names = ("steps", "batch_groups", "group_size", "eval_every")
        check_fields("RunConfig", self, names, ">= 1")
        check_fields("RunConfig", self, ("num_rollout_workers", "num_reward_workers"), ">= 1")
        if (
            self.groups_per_rollout is not None
            and not 1 <= self.groups_per_rollout <= self.batch_groups
        ):
            raise ValueError(
                f"groups_per_rollout={self.groups_per_rollout} must be in 1..batch_groups"
            )
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads={self.threads} must be >= 1")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError(f"time_budget_s={self.time_budget_s} must be > 0")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"target_accuracy={self.target_accuracy} must be in (0, 1]")
        if self.fault is not None:
            parts = self.fault.split(":")
            if len(parts) != 3 or not parts[1].isdigit() or parts[2] not in ("raise", "exit"):
                raise ValueError(f"fault={self.fault!r}; use '<worker>:<call>:<raise|exit>'")
        # build every component config once so bad values fail here, not in a worker
        self.make_task()
        TrainerConfig(group_size=self.group_size, **{"algo": self.algo, **self.trainer})
        RolloutConfig(group_size=self.group_size, **self.rollout)
        RewardConfig(**self.reward)

    @property
    def effective_max_staleness(self) -> int:
        """``max_staleness``, or the mode's default when it is None."""
        return DEFAULT_STALENESS[self.mode] if self.max_staleness is None else self.max_staleness

    @property
    def effective_groups_per_rollout(self) -> int:
        """``groups_per_rollout``, or the mode's default (B, or B/4 in fully-async)."""
        if self.groups_per_rollout is not None:
            return self.groups_per_rollout
        return max(1, self.batch_groups // 4) if self.mode == "fully-async" else self.batch_groups

    def torch_threads(self) -> int:
        """Torch intra-op threads per worker: 1 unless set. Measured here: a second thread
        makes the 64-wide model's tiny ops slower, not faster, on a busy 2-core machine."""
        return 1 if self.threads is None else self.threads

    def make_task(self):
        return make_task(self.task, **self.task_kwargs)

    def policy_config(self) -> PolicyConfig:
        task = self.make_task()
        return PolicyConfig(
            vocab_size=task.tokenizer.vocab_size,
            max_seq_len=task.prompt_len + task.max_new_tokens,
            **self.policy,
        )

    def trainer_config(self) -> TrainerConfig:
        return TrainerConfig(group_size=self.group_size, **{"algo": self.algo, **self.trainer})

    def rollout_config(self) -> RolloutConfig:
        return RolloutConfig(group_size=self.group_size, **self.rollout)

    def reward_config(self) -> RewardConfig:
        return RewardConfig(**{"seed": self.seed, **self.reward})

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "max_staleness": self.effective_max_staleness,
            "groups_per_rollout": self.effective_groups_per_rollout,
        }
