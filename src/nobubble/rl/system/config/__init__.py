"""One RL run's configuration, typed, torch-free and checked when built (:class:`Settings`):
:class:`RunConfig`, a task run's, frozen and picklable (both engines build their workers from
it alone), holds its stages' settings. The recipes are :mod:`.presets`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from nobubble.rl.system.checkpoint import CheckpointStore
from nobubble.settings import BOOL, Settings, describe_value, setting
from nobubble.validation import finite

if TYPE_CHECKING:
    from torch import nn

    from nobubble.rl.system.rewards import RewardSource
    from nobubble.rl.system.tasks import TaskSpec

__all__ = [
    "RLConfig", "Settings", "RunConfig", "LearnerConfig", "TrainerConfig", "RolloutConfig",
    "RewardConfig", "ReplayConfig", "describe_value", "setting", "ALGOS", "AGGREGATIONS",
    "DEFAULT_STALENESS", "ENGINES", "MODES", "REPLAY_MODES", "STALENESS_WEIGHTS",
]  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class RLConfig(Settings):
    """What both producers of experience read, with the same meaning (each its own defaults,
    None: no bound)."""

    seed: int = setting(0, ">= 0", integer=True, help="seeds the policy, prompts or envs, sampling")
    steps: int | None = setting(
        None, ">= 1", integer=True, help="learner updates (default: tasks 400, envs no bound)"
    )
    time_budget_s: float | None = setting(
        None, "> 0", help="stop after S seconds (default: tasks none, envs 300)"
    )
    max_staleness: int | None = setting(  # an older one is dropped (ledger: stale); 0: on-policy
        None,
        ">= 0",
        integer=True,
        help="versions a sample may lag (default: sync 0, one-step-off 1, fully-async 4, envs 4)",
    )
    # torch intra-op threads of each process that runs the policy (tiny models gain nothing
    # from a second one and lose a lot on a loaded machine)
    threads: int = setting(1, ">= 1", integer=True)
    # the longest wait for any worker (stage, actor, queue, lock) before the run fails naming
    # who is silent (time_budget_s ends a run normally)
    stall_timeout_s: float = setting(120.0, "> 0")


STALENESS_WEIGHTS = ("none", "inverse", "exp")
REPLAY_MODES = ("none", "uniform", "prioritized")


@dataclass(frozen=True, kw_only=True)
class LearnerConfig(Settings):
    """The learner's settings both producers read: a task run's :class:`TrainerConfig` and an
    environment run's :class:`~nobubble.rl.actor_learner.config.EnvRunConfig` (with its own
    defaults)."""

    lr: float = setting(2e-3, "> 0")  # Adam's learning rate
    clip: float = setting(0.2, "(0, 1)")  # PPO ratio clip epsilon
    entropy_coef: float = setting(0.0, ">= 0")  # weight of the entropy bonus
    value_coef: float = setting(0.5, ">= 0")  # weight of the value loss (with a critic)
    max_grad_norm: float = setting(1.0, "> 0")  # gradient clipping


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(LearnerConfig):
    """Optimisation settings: :class:`LearnerConfig`'s and these."""

    # weight of KL(uniform || pi) per token: a floor under every token's probability, so a
    # group whose samples all agree on a wrong answer still explores (unlike the entropy
    # bonus, its gradient does not vanish as the policy becomes deterministic)
    uniform_kl_coef: float = setting(0.05, ">= 0")
    staleness_weighting: str = setting(
        "none", STALENESS_WEIGHTS, help="a sample's loss weight: 1, 1/(1+lag) or 0.5**lag"
    )
    kl_coef: float = setting(0.0, ">= 0", help="weight of KL(pi || pi_ref) (k3); 0 = off")
    kl_refresh_every: int = setting(
        0, ">= 0", integer=True, help="refresh the KL reference every N steps (0: initial policy)"
    )
    delay_s: float = setting(0.0, ">= 0", help="extra seconds per step (a slow trainer)")


@dataclass(frozen=True, kw_only=True)
class RolloutConfig(Settings):
    """Sampling settings."""

    temperature: float = setting(1.0, "> 0")
    delay_s: float = setting(0.0, ">= 0")  # extra seconds per generate call
    token_delay_s: float = setting(0.0, ">= 0", help="extra seconds per token (a slow decoder)")


@dataclass(frozen=True, kw_only=True)
class RewardConfig(Settings):
    """How the reward stage behaves."""

    delay_s: float = setting(0.0, ">= 0", help="seconds per reward call (a slow verifier)")
    failure_rate: float = setting(0.0, "[0, 1]", help="probability that an attempt raises")
    max_retries: int = setting(2, ">= 0", integer=True)  # after a failed attempt (remote too)
    timeout_s: float = setting(10.0, "> 0")  # the remote service's limit per request
    seed: int = 0  # of the injected failures: the run's (RunConfig.seed)
    give_up_groups: int = setting(8, ">= 1", integer=True)  # end after this many fail in a row
    give_up_s: float = setting(60.0, "> 0")  # end once failing this long with none scored


@dataclass(frozen=True, kw_only=True)
class ReplayConfig(Settings):
    """A replay's settings (:class:`~nobubble.rl.system.experience.GroupReplay`); ``capacity`` and
    ``groups_per_step`` are >= 1 when it is on and 0 when it is off."""

    mode: str = setting("none", REPLAY_MODES, help="replay of trained groups")
    capacity: int = setting(0, ">= 0", integer=True, help="groups kept")
    groups_per_step: int = setting(0, ">= 0", integer=True, help="groups drawn again per step")
    alpha: float = setting(0.6, "[0, 1]")  # priority exponent
    beta: float = setting(0.4, "[0, 1]")  # IS exponent at step 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.on and (self.capacity < 1 or self.groups_per_step < 1):
            raise ValueError(
                f"a {self.mode!r} replay needs capacity >= 1 and groups_per_step >= 1 "
                f"(got capacity={self.capacity} and groups_per_step={self.groups_per_step})"
            )
        if not self.on and (self.capacity or self.groups_per_step):
            raise ValueError(
                f"replay capacity={self.capacity} / groups_per_step={self.groups_per_step} are "
                "read only with a replay; set its mode to 'uniform' or 'prioritized', or leave them out"
            )

    @property
    def on(self) -> bool:
        return self.mode != "none"


MODES = ("sync", "one-step-off", "fully-async")
ALGOS = ("grpo", "ppo", "decoupled-ppo", "vtrace", "vtrace-ppo")  # the trainer implements each
AGGREGATIONS = ("sync", "async", "local-sgd", "staleness")
ENGINES = ("local", "ray")
DEFAULT_STALENESS = {"sync": 0, "one-step-off": 1, "fully-async": 4}
FAULTS = ("raise", "exit", "kill", "stale")
RAY_STAGES = ("rollout", "reward", "trainer")  # the keys of RunConfig.ray_resources
COUNT = ">= 1"  # with integer=True: a count


@dataclass(frozen=True, kw_only=True)
class RunConfig(RLConfig):
    """Everything one RL run on a task needs: :class:`RLConfig`'s settings and these (the docs'
    RL system page says more of what each does)."""

    task: Any = setting(  # or a task (rl.system.tasks)
        "digits", None, help="digits | sum | rg:NAME | MODULE:ATTR | FILE.py:ATTR"
    )
    task_kwargs: dict = setting({}, None, help="the task's settings, a JSON object")
    mode: str = setting("sync", MODES, help="when the trainer waits for rollouts")
    algo: str = setting("grpo", ALGOS, help="the policy gradient (or the preset's)")
    sync_every: int = setting(
        0, ">= 0", integer=True, help="force a full sync every N steps; 0 off"
    )
    drop_staleness: int | None = setting(
        None, ">= 0", integer=True, help="drop groups older than K versions (default: the bound)"
    )
    replay: ReplayConfig = setting(ReplayConfig(), ReplayConfig)  # of past groups (experience)
    # records each token's version (rl.system.rollout)
    partial_rollouts: bool = setting(
        False,
        BOOL,
        help="generators take new weights between tokens (local engine): fresher tokens, "
        "one GRPO group over several versions",
    )
    weight_check_every: int = setting(
        1, COUNT, integer=True, help="with partial rollouts, look for weights every N tokens"
    )
    engine: str = setting("local", ENGINES, help="processes here, or Ray actors")
    steps: int = 400
    target_accuracy: float | None = setting(
        None, "(0, 1]", help="stop at this eval accuracy (default: never)"
    )
    batch_groups: int = setting(8, COUNT, integer=True, help="B: groups per trainer step")
    group_size: int = setting(32, COUNT, integer=True, help="responses per group")
    eval_every: int = setting(10, COUNT, integer=True, help="steps between evaluations")
    groups_per_rollout: int | None = None  # per generation call (None = B, B/4 fully-async)
    num_rollout_workers: int = setting(1, COUNT, integer=True, help="rollout workers")
    num_reward_workers: int = setting(1, COUNT, integer=True)
    learners: int = setting(1, COUNT, integer=True, help="L trainers in one gloo group")
    aggregation: str = setting(
        "sync",
        AGGREGATIONS,
        help="how the L gradients combine: sync all-reduce; async applied as they come; "
        "local-sgd parameters averaged every --local-sgd-every steps; staleness: async, x "
        "1/(1+lag)",
    )
    local_sgd_every: int | None = setting(
        None, COUNT, integer=True, help="local SGD's averaging period (default 4)"
    )
    policy: Any = setting(
        "char", None, help="char | gpt2 | hf:DIR | MODULE:FACTORY (Python: also a factory)"
    )
    policy_kwargs: dict = setting({}, None, help="the policy's settings, a JSON object")
    # or callables, (fn, weight) pairs, RewardSources; () = the task's
    rewards: tuple = setting((), None, help="repeatable: task | MODULE:FN[=W] (default: task)")
    reward_url: str | None = setting(
        None, None, help="a remote reward service, POST /score (default none)"
    )
    trainer: TrainerConfig = setting(TrainerConfig(), TrainerConfig)
    rollout: RolloutConfig = setting(RolloutConfig(), RolloutConfig)
    reward: RewardConfig = setting(RewardConfig(), RewardConfig)  # its seed is the run's
    ray_address: str | None = setting(None, None, help="Ray cluster to join (default: start one)")
    ray_resources: dict = field(default_factory=dict)  # {stage: {custom resource: amount}}
    timeout_s: float = setting(900.0, "> 0")  # the whole run's limit: it fails past it
    checkpoint_dir: str | None = setting(None, None, help="checkpoint folder (default: none)")
    checkpoint_every: int = setting(
        0, ">= 0", integer=True, help="checkpoint every N steps (0: the last step only)"
    )
    # continue from checkpoint_dir's newest checkpoint; "or-start": start fresh if it has none
    resume: bool | str = setting(False, (False, True, "or-start"))
    restart_workers: bool = setting(False, BOOL, help="restart a dead worker, requeue its groups")
    # tests only: "<worker>:<call>:<raise|exit|kill|stale>" makes that worker fail (stale: a
    # generator keeps sampling with the weights it holds)
    fault: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "sync" and self.max_staleness not in (None, 0):
            raise ValueError(
                f"mode='sync' means max_staleness=0 (got {self.max_staleness}); "
                "use one-step-off or fully-async for a lag"
            )
        gpr = self.groups_per_rollout
        if gpr is not None and not (isinstance(gpr, int) and 1 <= gpr <= self.batch_groups):
            raise ValueError(f"groups_per_rollout={gpr} must be in 1..batch_groups")
        if self.fault is not None:
            parts = self.fault.split(":")
            if len(parts) != 3 or not parts[1].isdigit() or parts[2] not in FAULTS:
                faults = "|".join(FAULTS)
                raise ValueError(f"fault={self.fault!r}; use '<worker>:<call>:<{faults}>'")
        if self.reward.seed != RewardConfig().seed:
            raise ValueError(
                f"reward.seed={self.reward.seed!r} is the run's setting (the stages share it); "
                "give RunConfig(seed=...) instead"
            )
        self._check_learners()
        self._check_contradictions()
        for stage, wants in self.ray_resources.items():
            if stage not in RAY_STAGES or not isinstance(wants, dict):
                raise ValueError(
                    f"ray_resources[{stage!r}]={wants!r}: give {{stage: {{resource: amount}}}} "
                    f"with stage one of {', '.join(RAY_STAGES)}"
                )
            for name, amount in wants.items():
                if name in ("CPU", "GPU", "memory") or not (finite(amount) and amount > 0):
                    raise ValueError(
                        f"ray_resources[{stage!r}][{name!r}]={amount!r}: give a custom resource "
                        "(CPUs are one per generator / learner) and a number > 0"
                    )
        # the components' checks import torch, so they come after every flag check
        from nobubble.rl.system.policies import check_policy_spec

        self.reward_sources()
        self.remote_reward()  # validates the url
        check_policy_spec(self.policy)
        self.make_task()

    def _check_contradictions(self) -> None:
        """Refuse settings that would be ignored or can never act, naming both."""
        if self.weight_check_every != 1 and not self.partial_rollouts:
            raise ValueError(
                f"weight_check_every={self.weight_check_every} applies to --partial-rollouts "
                "(partial_rollouts=True); add it or leave weight_check_every out"
            )
        if self.partial_rollouts and self.engine != "local":
            raise ValueError(
                f"partial_rollouts with engine={self.engine!r}: the Ray engine hands a "
                "generator its weights with each request, so it cannot swap them between "
                "tokens; use engine='local' (shared-memory weights) or drop partial_rollouts"
            )
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise ValueError("checkpoint_every / resume need checkpoint_dir; give the folder")
        if self.resume is True and CheckpointStore(str(self.checkpoint_dir)).latest() is None:
            raise ValueError(
                f"resume: {self.checkpoint_dir} holds no checkpoint; start without --resume, "
                "or use --resume-or-start to resume only when there is one"
            )
        if self.group_size == 1 and self.algo in ("grpo", "decoupled-ppo"):
            raise ValueError(
                f"group_size=1 with algo={self.algo!r}: the group advantage (reward minus the "
                "group's mean) is always 0, nothing is learned; use group_size >= 2"
            )
        if self.drop_staleness is not None and self.drop_staleness > self.effective_max_staleness:
            raise ValueError(
                f"drop_staleness={self.drop_staleness} > max_staleness="
                f"{self.effective_max_staleness}: no buffered sample is that old, the drop "
                "never acts; make it <= max_staleness (or leave it out)"
            )
        for name in ("ray_address", "ray_resources"):
            if getattr(self, name) not in (None, {}) and self.engine != "ray":
                raise ValueError(
                    f"{name} is read only with engine='ray' (got {self.engine!r}); use "
                    f"engine='ray' or drop {name}"
                )

    def _check_learners(self) -> None:
        if self.learners > self.batch_groups:
            raise ValueError(
                f"learners={self.learners} > batch_groups={self.batch_groups}: every learner "
                f"needs at least one whole group per step; use --learners <= {self.batch_groups} "
                "or raise --batch-groups"
            )
        if self.aggregation != "sync" and self.learners < 2:
            raise ValueError(
                f"aggregation={self.aggregation!r} combines several learners; give "
                "learners >= 2 (or leave aggregation='sync' with one learner)"
            )
        if self.local_sgd_every is not None and self.aggregation != "local-sgd":
            raise ValueError(
                f"local_sgd_every={self.local_sgd_every} applies to aggregation='local-sgd' "
                f"only (got {self.aggregation!r}); drop it or use --aggregation local-sgd"
            )
        if self.learners > 1 and self.aggregation != "sync" and self.checkpoint_dir:
            raise ValueError(
                f"checkpoint_dir with aggregation={self.aggregation!r}: only 'sync' learners "
                "hold one shared state that a checkpoint can keep; use aggregation='sync' or "
                "run without checkpoints"
            )

    @property
    def effective_local_sgd_every(self) -> int:
        """``local_sgd_every``, or 4 when it is None (local SGD's H)."""
        return 4 if self.local_sgd_every is None else self.local_sgd_every

    @property
    def effective_max_staleness(self) -> int:
        """``max_staleness``, or the mode's default when it is None."""
        return DEFAULT_STALENESS[self.mode] if self.max_staleness is None else self.max_staleness

    @property
    def effective_drop_staleness(self) -> int:
        """``drop_staleness`` (at most the staleness bound, as checked), or the bound if None."""
        return self.effective_max_staleness if self.drop_staleness is None else self.drop_staleness

    @property
    def effective_groups_per_rollout(self) -> int:
        """``groups_per_rollout``, or the mode's default (B, or B/4 in fully-async)."""
        if self.groups_per_rollout is not None:
            return self.groups_per_rollout
        return max(1, self.batch_groups // 4) if self.mode == "fully-async" else self.batch_groups

    @property
    def token_drop_staleness(self) -> int | None:
        """The trainer masks out of the loss every token more than this many versions older
        than it: with partial rollouts the drop bound, else None (whole groups are dropped
        before they are trained)."""
        return self.effective_drop_staleness if self.partial_rollouts else None

    def make_task(self) -> TaskSpec:
        from nobubble.rl.system.tasks import resolve_task

        return resolve_task(self.task, self.task_kwargs)

    def build_policy(self, task: TaskSpec | None = None) -> nn.Module:
        """A fresh policy model for the run's task (its init follows torch's RNG)."""
        from nobubble.rl.system.policies import build_policy

        task = self.make_task() if task is None else task
        return build_policy(
            self.policy,
            vocab_size=task.tokenizer.vocab_size,
            max_seq_len=task.max_seq_len,
            kwargs=self.policy_kwargs,
        )

    def remote_reward(self) -> Any:
        """The remote reward client, or None without ``reward_url``."""
        if self.reward_url is None:
            return None
        from nobubble.rl.system.rewards import RemoteReward

        cfg = self.reward_config()
        return RemoteReward(self.reward_url, timeout_s=cfg.timeout_s, max_retries=cfg.max_retries)

    def reward_config(self) -> RewardConfig:
        """``reward`` with the run's seed (the seed of the injected failures)."""
        return replace(self.reward, seed=self.seed)

    def reward_sources(self) -> tuple[RewardSource, ...]:
        """``rewards`` as sources: a string is parsed (``"module:fn=0.5"``), a tuple is
        ``(fn, weight)``, a callable has weight 1."""
        from nobubble.rl.system.rewards import RewardSource, parse_reward

        return tuple(
            r
            if isinstance(r, RewardSource)
            else parse_reward(r)
            if isinstance(r, str)
            else RewardSource(*r)
            if isinstance(r, tuple)
            else RewardSource(r)
            for r in self.rewards
        )

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as JSON-ready values (objects by their import name)."""
        return {
            **super().to_dict(),
            "reward": describe_value(self.reward_config()),
            "rewards": describe_value(self.reward_sources()),
            "max_staleness": self.effective_max_staleness,
            "groups_per_rollout": self.effective_groups_per_rollout,
            "drop_staleness": self.effective_drop_staleness,
        }
