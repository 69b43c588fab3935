"""Benchmark: IMPALA, SEED RL and Sample Factory architectures against SB3 and TorchRL PPO.

In one run, for each env step delay (0 ms: plain CartPole-v1; 1 ms: a slow simulator), each
nobubble architecture and three peers train until the greedy mean return over 20 eval
episodes reaches 475, or the time budget ends:

- ``sb3-ppo``: Stable-Baselines3 PPO (8 ``DummyVecEnv`` envs, ``n_steps`` 32, 1 torch
  thread, its other defaults);
- ``torchrl-ppo``: TorchRL's PPO parts (``ClipPPOLoss``, ``GAE``) with SB3's settings, 8 envs
  in a ``SerialEnv`` stepped by torchrl's synchronous ``Collector``;
- ``torchrl-async-ppo``: the same learner fed by a ``MultiAsyncCollector``, 2 worker
  processes of 8 envs that keep collecting during updates (a policy lag of an update or
  more). See ``_torchrl_peer.py``.

All evaluate with the same rule (every 5 s, and whenever the mean of the last 20 training
episodes reaches the target) on 20 fresh envs without the delay, and their wall-clock
includes the evaluations. Reported per run: wall-clock and env steps to 475, env steps/s
over the run; per configuration: the mean and spread over seeds. Writes
``benchmarks/results/rl_actor_learner.json``.

Sample Factory's own APPO is not measured: ``pip install sample-factory`` (2.1.1, the
newest) cannot be resolved in this project's environment, because sample-factory requires
``gymnasium<1.0`` and ``numpy<2`` and this project needs ``gymnasium>=1.0`` and runs on
numpy 2. TorchRL's asynchronous collector stands in as the asynchronous peer. The peers come
with the ``bench`` extra (``pip install -e '.[bench]'``); a missing one is skipped.

``--suite envs`` measures the other environments instead
(``benchmarks/results/rl_actor_learner_envs.json``): Acrobot-v1 to -100 under each
architecture, guess-the-number to a success rate of 0.8 under seed, and a reasoning-gym
task over several turns (the reward before and after a fixed budget).

    python -m benchmarks.rl_actor_learner                     # 3 seeds x 2 delays, ~15 min
    python -m benchmarks.rl_actor_learner --seeds 1 --delays 0  # quick look
    python -m benchmarks.rl_actor_learner --rows torchrl-ppo --out /tmp/trial  # some rows
    python -m benchmarks.rl_actor_learner --delays 1 --merge  # redo one delay's rows, keep the rest
    python -m benchmarks.rl_actor_learner --suite envs        # 3 seeds each, ~10 min
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks._common import RESULTS, write_json
from benchmarks._torchrl_peer import run_torchrl
from benchmarks.records.rl_actor_learner import RlActorLearner, RlActorLearnerEnvs
from nobubble.rl import EnvRunConfig, train
from nobubble.rl.actor_learner.model import make_env, vector_env

TARGET, EVAL_EPISODES, EVAL_EVERY_S = 475.0, 20, 5.0
ARCHS = ("impala", "seed", "sample-factory")
PEERS = {"sb3-ppo": "stable_baselines3", "torchrl-ppo": "torchrl", "torchrl-async-ppo": "torchrl"}


def nobubble_config(arch: str, delay_ms: float, seed: int, max_seconds: float) -> EnvRunConfig:
    """The tuned settings: 2 actors x 8 envs on plain CartPole. At 1 ms, 8 actors x 8 envs
    (they mostly sleep), and for SEED RL 16 x 4 - its actors wait for the central inference
    after every vector step, so shorter vector steps from more actors keep its batches full
    (8 x 8: 20.8 / 31.0 s to 475 on seeds 0 / 1; 16 x 4: 15.5 / 25.7 s). With that many
    actors the learner has time to spare, and the default batch (2 unrolls) wastes samples:
    SEED RL with 16 actors dropped 277 of 526 trajectories as more than 4 versions old
    (seed 0, 20.8 s to 475). So at 1 ms SEED RL takes 8 unrolls per update in 4 minibatches
    (no drops; 5.2 / 10.3 / 20.8 s on seeds 0-2), and IMPALA, whose actors run their own
    policy copies, 10 epochs in 4 minibatches on its 2-unroll batches (11.0 / 11.5 / 16.2 s;
    8-unroll batches: 21.1 / 21.6 / 16.3 s). Sample Factory keeps the defaults (10 x 4 epochs
    or 8 unrolls made it slower: its central inference shares the cores with the learner)."""
    actors, envs = (2, 8) if delay_ms == 0 else (16, 4) if arch == "seed" else (8, 8)
    learner: dict[str, int] = {}
    if delay_ms > 0 and arch == "seed":
        learner = {"batch_trajectories": 8, "minibatches": 4}
    elif delay_ms > 0 and arch == "impala":
        learner = {"epochs": 10, "minibatches": 4}
    return EnvRunConfig(
        env="CartPole-v1", arch=arch, actors=actors, envs_per_actor=envs,
        env_step_delay_ms=delay_ms, seed=seed, target_return=TARGET, time_budget_s=max_seconds,
        eval_every_s=EVAL_EVERY_S, eval_episodes=EVAL_EPISODES, **learner,
    )  # fmt: skip


def run_nobubble(arch: str, delay_ms: float, seed: int, max_seconds: float) -> dict[str, Any]:
    r = train(nobubble_config(arch, delay_ms, seed, max_seconds))
    return {
        "time_to_475_s": r.time_to_target_s, "steps_to_475": r.steps_to_target,
        "env_steps_per_s": r.env_steps_per_s, "eval_mean_return": r.eval_mean_return,
        "wall_s": r.wall_s, "env_steps": r.env_steps, "actors": r.actors,
        "idle_ratio": r.idle_ratio, "staleness_max": r.staleness_max, "ledger": r.ledger.to_json(),
    }  # fmt: skip


def greedy_eval(predict: Callable[[np.ndarray], np.ndarray], seed: int) -> float:
    """Mean return of the first episode of each of 20 envs, greedy actions."""
    envs = vector_env("CartPole-v1", EVAL_EPISODES)
    obs, done = envs.reset(seed=10_000_000 + seed)[0], np.zeros(EVAL_EPISODES, bool)
    running, returns = np.zeros(EVAL_EPISODES), np.zeros(EVAL_EPISODES)
    while not done.all():
        obs, rewards, terminated, truncated, _ = envs.step(predict(obs))
        running += rewards * ~done
        returns = np.where((terminated | truncated) & ~done, running, returns)
        done |= terminated | truncated
    return float(returns.mean())


def run_sb3(delay_ms: float, seed: int, max_seconds: float) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    start = time.monotonic()
    vec = make_vec_env(lambda: make_env("CartPole-v1", delay_ms), n_envs=8, seed=seed)
    model = PPO("MlpPolicy", vec, n_steps=32, seed=seed, verbose=0, device="cpu")
    state: dict[str, Any] = {"last_eval": start, "hit": None, "eval": 0.0}

    def predict(obs: np.ndarray) -> np.ndarray:
        return model.predict(obs, deterministic=True)[0]

    class Stop(BaseCallback):  # type: ignore[misc]
        def _on_rollout_end(self) -> None:
            now, eps = time.monotonic(), [e["r"] for e in model.ep_info_buffer]
            hot = len(eps) >= 20 and np.mean(eps[-20:]) >= TARGET
            since = now - state["last_eval"]
            if since >= EVAL_EVERY_S or (hot and since >= EVAL_EVERY_S / 5):
                state["eval"], state["last_eval"] = greedy_eval(predict, seed), time.monotonic()
                if state["eval"] >= TARGET:
                    state["hit"] = (time.monotonic() - start, self.num_timesteps)

        def _on_step(self) -> bool:
            return state["hit"] is None and time.monotonic() - start < max_seconds

    model.learn(total_timesteps=10_000_000, callback=Stop())
    wall = time.monotonic() - start
    hit = state["hit"]
    return {
        "time_to_475_s": hit[0] if hit else None, "steps_to_475": hit[1] if hit else None,
        "env_steps_per_s": model.num_timesteps / wall, "eval_mean_return": state["eval"],
        "wall_s": wall, "env_steps": model.num_timesteps,
    }  # fmt: skip


def runner(name: str) -> Callable[[float, int, float], dict[str, Any]]:
    """The function that runs one seed of row ``name``: (delay_ms, seed, max_seconds)."""
    if name in ARCHS:
        return functools.partial(run_nobubble, name)
    if name == "sb3-ppo":
        return run_sb3
    return functools.partial(run_torchrl, asynchronous=name == "torchrl-async-ppo",
                             greedy_eval=greedy_eval, target=TARGET,
                             eval_every_s=EVAL_EVERY_S)  # fmt: skip


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["time_to_475_s"] for r in runs if r["time_to_475_s"] is not None]
    rates = [r["env_steps_per_s"] for r in runs]

    def spread(xs: list[float]) -> dict[str, float | None]:
        if not xs:
            return {"mean": None, "min": None, "max": None, "stdev": None}
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return {"mean": statistics.mean(xs), "min": min(xs), "max": max(xs), "stdev": sd}

    return {
        "reached": f"{len(times)}/{len(runs)}",
        "time_to_475_s": spread(times),
        "env_steps_per_s": spread(rates),
    }


# -- --suite envs: Acrobot-v1, guess the number, a reasoning-gym task over several turns -----

RG_TASK = "rg:basic_arithmetic"
RG_OPTIONS = {  # one-digit sums, five answers per question, a higher / lower hint after each
    "max_turns": 5, "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
    "operators": ["+"], "allow_parentheses": False, "allow_negation": False,
}  # fmt: skip
RG_RUN = {"epochs": 4, "minibatches": 4, "lr": 3e-3}  # over TEXT_DEFAULTS
RG_SECONDS, START_EPISODES = 90.0, 400


def _spread(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "min": None, "max": None, "stdev": None}
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {"mean": statistics.mean(xs), "min": min(xs), "max": max(xs), "stdev": sd}


def _run_record(r: Any) -> dict[str, Any]:
    return {
        "seed": r.config["seed"], "reached": r.reached_target,
        "time_to_target_s": r.time_to_target_s, "steps_to_target": r.steps_to_target, "eval_mean_return": r.eval_mean_return,
        "wall_s": r.wall_s, "env_steps": r.env_steps, "env_steps_per_s": r.env_steps_per_s,
        "idle_ratio": r.idle_ratio, "staleness_max": r.staleness_max, "ledger": r.ledger.to_json(),
        "eval_curve": [[p.wall_s, p.eval_return] for p in r.curve if p.eval_return is not None],
    }  # fmt: skip


def acrobot(seeds: int) -> dict[str, Any]:
    """Each architecture to a greedy mean of -100 (the spec's threshold), 5 minutes at most."""
    from nobubble.rl.actor_learner.model import evaluate

    out: dict[str, Any] = {}
    for arch in ARCHS:
        runs = []
        for seed in range(seeds):
            config = EnvRunConfig(
                env="Acrobot-v1", arch=arch, actors=2, envs_per_actor=8, seed=seed,
                target_return=-100.0, time_budget_s=300.0, eval_every_s=EVAL_EVERY_S,
            )  # fmt: skip
            start = evaluate(None, config)  # the untrained policy
            run = {"start_return": sum(start) / len(start), **_run_record(train(config))}
            print(f"Acrobot-v1 {arch:15s} seed {seed}: {run['time_to_target_s']}", flush=True)
            runs.append(run)
        times = [r["time_to_target_s"] for r in runs if r["reached"]]
        out[arch] = {"reached": f"{len(times)}/{len(runs)}", "time_to_target_s": _spread(times),
                     "runs": runs}  # fmt: skip
    return out


def text_runs(name: str, options: dict[str, Any], seeds: int, **run: Any) -> dict[str, Any]:
    """seed-architecture runs on a text env: the untrained policy's sampled success, the run."""
    from nobubble.rl.actor_learner.model import evaluate
    from nobubble.rl.actor_learner.text import text_env_config

    runs = []
    for seed in range(seeds):
        config = text_env_config(name, dict(options), seed=seed, **run)
        start = statistics.mean(evaluate(None, config, START_EPISODES, seed=12_345, sampled=True))
        record = {"start_success_sampled": start, **_run_record(train(config))}
        print(f"{name} seed {seed}: {start:.2f} -> {record['eval_mean_return']:.2f} "
              f"({record['time_to_target_s']})", flush=True)  # fmt: skip
        runs.append(record)
    return {"options": options, "run": run, "runs": runs}


def envs_suite(seeds: int) -> dict[str, Any]:
    from nobubble.rl.actor_learner.text import TEXT_DEFAULTS, guess_number_odds

    guess = text_runs("guess-number", {}, seeds, time_budget_s=120.0)
    times = [r["time_to_target_s"] for r in guess["runs"] if r["reached"]]
    guess |= {"odds": dataclasses.asdict(guess_number_odds(7, 3)), "time_to_target_s": _spread(times),
              "reached": f"{len(times)}/{seeds}"}  # fmt: skip
    rg = text_runs(RG_TASK, RG_OPTIONS, seeds, target_return=None, time_budget_s=RG_SECONDS,
                   **RG_RUN)  # fmt: skip
    return {
        "acrobot": acrobot(seeds), "guess_number": guess, "rg": {"task": RG_TASK, **rg},
        "text_defaults": TEXT_DEFAULTS, "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--out", default=None, help="default rl_actor_learner[_envs]")
    parser.add_argument("--suite", choices=("cartpole", "envs"), default="cartpole")
    parser.add_argument("--rows", nargs="+", choices=(*ARCHS, *PEERS), default=[*ARCHS, *PEERS],
                        help="the CartPole rows to run (default: all)")  # fmt: skip
    parser.add_argument("--merge", action="store_true",
                        help="keep the stored rows this run does not redo (e.g. --delays 1)")  # fmt: skip
    args = parser.parse_args()
    if args.suite == "envs":
        data = envs_suite(args.seeds)
        print(f"wrote {write_json(args.out or 'rl_actor_learner_envs', RlActorLearnerEnvs, data)}")
        return
    missing = {PEERS[n] for n in args.rows if n in PEERS and not importlib.util.find_spec(PEERS[n])}
    if missing:  # a peer comes with the bench extra
        print(f"skipping the rows of {', '.join(sorted(missing))}, not installed: "
              "pip install -e '.[bench]'")  # fmt: skip
    rows = [n for n in args.rows if PEERS.get(n) not in missing]
    results: dict[str, Any] = {}
    for delay in args.delays:
        for name in rows:
            runs = []
            for seed in range(args.seeds):
                run = runner(name)(delay, seed, args.max_seconds)
                run["seed"] = seed
                runs.append(run)
                t = run["time_to_475_s"]
                print(
                    f"delay {delay} ms  {name:15s} seed {seed}: "
                    f"{'not reached' if t is None else f'{t:.1f}s'} "
                    f"({run['steps_to_475']} steps), {run['env_steps_per_s']:,.0f} steps/s",
                    flush=True,
                )
            results[f"{name}@{delay:g}ms"] = {"summary": summarize(runs), "runs": runs}
    load = os.getloadavg()
    name = args.out or "rl_actor_learner"
    if args.merge:  # the rows of another run stay; each delay's rows come from one run
        stored = RESULTS / f"{name}.json"
        old = json.loads(stored.read_text())["results"] if stored.exists() else {}
        results = {**old, **results}
    path = write_json(name, RlActorLearner, {
        "env": "CartPole-v1", "target_return": TARGET, "eval_episodes": EVAL_EPISODES,
        "cpu_count": os.cpu_count(), "load_average_at_end": load, "results": results,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
