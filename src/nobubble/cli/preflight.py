"""Checks before any work: a user's module imported in the driver (:func:`load_user_object`,
for ``rl`` and ``pp plan``) and an RL run's budgets and settings (:func:`check_run`). Each
raises :class:`~nobubble.cli.util.UsageError` or ``ValueError``: one line, exit status 2."""

from __future__ import annotations

import json
from typing import Any

from nobubble.cli.util import UsageError, check_budget, check_steps

__all__ = ["STEP_S", "check_run", "import_run_objects", "load_user_object"]

# the built-in tasks' sequences (prompt + response) stay under this many tokens and symbols
_SEQ_BOUND, _VOCAB_BOUND = 64, 32
STEP_S = 0.01
"""The fastest learner update of an RL run: a task's (a tiny policy, a tiny batch) and an
environment run's (512 env steps, 4 epochs) both take 10 ms."""


def load_user_object(flag: str, spec: str, what: str) -> Any:
    """The object ``spec`` (``module:attr`` or ``file.py:attr``) names, imported now; a
    missing module or name is the loader's ValueError, anything the import itself raises
    (a ``SyntaxError``, the module's own error) becomes one UsageError naming ``flag``."""
    from nobubble.rl.system.imports import load_object

    try:
        return load_object(spec, what)
    except ValueError:
        raise
    except Exception as err:  # the user's module ran and failed: show what it raised
        text = " ".join(str(err).split())
        raise UsageError(
            f"{flag} {spec}: importing it raised {type(err).__name__}: {text}; fix the module"
        ) from None


def import_run_objects(task: str | None = None, policy: str | None = None,
                       rewards: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Import the user modules an RL run names (``--task``, ``--policy``, each ``--reward``)
    before anything else reads them (see :func:`load_user_object`)."""
    from nobubble.rl.system.imports import is_import_path

    specs = [("--task", task, "task")] if task and not task.startswith("rg:") else []
    if policy and not policy.startswith("hf:"):
        specs.append(("--policy", policy, "policy"))
    for text in rewards:
        fn, sep, _ = text.rpartition("=")
        specs.append(("--reward", fn if sep else text, "reward"))
    for flag, spec, what in specs:
        if is_import_path(spec):
            load_user_object(flag, spec, what)


def check_run(cfg: Any, *, force: bool, timed: bool) -> None:
    """An RL run (``cfg``: a task's RunConfig or an EnvRunConfig) before any work: its
    processes and memory, its ``--steps`` unless a given time budget (``timed``) stops it.
    A task run: a batch whose logits (groups x group size x tokens x vocab, fp32, with about
    4 more tensors of their size for the backward) would not fit, its policy
    (:func:`_check_policy`) and that a Ray cluster answers at ``--address``. An env run: its
    actors and envs (~50 kB each with their buffers, CartPole) and an env whose id is
    unknown or whose spaces the policy cannot take (a usage error naming ``--env``)."""
    if hasattr(cfg, "task"):
        data = 5 * cfg.batch_groups * cfg.group_size * _SEQ_BOUND * _VOCAB_BOUND * 4
        processes = 1 + cfg.num_rollout_workers + cfg.learners
        check_budget("rl", processes=processes, data_bytes=data, force=force)
        _check_policy(cfg, copies=processes, force=force)
        if cfg.engine == "ray" and cfg.ray_address:  # a cluster that is not there: bad input
            from nobubble.distributed import WorkerError
            from nobubble.rl.system.engines.ray import check_ray_address

            try:
                check_ray_address(cfg.ray_address)
            except WorkerError as err:
                raise UsageError(str(err)) from None
    else:
        data = cfg.actors * cfg.envs_per_actor * 50e3
        check_budget("rl", processes=1 + cfg.actors, data_bytes=data, force=force)
        from nobubble.rl.actor_learner.envs import env_spaces

        try:
            env_spaces(cfg.env)
        except Exception as err:
            if type(err).__module__.startswith("gymnasium"):
                raise ValueError(f"--env {cfg.env!r}: {err}") from None
            raise
    if cfg.steps is not None and not timed:
        check_steps("rl", "--steps", cfg.steps, STEP_S, hint=", give --time-budget S",
                    force=force)  # fmt: skip


def _check_policy(cfg: Any, *, copies: int, force: bool) -> None:
    """Build ``cfg``'s policy on the meta device (no memory allocated): refuse settings it
    cannot be built with, and a model whose ``copies`` copies (trainer, generators, KL
    reference) of weights, gradients and Adam's two moments pass the memory budget. A local
    Hugging Face checkpoint (``hf:DIR``) is sized by its files."""
    import torch

    if isinstance(cfg.policy, str) and cfg.policy.startswith("hf:"):
        return
    task = cfg.make_task()
    settings = json.dumps(cfg.policy_kwargs)
    try:
        with torch.device("meta"):
            model = cfg.build_policy(task)
    except (UsageError, ValueError):
        raise
    except Exception as err:
        text = " ".join(str(err).split())
        raise UsageError(f"--policy {cfg.policy} with --policy-kwargs {settings}: building it "
                         f"raised {type(err).__name__}: {text}") from None  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    try:
        check_budget("rl", processes=1, data_bytes=16.0 * params * copies, force=force)
    except UsageError as err:
        raise UsageError(f"{err} (the policy has {params:,} parameters with --policy-kwargs "
                         f"{settings})") from None  # fmt: skip
