"""Checks that ``ep`` and ``rl`` commands make before any work, beside :mod:`~nobubble.cli.util`'s.

- step counts: :func:`~nobubble.cli.util.check_steps` with the fastest step of each run
  (``TASK_STEP_S``, ``ENV_UPDATE_S``); a run stopped by its own time budget is not bounded.
- :func:`load_user_object`: a user's module (``--task``, ``--policy``, ``--reward``) is
  imported here, in the driver, and whatever its import raises (a ``SyntaxError``, the
  module's own ``RuntimeError``) is one line naming the flag, not a traceback or exit 1.
- :func:`check_policy_size`: the policy is built on PyTorch's ``meta`` device (no memory is
  allocated), so settings it refuses fail here, and its parameter count sizes the memory
  budget (weights, gradients and Adam's two moments in every process that holds a copy).
- :func:`check_run`: an RL run on a task (its batch, processes, policy, steps, Ray address)
  or an environment (its actors, envs, steps, the env itself).
- :func:`json_object`: an argparse type (a JSON object of settings).

Each raises :class:`~nobubble.cli.util.UsageError` (or ``ValueError`` from a config): one line
on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from nobubble.cli.util import UsageError, check_budget, check_steps

__all__ = [
    "ENV_UPDATE_S",
    "TASK_STEP_S",
    "check_policy_size",
    "check_run",
    "import_run_objects",
    "json_object",
    "load_user_object",
]


def load_user_object(flag: str, spec: str, what: str) -> Any:
    """The object ``spec`` (``module:attr`` or ``file.py:attr``) names, imported now; a
    missing module or name is the loader's ValueError, anything the import itself raises
    becomes one line naming ``flag``."""
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


def check_policy_size(cfg: Any, *, copies: int, force: bool) -> None:
    """Build ``cfg``'s policy (a :class:`~nobubble.rl.system.config.RunConfig`) on the meta
    device: refuse settings it cannot be built with, and a model whose ``copies`` copies
    (trainer, generators, KL reference) of weights, gradients and Adam state pass the
    memory budget. A local Hugging Face checkpoint (``hf:DIR``) is sized by its files."""
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


# the built-in tasks' sequences (prompt + response) stay under this many tokens and symbols
_SEQ_BOUND, _VOCAB_BOUND = 64, 32
TASK_STEP_S = 0.01
"""The fastest learner step of an RL run on a task (a tiny policy, a tiny batch): 10 ms."""
ENV_UPDATE_S = 0.01
"""The fastest learner update of an environment run (512 env steps, 4 epochs): 10 ms."""


def check_run(cfg: Any, *, force: bool, timed: bool) -> None:
    """An RL run (``cfg``: a task's RunConfig or an EnvRunConfig), before any work: its
    processes and memory, and its ``--steps`` unless a given time budget (``timed``) stops
    it; then :func:`_check_task_run` or :func:`_check_env_run`."""
    if hasattr(cfg, "task"):
        _check_task_run(cfg, force=force)
        step_s = TASK_STEP_S
    else:
        _check_env_run(cfg, force=force)
        step_s = ENV_UPDATE_S
    if cfg.steps is not None and not timed:
        check_steps("rl", "--steps", cfg.steps, step_s, hint=", give --time-budget S",
                    force=force)  # fmt: skip


def _check_task_run(cfg: Any, *, force: bool) -> None:
    """A batch whose logits alone (groups x group size x tokens x vocab, fp32, kept for the
    backward with about 4 more tensors of their size) would not fit, the processes, the
    policy's size (:func:`check_policy_size`) and that a Ray cluster answers at
    ``--address``."""
    data = 5 * cfg.batch_groups * cfg.group_size * _SEQ_BOUND * _VOCAB_BOUND * 4
    processes = 1 + cfg.num_rollout_workers + cfg.learners
    check_budget("rl", processes=processes, data_bytes=data, force=force)
    check_policy_size(cfg, copies=processes, force=force)
    if cfg.engine == "ray" and cfg.ray_address:  # a cluster that is not there is bad input
        from nobubble.distributed import WorkerError
        from nobubble.rl.system.engines.ray import check_ray_address

        try:
            check_ray_address(cfg.ray_address)
        except WorkerError as err:
            raise UsageError(str(err)) from None


def _check_env_run(cfg: Any, *, force: bool) -> None:
    """The actor processes and their envs (~50 kB each with their slot and trajectory
    buffers, CartPole), and an env whose id is unknown or whose spaces the policy cannot
    take (a gymnasium error is a usage error naming ``--env``)."""
    data = cfg.actors * cfg.envs_per_actor * 50e3
    check_budget("rl", processes=1 + cfg.actors, data_bytes=data, force=force)
    from nobubble.rl.actor_learner.envs import env_spaces

    try:
        env_spaces(cfg.env)
    except Exception as err:
        if type(err).__module__.startswith("gymnasium"):
            raise ValueError(f"--env {cfg.env!r}: {err}") from None
        raise


def json_object(text: str) -> dict:
    """argparse type: a JSON object (``'{"hidden": 128}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({err.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object like '{{\"k\": 1}}'")
    return value
