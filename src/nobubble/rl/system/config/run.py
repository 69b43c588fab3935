"""The configuration of one RL run on a task: mode, staleness bound, algorithm, engine, sizes.

:class:`RunConfig` is keyword-only, frozen, picklable (both engines build their stage workers
from it alone) and validated when built, so a bad value fails in the driver with a message
naming it, never inside a worker. Every flag is checked (names, values, contradictions) before
the components that need torch (rewards, policy, task) are imported and built.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from nobubble.rl.system.checkpoint import CheckpointStore
from nobubble.rl.system.config.base import RLConfig, describe_value, setting
from nobubble.rl.system.config.stages import RewardConfig, RolloutConfig, TrainerConfig
from nobubble.rl.system.replay import ReplayConfig

if TYPE_CHECKING:
    from torch import nn

    from nobubble.rl.system.rewards import RewardSource
    from nobubble.rl.system.tasks.spec import TaskSpec

__all__ = ["MODES", "ALGOS", "ENGINES", "AGGREGATIONS", "DEFAULT_STALENESS", "RunConfig"]

MODES = ("sync", "one-step-off", "fully-async")
ALGOS = ("grpo", "ppo", "decoupled-ppo", "vtrace", "vtrace-ppo")  # the trainer implements each
AGGREGATIONS = ("sync", "async", "local-sgd", "staleness")
ENGINES = ("local", "ray")
DEFAULT_STALENESS = {"sync": 0, "one-step-off": 1, "fully-async": 4}
FAULTS = ("raise", "exit", "kill", "stale")
RAY_STAGES = ("rollout", "reward", "trainer")  # the keys of RunConfig.ray_resources
COUNT, CHOICE = ">= 1", (False, True)  # the rules many fields share


@dataclass(frozen=True, kw_only=True)
class RunConfig(RLConfig):
    """Everything one RL run on a task needs: :class:`RLConfig`'s settings (``steps`` default
    400) and these.

    Attributes:
        task: ``digits`` or ``sum`` (built in), ``rg:<name>`` (reasoning-gym), an import path
            ``module:attr`` / ``file.py:attr`` to a task object, class or factory, or the
            object itself (:mod:`~nobubble.rl.system.tasks.spec`), with ``task_kwargs``.
        policy: ``char`` (built in), ``gpt2`` (Hugging Face, from a config), ``hf:DIR`` (a
            local checkpoint), an import path to a factory, or the factory itself
            (:mod:`~nobubble.rl.system.policies`), with ``policy_kwargs``.
        rewards: reward sources summed with weights: ``"task"``, ``"module:fn"``,
            ``"module:fn=0.5"``, callables or :class:`RewardSource`; empty = the task's.
            ``reward_url``: a remote reward service (``http://host:port/score``) added to them.
        mode: ``sync`` (requires ``max_staleness`` 0), ``one-step-off`` or ``fully-async``;
            ``max_staleness`` None = the mode's default (0, 1, 4).
        algo: the policy-gradient algorithm. A preset
            (:mod:`~nobubble.rl.system.config.presets`) sets it with the other lag controls.
        drop_staleness: drop ready groups older than K versions (``dropped:stale``); None =
            ``max_staleness``.
        sync_every: force a full sync every N steps (that step trains only groups of the
            current version; older ready ones are dropped as ``synced``); 0 = never.
        replay: ``none``, ``uniform`` or ``prioritized``: ``replay_capacity`` groups kept,
            ``replay_groups`` drawn again per step, ``replay_alpha``, ``replay_beta``
            (:mod:`~nobubble.rl.system.replay`).
        partial_rollouts: in-flight weight updates (PipelineRL, AReaL): a generator takes new
            weights between tokens, looking for them every ``weight_check_every`` tokens, and
            records each token's version; staleness weights and the drop bound apply per token
            (:mod:`~nobubble.rl.system.partial`). Local engine only.
        engine: ``local`` (processes on this machine) or ``ray`` (``ray_address``: the cluster
            to join, None = start one).
        target_accuracy: stop once an evaluation reaches it (None = never).
        batch_groups: B, groups per trainer step; ``group_size``: responses per group;
            ``eval_every``: evaluate every this many steps (and at the end);
            ``groups_per_rollout``: groups per generation call (None = B, or B/4 in
            fully-async); ``num_rollout_workers``, ``num_reward_workers``: workers per stage.
        learners: L trainer processes / actors in one gloo group, each batch's groups split
            among them, whole (:mod:`~nobubble.rl.system.engines.learners`).
        aggregation: how the L gradients combine: ``sync`` (all-reduce, equal to one learner
            on the whole batch), ``async`` (applied on learner 0 as they arrive), ``local-sgd``
            (parameters averaged every ``local_sgd_every`` steps, default 4) or ``staleness``
            (as ``async``, scaled by ``1 / (1 + staleness)``).
        ray_resources: ``{stage: {resource: amount}}``: every Ray actor of that stage asks for
            those custom node resources (``ray start --resources '{"generator": 4}'``), e.g.
            ``{"rollout": {"generator": 1}}``. Empty = anywhere.
        timeout_s: the whole run's limit (the run fails past it).
        checkpoint_dir: write a checkpoint there every ``checkpoint_every`` steps and at step
            ``steps``; ``resume=True`` continues from the newest one (refused when there is
            none), ``"or-start"`` starts fresh on an empty folder.
        restart_workers: restart a rollout or reward worker that dies and requeue its groups;
            False = the run stops with the error.
        trainer, rollout, reward: each stage's settings (:mod:`.stages`), e.g.
            ``TrainerConfig(delay_s=0.3)``; the reward stage's seed is the run's.
        fault: tests only - ``"<worker>:<call>:<raise|exit|kill|stale>"`` makes that worker
            fail (``stale``: a rollout worker keeps sampling with the weights it holds).
    """

    task: Any = "digits"
    task_kwargs: dict = field(default_factory=dict)
    mode: str = setting("sync", MODES)
    algo: str = setting("grpo", ALGOS)
    sync_every: int = setting(0, ">= 0", integer=True)
    drop_staleness: int | None = setting(None, ">= 0", integer=True)
    replay: str = "none"  # replay_*: checked by ReplayConfig
    replay_capacity: int = 0
    replay_groups: int = 0
    replay_alpha: float = 0.6
    replay_beta: float = 0.4
    partial_rollouts: bool = setting(False, CHOICE)
    weight_check_every: int = setting(1, COUNT, integer=True)
    engine: str = setting("local", ENGINES)
    steps: int = 400
    target_accuracy: float | None = setting(None, "(0, 1]")
    batch_groups: int = setting(8, COUNT, integer=True)
    group_size: int = setting(32, COUNT, integer=True)
    eval_every: int = setting(10, COUNT, integer=True)
    groups_per_rollout: int | None = None
    num_rollout_workers: int = setting(1, COUNT, integer=True)
    num_reward_workers: int = setting(1, COUNT, integer=True)
    learners: int = setting(1, COUNT, integer=True)
    aggregation: str = setting("sync", AGGREGATIONS)
    local_sgd_every: int | None = setting(None, COUNT, integer=True)
    policy: Any = "char"
    policy_kwargs: dict = field(default_factory=dict)
    rewards: tuple = ()
    reward_url: str | None = None
    trainer: TrainerConfig = setting(TrainerConfig(), TrainerConfig)
    rollout: RolloutConfig = setting(RolloutConfig(), RolloutConfig)
    reward: RewardConfig = setting(RewardConfig(), RewardConfig)
    ray_address: str | None = None
    ray_resources: dict = field(default_factory=dict)
    timeout_s: float = setting(900.0, "> 0")
    checkpoint_dir: str | None = None
    checkpoint_every: int = setting(0, ">= 0", integer=True)
    resume: bool | str = setting(False, (False, True, "or-start"))
    restart_workers: bool = setting(False, CHOICE)
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
        self.replay_config()
        if self.reward.seed != RewardConfig().seed:
            raise ValueError(
                f"reward.seed={self.reward.seed!r} is the run's setting (the stages share it); "
                "give RunConfig(seed=...) instead"
            )
        self._check_learners()
        self._check_contradictions()
        self._check_ray_resources()
        # the components' checks import torch, so they come after every flag check
        from nobubble.rl.system.policies import check_policy_spec

        self.reward_sources()
        self.remote_reward()  # validates the url
        check_policy_spec(self.policy)
        self.make_task()

    def _check_contradictions(self) -> None:
        """Settings that would be ignored or can never act: refused, naming both."""
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
        if self.replay == "none" and (self.replay_groups or self.replay_capacity):
            raise ValueError(
                "replay_groups / replay_capacity are read only with a replay; set replay="
                "'uniform' or 'prioritized', or leave them out"
            )
        if self.ray_address is not None and self.engine != "ray":
            raise ValueError(f"ray_address is read only with engine='ray' (got {self.engine!r})")

    def _check_ray_resources(self) -> None:
        for stage, wants in self.ray_resources.items():
            if stage not in RAY_STAGES or not isinstance(wants, dict):
                raise ValueError(
                    f"ray_resources[{stage!r}]={wants!r}: give {{stage: {{resource: amount}}}} "
                    f"with stage one of {', '.join(RAY_STAGES)}"
                )
            for name, amount in wants.items():
                if name in ("CPU", "GPU", "memory") or not (
                    isinstance(amount, int | float) and amount > 0
                ):
                    raise ValueError(
                        f"ray_resources[{stage!r}][{name!r}]={amount!r}: give a custom resource "
                        "(CPUs are one per generator / learner) and a number > 0"
                    )
        if self.ray_resources and self.engine != "ray":
            raise ValueError(
                f"ray_resources with engine={self.engine!r}: they place Ray actors on nodes; "
                "use engine='ray' or drop ray_resources"
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
        """``drop_staleness``, or the staleness bound when it is None."""
        if self.drop_staleness is None:
            return self.effective_max_staleness
        return min(self.drop_staleness, self.effective_max_staleness)

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
        from nobubble.rl.system.tasks.spec import resolve_task

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

    def replay_config(self) -> ReplayConfig:
        return ReplayConfig(
            mode=self.replay,
            capacity=self.replay_capacity,
            groups_per_step=self.replay_groups,
            alpha=self.replay_alpha,
            beta=self.replay_beta,
        )

    def remote_reward(self) -> Any:
        """The remote reward client, or None without ``reward_url``."""
        if self.reward_url is None:
            return None
        from nobubble.rl.system.rewards.remote import RemoteReward

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
        rewards = [{"fn": describe_value(r.fn), "weight": r.weight} for r in self.reward_sources()]
        return {
            **super().to_dict(),
            "reward": describe_value(self.reward_config()),
            "rewards": rewards,
            "max_staleness": self.effective_max_staleness,
            "groups_per_rollout": self.effective_groups_per_rollout,
            "drop_staleness": self.effective_drop_staleness,
        }
