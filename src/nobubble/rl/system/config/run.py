"""The configuration of one RL run: mode, staleness bound, algorithm, engine, sizes.

:class:`RunConfig` is keyword-only, frozen and validated when built, so a bad value fails in
the driver with a message naming it, never later inside a worker process or actor. It is
picklable: both engines build their stage workers from it alone.

Importing this module loads no torch: the settings, the stage settings
(:mod:`~nobubble.rl.system.config.stages`) included, are checked first (names, values,
contradictions), and only then are the components that need torch (reward sources, policy,
task) imported and built, so a bad flag is refused in the time Python starts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from nobubble.rl.system.checkpoint import CheckpointStore
from nobubble.rl.system.config.base import RLConfig, describe_value
from nobubble.rl.system.config.stages import RewardConfig, RolloutConfig, TrainerConfig
from nobubble.rl.system.replay import ReplayConfig
from nobubble.validation import check_fields, check_value

if TYPE_CHECKING:
    from torch import nn

    from nobubble.rl.system.rewards import RewardSource
    from nobubble.rl.system.tasks.spec import TaskSpec

__all__ = ["MODES", "ALGOS", "ENGINES", "AGGREGATIONS", "DEFAULT_STALENESS", "RunConfig"]

MODES = ("sync", "one-step-off", "fully-async")
# the policy-gradient algorithms a run may name (the trainer implements each)
ALGOS = ("grpo", "ppo", "decoupled-ppo", "vtrace", "vtrace-ppo")
AGGREGATIONS = ("sync", "async", "local-sgd", "staleness")
DEFAULT_LOCAL_SGD_EVERY = 4
ENGINES = ("local", "ray")
DEFAULT_STALENESS = {"sync": 0, "one-step-off": 1, "fully-async": 4}
FAULTS = ("raise", "exit", "kill", "stale")
_FAULTS = "|".join(FAULTS)
RAY_STAGES = ("rollout", "reward", "trainer")  # the keys of RunConfig.ray_resources
STAGE_TYPES = {"trainer": TrainerConfig, "rollout": RolloutConfig, "reward": RewardConfig}


@dataclass(frozen=True, kw_only=True)
class RunConfig(RLConfig):
    """Everything one RL run on a task needs: the shared settings of :class:`RLConfig`
    (``seed``, ``steps`` - default 400 -, ``time_budget_s``, ``max_staleness``, ``threads``)
    and these.

    Attributes:
        task: ``digits`` or ``sum`` (built in), ``rg:<name>`` (reasoning-gym), an import
            path ``module:attr`` / ``file.py:attr`` to a task object, class or factory, or
            the object itself (see :mod:`~nobubble.rl.system.tasks.spec`); ``task_kwargs``
            are the task's settings.
        policy: ``char`` (built in), ``gpt2`` (Hugging Face, from a config), ``hf:DIR`` (a
            local checkpoint), an import path to a factory, or the factory itself (see
            :mod:`~nobubble.rl.system.policies`); ``policy_kwargs`` are its settings.
        rewards: reward sources summed with weights: ``"task"``, ``"module:fn"``,
            ``"module:fn=0.5"``, callables or :class:`RewardSource`; empty = the task's.
        reward_url: a remote reward service (``http://host:port/score``) added to them.
        mode: ``sync``, ``one-step-off`` or ``fully-async``.
        max_staleness: None = the mode's default (0, 1, 4); :attr:`effective_max_staleness`
            is the bound in force. ``sync`` requires 0.
        algo: ``grpo``, ``ppo``, ``decoupled-ppo``, ``vtrace`` or ``vtrace-ppo``. A preset
            (:mod:`~nobubble.rl.system.config.presets`) is a function that returns a config
            with its lag-control settings: ``aggressive(RunConfig(...))``.
        drop_staleness: drop ready groups older than K versions (``dropped:stale``); None =
            ``max_staleness``.
        sync_every: force a full sync every N steps (that step trains only groups of the
            current version; older ready ones are dropped as ``synced``); 0 = never.
        replay: ``none``, ``uniform`` or ``prioritized``;
            ``replay_capacity`` groups are kept, ``replay_groups`` drawn again per step
            (:mod:`~nobubble.rl.system.replay`); ``replay_alpha``, ``replay_beta``.
        partial_rollouts: in-flight weight updates (PipelineRL, AReaL): a generator takes
            new weights between tokens, not only between groups, and records the version of
            every token; staleness weights and the drop bound apply per token. This trades
            GRPO's "one version per group" for fresher tokens (see
            :mod:`~nobubble.rl.system.partial`). Local engine only; ``weight_check_every``:
            look for new weights before every this many tokens (default 1).
        engine: ``local`` (processes on this machine) or ``ray``.
        target_accuracy: stop once an evaluation reaches it (None = never).
        batch_groups: B, groups per trainer step; group_size: responses per group.
        eval_every: evaluate the trainer's policy every this many steps (and at the end).
        groups_per_rollout: groups per generation call (None = B, or B/4 in fully-async).
        num_rollout_workers, num_reward_workers: processes / actors per stage.
        learners: L trainer processes / actors (``trainer``, ``trainer-1`` ..) in one
            torch.distributed group (gloo); each batch's groups are split among them, whole
            (:mod:`~nobubble.rl.system.engines.learners`). At most ``batch_groups``.
        aggregation: how the L gradients combine: ``sync`` (all-reduce, equal to one
            learner on the whole batch), ``async`` (applied on learner 0 as they arrive),
            ``local-sgd`` (each learner steps alone; parameters averaged every
            ``local_sgd_every`` steps, default 4) or ``staleness`` (as ``async``, each
            gradient scaled by ``1 / (1 + staleness)``). Anything but ``sync`` needs
            ``learners >= 2``.
        ray_address: Ray cluster to join (None = start a local instance).
        ray_resources: where the Ray engine places each stage: ``{stage: {resource: amount}}``
            with stage ``rollout``, ``reward`` or ``trainer``; every actor of that stage asks
            for those custom node resources, so it runs only on a node started with them
            (``ray start --resources '{"generator": 4}'``). E.g. ``{"rollout": {"generator":
            1}, "trainer": {"learner": 1}}``. Empty = anywhere.
        timeout_s: the whole run's limit (the run fails past it; :class:`RLConfig`'s
            ``stall_timeout_s`` bounds each wait for a stage).
        checkpoint_dir: write a checkpoint there every ``checkpoint_every`` steps and at
            step ``steps`` (a run stopped early by a time budget or a target keeps the last
            one before); ``resume=True`` continues from the newest one in it (refused when
            there is none), ``resume="or-start"`` too, or starts fresh on an empty folder.
        restart_workers: restart a rollout or reward worker that dies and requeue its
            groups (the ledger records the requeue); False = the run stops with the error.
        trainer, rollout, reward: the settings of each stage
            (:mod:`~nobubble.rl.system.config.stages`): ``TrainerConfig(delay_s=0.3)`` keeps
            every other default. The stages read the settings they share (``algo``,
            ``group_size``, ``partial_rollouts``, ``weight_check_every``,
            :attr:`token_drop_staleness`) from the run, and the reward stage its failures'
            seed (:meth:`reward_config`).
        fault: tests only - ``"<worker>:<call>:<raise|exit|kill|stale>"`` makes that worker
            fail (``stale``: a rollout worker keeps sampling with the weights it holds).
    """

    task: Any = "digits"
    task_kwargs: dict = field(default_factory=dict)
    mode: str = "sync"
    algo: str = "grpo"
    sync_every: int = 0
    drop_staleness: int | None = None
    replay: str = "none"
    replay_capacity: int = 0
    replay_groups: int = 0
    replay_alpha: float = 0.6
    replay_beta: float = 0.4
    partial_rollouts: bool = False
    weight_check_every: int = 1
    engine: str = "local"
    steps: int = 400
    target_accuracy: float | None = None
    batch_groups: int = 8
    group_size: int = 32
    eval_every: int = 10
    groups_per_rollout: int | None = None
    num_rollout_workers: int = 1
    num_reward_workers: int = 1
    learners: int = 1
    aggregation: str = "sync"
    local_sgd_every: int | None = None
    policy: Any = "char"
    policy_kwargs: dict = field(default_factory=dict)
    rewards: tuple = ()
    reward_url: str | None = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    ray_address: str | None = None
    ray_resources: dict = field(default_factory=dict)
    timeout_s: float = 900.0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool | str = False
    restart_workers: bool = False
    fault: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is unknown; choose one of {', '.join(MODES)}")
        if self.algo not in ALGOS:
            raise ValueError(f"algo={self.algo!r} is unknown; choose one of {', '.join(ALGOS)}")
        if self.engine not in ENGINES:
            raise ValueError(
                f"engine={self.engine!r} is unknown; choose one of {', '.join(ENGINES)}"
            )
        if self.drop_staleness is not None:  # None = the staleness bound
            check_value("RunConfig.drop_staleness", self.drop_staleness, ">= 0")
        if self.mode == "sync" and self.max_staleness not in (None, 0):
            raise ValueError(
                f"mode='sync' means max_staleness=0 (got {self.max_staleness}); "
                "use one-step-off or fully-async for a lag"
            )
        names = ("batch_groups", "group_size", "eval_every", "num_rollout_workers",
                 "num_reward_workers", "learners", "weight_check_every")  # fmt: skip
        check_fields("RunConfig", self, names, ">= 1", integer=True)
        check_fields("RunConfig", self, ("sync_every", "checkpoint_every"), ">= 0", integer=True)
        check_fields("RunConfig", self, ("timeout_s",), "> 0")
        self._check_learners()
        if (
            self.groups_per_rollout is not None
            and not 1 <= self.groups_per_rollout <= self.batch_groups
        ):
            raise ValueError(
                f"groups_per_rollout={self.groups_per_rollout} must be in 1..batch_groups"
            )
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"target_accuracy={self.target_accuracy} must be in (0, 1]")
        if self.fault is not None:
            parts = self.fault.split(":")
            if len(parts) != 3 or not parts[1].isdigit() or parts[2] not in FAULTS:
                raise ValueError(f"fault={self.fault!r}; use '<worker>:<call>:<{_FAULTS}>'")
        self.replay_config()
        self._check_stages()
        self._check_partial()
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise ValueError("checkpoint_every / resume need checkpoint_dir; give the folder")
        self._check_contradictions()
        self._check_ray_resources()
        self._check_components()

    def _check_components(self) -> None:
        """Parse the rewards and build each component's config once, so bad values fail here,
        not in a worker; these import torch, so they come after every flag check."""
        from nobubble.rl.system.policies import check_policy_spec

        self.reward_sources()
        if self.reward_url is not None:
            self.remote_reward()  # validates the url
        check_policy_spec(self.policy)
        self.make_task()

    def _check_stages(self) -> None:
        """Each stage's settings are its config class (which checked their values); the
        reward stage's seed is the run's."""
        for stage, kind in STAGE_TYPES.items():
            cfg = getattr(self, stage)
            if not isinstance(cfg, kind):
                raise ValueError(
                    f"{stage}={cfg!r}: give a {kind.__name__}(...) (nobubble.rl.system.config), "
                    f"e.g. {stage}={kind.__name__}(delay_s=0.1)"
                )
        if self.reward.seed != RewardConfig().seed:
            raise ValueError(
                f"reward.seed={self.reward.seed!r} is the run's setting (the stages share it); "
                "give RunConfig(seed=...) instead"
            )

    def _check_partial(self) -> None:
        if not isinstance(self.partial_rollouts, bool):
            raise ValueError(f"partial_rollouts={self.partial_rollouts!r} must be True or False")
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

    def _check_contradictions(self) -> None:
        """Settings that would be ignored or can never act: refused, naming both."""
        if self.resume not in (False, True, "or-start"):
            raise ValueError(f"resume={self.resume!r}; use False, True or 'or-start'")
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
        drop = self.drop_staleness
        if drop is not None and drop > self.effective_max_staleness:
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
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"aggregation={self.aggregation!r} is unknown; choose one of "
                f"{', '.join(AGGREGATIONS)}"
            )
        if self.aggregation != "sync" and self.learners < 2:
            raise ValueError(
                f"aggregation={self.aggregation!r} combines several learners; give "
                "learners >= 2 (or leave aggregation='sync' with one learner)"
            )
        if self.local_sgd_every is not None:
            if self.aggregation != "local-sgd":
                raise ValueError(
                    f"local_sgd_every={self.local_sgd_every} applies to aggregation='local-sgd' "
                    f"only (got {self.aggregation!r}); drop it or use --aggregation local-sgd"
                )
            if self.local_sgd_every < 1:
                raise ValueError(f"local_sgd_every={self.local_sgd_every} must be >= 1")
        if self.learners > 1 and self.aggregation != "sync" and self.checkpoint_dir:
            raise ValueError(
                f"checkpoint_dir with aggregation={self.aggregation!r}: only 'sync' learners "
                "hold one shared state that a checkpoint can keep; use aggregation='sync' or "
                "run without checkpoints"
            )

    @property
    def effective_local_sgd_every(self) -> int:
        """``local_sgd_every``, or 4 when it is None (local SGD's H)."""
        every = self.local_sgd_every
        return DEFAULT_LOCAL_SGD_EVERY if every is None else every

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

    @property
    def token_drop_staleness(self) -> int | None:
        """The trainer masks out of the loss every token more than this many versions older
        than it: with partial rollouts the drop bound (:attr:`effective_drop_staleness`),
        else None (keep all: whole groups are dropped before they are trained)."""
        return self.effective_drop_staleness if self.partial_rollouts else None

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
        out = super().to_dict()
        rewards = [{"fn": describe_value(r.fn), "weight": r.weight} for r in self.reward_sources()]
        return {
            **out,
            "trainer": asdict(self.trainer),
            "rollout": asdict(self.rollout),
            "reward": asdict(self.reward_config()),
            "rewards": rewards,
            "max_staleness": self.effective_max_staleness,
            "groups_per_rollout": self.effective_groups_per_rollout,
            "drop_staleness": self.effective_drop_staleness,
        }
